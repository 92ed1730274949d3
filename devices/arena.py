"""The HBM arena: one shared-memory buffer per device, CANN-rule allocation, bounds-checked access.

Device pointers are integers ``TAG | device_id << 40 | offset`` (see :func:`make_ptr`), so ``ptr + k``
works like C and the owning device is read off the pointer.  Every access resolves the pointer to a live
allocation first; out-of-bounds ranges, freed or never-allocated pointers and pointers of another device
raise :class:`~devices.errors.MemoryAccessError` with a CANN code and touch nothing.

The buffer is a ``/dev/shm`` file mapped with :mod:`mmap` (not ``multiprocessing.shared_memory``, whose
resource tracker unlinks segments when an attaching process exits), created mode 0600, so another process
of the same Unix user on the node can map the same bytes: that is the emulated PCIe BAR used by the
driver's same-node fast path and by HCCL's same-node transport.  Segment names carry the owner's pid and
start time; what a SIGKILLed owner leaves is removed by the next start (:mod:`devices.segments`).  With
``shared=False`` the arena is anonymous memory of the device's process instead: no name, nothing another
process can open (clusters that need isolation between processes of one Unix user turn the fast path off
this way).

Every allocation records its owner (:mod:`devices.tenancy`): access is checked per tenant, release per
owner, and the bytes a tenant holds are counted against its quota.

All methods are host-synchronous and thread-safe; none of them orders device work.
"""
from __future__ import annotations

import bisect
import fcntl
import math
import mmap
import os
import threading
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from . import segments
from .errors import (ACL_ERROR_RT_ADDR_UNALIGNED, ACL_ERROR_RT_HBM_MULTI_BIT_ECC_ERROR,
                     ACL_ERROR_RT_INVALID_MALLOC_TYPE, ACL_ERROR_RT_MEMORY_FREE, ACL_ERROR_RT_NO_DEVICE,
                     ACL_ERROR_RT_NO_PERMISSION, AclError, InvalidParamError, MemoryAccessError,
                     MemoryAllocationError, error_for_code)
from .tenancy import Usage, same_tenant, tenant_of

PTR_TAG = 0xAC << 56
_DEV_SHIFT = 40
_OFF_MASK = (1 << _DEV_SHIFT) - 1
_DEV_MASK = 0xFFFF
SHM_DIR = segments.SHM_DIR
SHM_PREFIX = segments.PREFIX

# aclrtMemMallocPolicy (reference 1.5)
ACL_MEM_MALLOC_HUGE_FIRST = 0
ACL_MEM_MALLOC_HUGE_ONLY = 1
ACL_MEM_MALLOC_NORMAL_ONLY = 2
ACL_MEM_MALLOC_HUGE_FIRST_P2P = 3
ACL_MEM_MALLOC_HUGE_ONLY_P2P = 4
ACL_MEM_MALLOC_NORMAL_ONLY_P2P = 5
ACL_MEM_MALLOC_HUGE1G_ONLY = 6
ACL_MEM_MALLOC_HUGE1G_ONLY_P2P = 7
_HUGE_POLICIES = {ACL_MEM_MALLOC_HUGE_FIRST, ACL_MEM_MALLOC_HUGE_ONLY, ACL_MEM_MALLOC_HUGE_FIRST_P2P,
                  ACL_MEM_MALLOC_HUGE_ONLY_P2P}
_HUGE_PAGE = 2 << 20
ALIGN = 64

# Placement hints (where in the arena a block goes; the allocation itself is the same either way).  Not a
# CANN concept: the caching pool passes them so that long-lived segments pack at the top of the arena and
# short-lived ones at the bottom, which keeps the free space between them in one piece.  Best fit and
# address-ordered first fit are the two classic low-fragmentation policies (Johnstone & Wilson, "The
# memory fragmentation problem: solved?", ISMM 1998); top-down first fit is the mirror image of the latter.
PLACEMENT_BEST_FIT = 0      #: the smallest free range that fits, block at its bottom (default, as before)
PLACEMENT_LOW = 1           #: the lowest free range that fits, block at its bottom (short-lived segments)
PLACEMENT_HIGH = 2          #: the highest free range that fits, block at its top (long-lived segments)
PLACEMENTS = {PLACEMENT_BEST_FIT: "best-fit", PLACEMENT_LOW: "low", PLACEMENT_HIGH: "high"}
#: bytes after the arena in its segment: [0:8] = the arena generation (uint64), [8:16] = the device id,
#: [16:24] = :data:`ARENA_MAGIC` (whoever maps a segment checks that it is the device it means),
#: [24:32] = the peer fence (uint64, :meth:`HbmArena.fence_peers`)
FENCE_OFFSET = 24
ARENA_HEADER = 4096
ARENA_MAGIC = b"VNPUHBM1"
_CANARY = 0xA5


def make_ptr(device_id: int, offset: int) -> int:
    return PTR_TAG | (device_id & _DEV_MASK) << _DEV_SHIFT | offset


def is_device_ptr(ptr: int) -> bool:
    return isinstance(ptr, int) and (ptr >> 56) == (PTR_TAG >> 56)


def ptr_offset(ptr: int) -> int:
    """The arena offset a device pointer names (no check that it is one; see :func:`ptr_device`)."""
    return ptr & _OFF_MASK


def ptr_device(ptr: int) -> int:
    """The device id a pointer names; raises for something that is not a device pointer."""
    if not is_device_ptr(ptr):
        raise InvalidParamError(f"0x{ptr:x} is not a device pointer" if isinstance(ptr, int)
                                else f"{ptr!r} is not a device pointer")
    return (ptr >> _DEV_SHIFT) & _DEV_MASK


def block_size(size: int, policy: int = ACL_MEM_MALLOC_HUGE_FIRST) -> int:
    """Bytes an allocation of ``size`` takes: CANN rounds up to 32 B then adds 32 B; starts are 64 B
    aligned; huge-page policies round requests over 1 MiB up to whole 2 MiB pages."""
    if policy in _HUGE_POLICIES and size > (1 << 20):
        return -(-size // _HUGE_PAGE) * _HUGE_PAGE
    padded = -(-size // 32) * 32 + 32
    return -(-padded // ALIGN) * ALIGN


@dataclass(frozen=True)
class Allocation:
    offset: int
    size: int          #: bytes the user asked for (the accessible range)
    reserved: int      #: bytes the block takes in the arena
    owner: object      #: who holds it (a devices.tenancy.Owner, or a plain string in-process)
    policy: int
    charged: object = None   #: whose quota the bytes count against (default: the owner)


@dataclass(frozen=True)
class MemStats:
    total: int
    used: int
    free: int
    largest_free: int
    peak: int
    allocations: int
    fragmentation: float
    canary_violations: int


class Allocator:
    """Coalescing free-range allocator (best fit) over ``[0, total)``.  Not thread-safe by itself."""

    def __init__(self, total: int):
        self.total = total
        self._free_starts: list[int] = [0] if total else []
        self._free: dict[int, int] = {0: total} if total else {}
        self.used = 0
        self.peak = 0

    def alloc(self, nbytes: int, placement: int = PLACEMENT_BEST_FIT) -> int | None:
        """Start of a new block of ``nbytes`` (a multiple of :data:`ALIGN`), or None when no free range
        holds it.  ``placement`` picks the range and the end of it the block takes (see PLACEMENT_*)."""
        if placement == PLACEMENT_HIGH:
            for start in reversed(self._free_starts):
                size = self._free[start]
                at = (start + size - nbytes) // ALIGN * ALIGN
                if at >= start:
                    return self._take(start, at, nbytes)
            return None
        best, best_size = None, None
        for start in self._free_starts:
            size = self._free[start]
            if size >= nbytes and (best_size is None or size < best_size):
                best, best_size = start, size
                if size == nbytes or placement == PLACEMENT_LOW:
                    break
        if best is None:
            return None
        return self._take(best, best, nbytes)

    def _take(self, start: int, at: int, nbytes: int) -> int:
        """Carve ``[at, at + nbytes)`` out of the free range that begins at ``start``."""
        size = self._free.pop(start)
        i = bisect.bisect_left(self._free_starts, start)
        del self._free_starts[i]
        end = start + size
        if at > start:
            self._free[start] = at - start
            self._free_starts.insert(i, start)
            i += 1
        if at + nbytes < end:
            self._free[at + nbytes] = end - at - nbytes
            self._free_starts.insert(i, at + nbytes)
        self.used += nbytes
        self.peak = max(self.peak, self.used)
        return at

    def release(self, start: int, nbytes: int) -> None:
        i = bisect.bisect_left(self._free_starts, start)
        end = start + nbytes
        # merge with the next free range
        if i < len(self._free_starts) and self._free_starts[i] == end:
            nbytes += self._free.pop(end)
            del self._free_starts[i]
        # merge with the previous free range
        if i > 0:
            prev = self._free_starts[i - 1]
            if prev + self._free[prev] == start:
                self._free[prev] += nbytes
                self.used -= end - start
                return
        self._free[start] = nbytes
        self._free_starts.insert(i, start)
        self.used -= end - start

    @property
    def free_bytes(self) -> int:
        return self.total - self.used

    @property
    def largest_free(self) -> int:
        return max(self._free.values(), default=0)

    def free_ranges(self) -> list[tuple[int, int]]:
        return [(s, self._free[s]) for s in self._free_starts]


class HbmArena:
    """One device's HBM: a mapped shared-memory file plus the allocation table.  ``faults`` (the device's
    :class:`~devices.faults.FaultState`) supplies the ranges that hold an ECC error."""

    def __init__(self, device_id: int, size: int, *, name: str | None = None, faults=None, shared: bool = True):
        if size <= 0 or size > _OFF_MASK:
            raise InvalidParamError(f"arena size {size} out of range")
        self.device_id = device_id
        self.size = size
        self.shared = shared
        if shared:
            if name is None:
                segments.sweep()              # what SIGKILLed processes of this user left (devices.segments)
            self.name = name or segments.new_name(device_id)
            self.path = os.path.join(SHM_DIR, self.name)
            fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
            segments.track(self.name)         # unlinked at exit if never closed
            try:
                os.fchmod(fd, 0o600)                    # whatever the umask: the device's user only
                os.ftruncate(fd, size + ARENA_HEADER)
                self._mm = mmap.mmap(fd, size + ARENA_HEADER)
            except BaseException:
                os.close(fd)
                raise
            self._fd = fd                               # kept for the peer fence's lock (flock)
        else:                                           # anonymous: no name any other process can open
            self.name, self.path = "", ""
            self._mm = mmap.mmap(-1, size + ARENA_HEADER)
            self._fd = -1
        advise_huge_pages(self._mm)
        self.buf = np.frombuffer(self._mm, dtype=np.uint8)
        self._hdr = np.frombuffer(self._mm, dtype=np.uint64, count=2, offset=size)
        self._hdr[1] = device_id
        self._mm[size + 16:size + 24] = ARENA_MAGIC
        self._fence = np.frombuffer(self._mm, dtype=np.uint64, count=1, offset=size + FENCE_OFFSET)
        self._lock = threading.Lock()
        self._alloc = Allocator(size)
        self._starts: list[int] = []
        self._live: dict[int, Allocation] = {}
        #: recently freed start -> size (oldest first), for the double-free and use-after-free messages; a
        #: start that a later allocation covers is forgotten (it is memory in use again)
        self._freed: OrderedDict[int, int] = OrderedDict()
        self._freed_starts: list[int] = []                     # the same starts, sorted
        self._faults = faults
        self._canary_violations = 0
        self._closed = False
        self._usage = Usage()                                  # reserved bytes per tenant
        self._held: dict[object, list[int]] = {}               # owner -> [reserved bytes, allocations]
        #: bumped whenever a range stops being valid (free, reset, ECC poison): cached validations of
        #: launch arguments stay good while it is unchanged
        self.gen = 0
        #: bumped by every reset: a free that names an older epoch refers to an allocation the reset dropped
        self.epoch = 0

    # ---- allocation ----
    def malloc(self, size: int, policy: int = ACL_MEM_MALLOC_HUGE_FIRST, owner="", *, quota: int = 0,
               charge=None, placement: int = PLACEMENT_BEST_FIT) -> int:
        """Allocate for ``owner``; ``quota`` (> 0) caps the bytes the tenant of ``charge`` (default: the
        owner) holds in this arena -- beyond it, ACL_ERROR_RT_MEMORY_ALLOCATION as for an exhausted HBM.
        ``placement`` is a hint of where in the arena (PLACEMENT_*)."""
        if not isinstance(size, (int, np.integer)) or isinstance(size, bool) or size <= 0:
            raise InvalidParamError(f"malloc size must be a positive integer, got {size!r}")
        if not isinstance(policy, (int, np.integer)) or policy < 0:
            raise AclError(f"invalid malloc policy {policy!r}", code=ACL_ERROR_RT_INVALID_MALLOC_TYPE)
        if isinstance(placement, bool) or placement not in PLACEMENTS:
            raise InvalidParamError(f"unknown placement hint {placement!r} (known: "
                                    + ", ".join(f"{k} = {v}" for k, v in PLACEMENTS.items()) + ")")
        size = int(size)
        reserved = block_size(size, int(policy))
        charged = owner if charge is None else charge
        with self._lock:
            self._check_open()
            if quota and self._usage.get(charged) + reserved > quota:
                raise MemoryAllocationError(
                    f"device {self.device_id}: tenant {tenant_of(charged)!r} holds {self._usage.get(charged)} B "
                    f"of its {quota} B HBM quota; {size} B ({reserved} B reserved) do not fit")
            off = self._alloc.alloc(reserved, int(placement))
            if off is None:
                raise MemoryAllocationError(
                    f"device {self.device_id}: cannot allocate {size} B ({reserved} B reserved); "
                    f"free {self._alloc.free_bytes} B, largest free block {self._alloc.largest_free} B")
            a = Allocation(off, size, reserved, owner, int(policy), charged)
            bisect.insort(self._starts, off)
            self._live[off] = a
            self._usage.add(charged, reserved)
            held = self._held.setdefault(owner, [0, 0])
            held[0] += reserved
            held[1] += 1
            self._forget_freed(off, reserved)
        self.buf[off + size:off + reserved] = _CANARY
        return make_ptr(self.device_id, off)

    def free(self, ptr: int, owner=None, *, epoch: int | None = None) -> None:
        """Free an allocation (``owner``: the caller, checked per tenant).  ``epoch``: the arena epoch the
        caller allocated in; after a reset dropped it, the free is a no-op (the offset may hold someone
        else's allocation by now)."""
        off = self._offset_of(ptr)
        with self._lock:
            self._check_open()
            if epoch is not None and epoch != self.epoch:
                return
            a = self._live.get(off)
            if a is None:
                if off in self._freed:
                    raise error_for_code(ACL_ERROR_RT_MEMORY_FREE,
                                         f"double free of 0x{ptr:x} on device {self.device_id}")
                raise InvalidParamError(f"free of 0x{ptr:x}: not the start of an allocation on device "
                                        f"{self.device_id}")
            if not same_tenant(a.owner, owner):
                raise AclError(f"0x{ptr:x} belongs to another tenant", code=ACL_ERROR_RT_NO_PERMISSION)
            if not np.all(self.buf[a.offset + a.size:a.offset + a.reserved] == _CANARY):
                self._canary_violations += 1
            del self._live[off]
            self._bump()
            del self._starts[bisect.bisect_left(self._starts, off)]
            self._alloc.release(off, a.reserved)
            self._usage.add(a.charged, -a.reserved)
            held = self._held[a.owner]
            held[0] -= a.reserved
            held[1] -= 1
            if not held[1]:
                del self._held[a.owner]
            self._freed[off] = a.size
            bisect.insort(self._freed_starts, off)
            if len(self._freed) > 65536:
                old, _ = self._freed.popitem(last=False)
                del self._freed_starts[bisect.bisect_left(self._freed_starts, old)]

    def _forget_freed(self, off: int, nbytes: int) -> None:
        """Lock held: freed starts inside ``[off, off + nbytes)`` are allocated memory again."""
        fs = self._freed_starts
        i = bisect.bisect_left(fs, off)
        j = bisect.bisect_left(fs, off + nbytes, i)
        for start in fs[i:j]:
            del self._freed[start]
        del fs[i:j]

    def free_owner(self, owner) -> int:
        """Free every allocation of one owner (a departed client: the whole owner, not its tenant);
        returns how many."""
        with self._lock:
            ptrs = [make_ptr(self.device_id, a.offset) for a in self._live.values() if a.owner == owner]
        for p in ptrs:
            self.free(p)
        return len(ptrs)

    def holders(self) -> list[tuple[object, int, int]]:
        """(owner, reserved bytes, allocations) of every owner holding memory in this arena, largest first
        (kept up to date by malloc/free: costs what the number of owners costs)."""
        with self._lock:
            return sorted(((o, b, n) for o, (b, n) in self._held.items()), key=lambda h: -h[1])

    def used_by(self, owner) -> int:
        """Bytes (reserved) the tenant of ``owner`` holds."""
        with self._lock:
            return self._usage.get(owner)

    # ---- the peer fence: peers on this node read (HCCL pulls) and write (pushes) this arena ----
    def peer_fence(self) -> int:
        """The fence value an operator publishes to its peers (with its buffers): a peer reads or writes
        them only while the segment's fence still holds it (:meth:`devices.hccl_transport.ShmLink.holding`)."""
        return int(self._fence[0])

    def fence_peers(self, timeout_s: float = 5.0) -> bool:
        """Stop every peer's reads and writes of this arena that were allowed by an earlier fence value: an
        operator that gave up (or a reset, or a close) calls this before memory peers could access is freed
        or reused.  Bumps the fence, then takes the segment's lock exclusively: a peer checks the fence and
        copies one chunk under the shared lock, so once the exclusive lock is granted no access that saw
        the old value is in progress, and none starts.  Host-blocking until then, at most ``timeout_s``
        (a peer process stopped in the middle of a copy); False if that ran out."""
        if self._fd < 0:
            return True                      # anonymous: no peer can map it
        with self._lock:
            self._fence[0] += 1
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            granted = threading.Event()
            fd = os.dup(self._fd)            # the same open file (the same lock), whatever close() does

            def wait_writers():              # a thread, so that a stopped peer cannot hang the caller
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX)
                    fcntl.flock(fd, fcntl.LOCK_UN)
                    granted.set()
                finally:
                    os.close(fd)
            threading.Thread(target=wait_writers, daemon=True, name="peer-fence").start()
            return granted.wait(timeout_s)
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        return True

    def reset(self) -> None:
        """Drop every allocation (device reset); peers' pushes allowed before stop first."""
        self.fence_peers()
        with self._lock:
            self._bump()
            self.epoch += 1
            self._alloc = Allocator(self.size)
            self._starts.clear()
            self._live.clear()
            self._freed.clear()
            self._freed_starts.clear()
            self._usage.clear()
            self._held.clear()

    def invalidate(self) -> None:
        """Ranges may have stopped being valid (an ECC fault): drop every cached validation."""
        with self._lock:
            self._bump()

    def _bump(self) -> None:
        """A range stopped being valid: bump the generation (also published in the segment's header,
        where same-node clients read it to know their cached range checks still hold)."""
        self.gen += 1
        self._hdr[0] = self.gen

    # ---- access ----
    def _offset_of(self, ptr: int) -> int:
        dev = ptr_device(ptr)
        if dev != self.device_id:
            raise MemoryAccessError(f"pointer 0x{ptr:x} belongs to device {dev}, not device {self.device_id}")
        return ptr & _OFF_MASK

    def resolve(self, ptr: int, nbytes: int, owner=None, write: bool = False) -> int:
        """Check that ``[ptr, ptr + nbytes)`` lies inside one live allocation; return its arena offset."""
        off = self._offset_of(ptr)
        if nbytes < 0:
            raise InvalidParamError(f"negative length {nbytes}")
        with self._lock:
            self._check_open()
            i = bisect.bisect_right(self._starts, off) - 1
            a = self._live[self._starts[i]] if i >= 0 else None
            if a is None or off >= a.offset + a.size:
                if a is not None and off < a.offset + a.reserved:
                    raise MemoryAccessError(f"0x{ptr:x} is past the end of the {a.size} B allocation at "
                                            f"0x{make_ptr(self.device_id, a.offset):x}")
                what = ("freed memory (use after free)"
                        if any(s <= off < s + n for s, n in self._freed.items()) else "no live allocation")
                raise MemoryAccessError(f"0x{ptr:x} on device {self.device_id} points to {what}")
            if off + nbytes > a.offset + a.size:
                raise MemoryAccessError(
                    f"access of {nbytes} B at 0x{ptr:x} overruns its allocation "
                    f"({a.size} B at 0x{make_ptr(self.device_id, a.offset):x}, {a.offset + a.size - off} B left)")
            if not same_tenant(a.owner, owner):
                raise AclError(f"0x{ptr:x} belongs to another tenant", code=ACL_ERROR_RT_NO_PERMISSION)
            poison = self._faults.ecc if self._faults is not None else ()
            if poison:
                for s, e in poison:
                    if s < off + max(nbytes, 1) and off < e:
                        raise error_for_code(ACL_ERROR_RT_HBM_MULTI_BIT_ECC_ERROR,
                                             f"uncorrectable HBM ECC error at device {self.device_id} "
                                             f"offset 0x{s:x}")
        return off

    def view(self, ptr: int, nbytes: int, owner=None, write: bool = False) -> np.ndarray:
        """A uint8 numpy view of a checked range (zero-copy into the arena)."""
        off = self.resolve(ptr, nbytes, owner, write)
        return self.buf[off:off + nbytes]

    def typed_view(self, ptr: int, shape: tuple[int, ...], dtype, owner=None) -> np.ndarray:
        dt = np.dtype(dtype)
        n = int(math.prod(shape))
        off = self.resolve(ptr, n * dt.itemsize, owner)
        if off % dt.itemsize:
            # numpy needs no alignment, but CANN kernels do: report it like the runtime
            raise error_for_code(ACL_ERROR_RT_ADDR_UNALIGNED, f"0x{ptr:x} is not aligned to {dt.itemsize} B for {dt}")
        return np.frombuffer(self._mm, dtype=dt, count=n, offset=off).reshape(shape)

    def allocation_of(self, ptr: int) -> Allocation:
        off = self.resolve(ptr, 0)
        with self._lock:
            self._check_open()
            i = bisect.bisect_right(self._starts, off) - 1
            return self._live[self._starts[i]]

    # ---- stats ----
    def stats(self) -> MemStats:
        with self._lock:
            total_free = self._alloc.free_bytes
            largest = self._alloc.largest_free
            return MemStats(total=self.size, used=self._alloc.used, free=total_free, largest_free=largest,
                            peak=self._alloc.peak, allocations=len(self._live),
                            fragmentation=(1.0 - largest / total_free) if total_free else 0.0,
                            canary_violations=self._canary_violations)

    def live_allocations(self) -> list[Allocation]:
        with self._lock:
            return [self._live[s] for s in self._starts]

    def _check_open(self) -> None:
        if self._closed:
            raise error_for_code(ACL_ERROR_RT_NO_DEVICE, f"device {self.device_id} arena is closed")

    def close(self) -> None:
        """Unmap and unlink the segment (idempotent)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self.fence_peers()
        self.buf = None
        try:
            self._mm.close()
        except BufferError:
            pass  # a view is still alive somewhere; the mapping goes when it does
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        if self.path:
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass
            segments.untrack(self.name)


def header_gen(buf: np.ndarray, size: int) -> int:
    """The generation published after an arena of ``size`` bytes mapped as ``buf``."""
    return int(buf[size:size + 8].view(np.uint64)[0])


def advise_huge_pages(mm: mmap.mmap) -> None:
    """Ask for transparent huge pages on an arena mapping.  Streaming a model's weights over 4 KiB
    pages costs page walks that 2 MiB pages avoid (numpy's heap arrays get them).  The kernel honours
    it only where the ``/dev/shm`` tmpfs is mounted with ``huge=advise`` (or ``within_size``/``always``,
    or ``shmem_enabled`` is ``force``); with the default ``huge=never`` it is a no-op."""
    if hasattr(mmap, "MADV_HUGEPAGE"):
        try:
            mm.madvise(mmap.MADV_HUGEPAGE)
        except OSError:
            pass


def shm_huge_pages() -> str:
    """The ``huge=`` policy of the tmpfs that holds the arenas (``never`` when not set)."""
    policy = "unknown"
    try:
        with open("/proc/mounts") as f:
            for line in f:                     # the last mount of the directory is the visible one
                parts = line.split()
                if len(parts) > 3 and parts[1] == SHM_DIR:
                    policy = next((o[5:] for o in parts[3].split(",") if o.startswith("huge=")), "never")
    except OSError:
        pass
    return policy


def attach(name: str, size: int, device_id: int | None = None) -> tuple[mmap.mmap, np.ndarray]:
    """Map another process's arena segment (same node); the caller owns only the mapping.  With
    ``device_id``, the segment's header must say it is that device's HBM (ValueError otherwise), so that
    a peer table or a device info cannot pass one device's arena off as another's."""
    if not name or "/" in name:
        raise ValueError(f"bad arena name {name!r}")
    fd = os.open(os.path.join(SHM_DIR, name), os.O_RDWR)
    try:
        mm = mmap.mmap(fd, size + ARENA_HEADER)
    finally:
        os.close(fd)
    if device_id is not None:
        hdr = np.frombuffer(mm, dtype=np.uint64, count=2, offset=size)
        if bytes(mm[size + 16:size + 24]) != ARENA_MAGIC or int(hdr[1]) != device_id:
            del hdr
            mm.close()
            raise ValueError(f"segment {name} is not device {device_id}'s HBM")
        del hdr
    advise_huge_pages(mm)
    return mm, np.frombuffer(mm, dtype=np.uint8)
