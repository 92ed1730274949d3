"""Pieces shared by the model jobs: device buffers carved from one allocation, weight packs, launch
counting, host-side input packing, and job statistics."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Iterable, Sequence, Union

import numpy as np

from devices.errors import AclError, InvalidDeviceError, InvalidParamError
from devices.kernel import TensorDesc

ALIGN = 64


def align(n: int, a: int = ALIGN) -> int:
    return (n + a - 1) // a * a


def nbytes_of(shape, dtype="float32") -> int:
    return int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize


def td(t, shape=None, offset_bytes: int = 0) -> TensorDesc:
    """A launch argument over tensor (or desc) ``t``: same dtype, optional new shape and byte offset.
    Building descs directly skips the per-launch view/desc objects of the hot decode loop."""
    return TensorDesc(t.ptr + offset_bytes, t.shape if shape is None else tuple(shape), t.dtype)


# ---------------------------------------------------------------------------------------------- buffers
class Block:
    """One device allocation carved into aligned, non-owned tensor views (weights or activations).

    ``plan`` lays out (name, shape, dtype) entries; :meth:`allocate` makes the single allocation (from
    the device's caching pool, with a lifetime hint: weights and KV caches "long", activations "short"),
    so an out-of-memory error happens at one place and leaves nothing behind.  The views follow the
    allocation when defragmentation moves it.
    """

    def __init__(self, dev):
        self.dev = dev
        self.entries: dict[str, tuple[int, tuple, str]] = {}
        self.size = 0
        self.base = None
        self.views: dict[str, object] = {}

    def add(self, name: str, shape, dtype="float32") -> None:
        shape = tuple(int(s) for s in shape)
        self.entries[name] = (self.size, shape, dtype)
        self.size += align(max(1, nbytes_of(shape, dtype)))

    def allocate(self, stream=None, lifetime: str = "short") -> "Block":
        """Allocate for work on ``stream`` (default: the device's default stream)."""
        self.base = self.dev.empty((max(ALIGN, self.size),), "uint8", stream=stream, lifetime=lifetime)
        for name, (off, shape, dtype) in self.entries.items():
            self.views[name] = self.base.view(shape, dtype, off)
        return self

    def __getitem__(self, name: str):
        return self.views[name]

    def upload(self, name: str, arr: "np.ndarray | Joined") -> None:
        """Host-synchronous upload of entry ``name``: an array, or a :class:`Joined` whose parts are
        written one after the other into the entry's slot (the host never builds the joined array)."""
        if not isinstance(arr, Joined):
            self.views[name].copy_from(np.ascontiguousarray(arr, dtype=self.views[name].dtype))
            return
        off, shape, dtype = self.entries[name]
        if arr.nbytes != nbytes_of(shape, dtype):
            raise InvalidParamError(f"{name}: the parts hold {arr.nbytes} B, the slot {shape} {dtype} "
                                    f"{nbytes_of(shape, dtype)} B")
        pos = 0
        for p in arr.parts:
            a = np.ascontiguousarray(p, dtype=dtype)
            self.base.view(a.shape, dtype, off + pos).copy_from(a)
            pos += a.nbytes

    def free(self) -> None:
        if self.base is not None:
            try:
                self.base.free()
            finally:
                self.base = None
                self.views = {}


@dataclass(frozen=True)
class Joined:
    """A weight the device holds as one matrix, given as parts: row blocks (``np.concatenate``) or
    matrices stacked on a new first axis (``np.stack``), all of one dtype and the same trailing shape.
    :meth:`Block.upload` writes each part at its offset in the slot; the host never joins them."""
    parts: tuple
    shape: tuple
    dtype: np.dtype

    @classmethod
    def rows(cls, parts: Sequence[np.ndarray]) -> "Joined":
        """The parts concatenated along their first axis."""
        ps = cls._check(parts)
        return cls(ps, (sum(p.shape[0] for p in ps),) + ps[0].shape[1:], ps[0].dtype)

    @classmethod
    def stack(cls, parts: Sequence[np.ndarray]) -> "Joined":
        """The parts (all of one shape) stacked on a new first axis."""
        ps = cls._check(parts)
        if len({p.shape for p in ps}) != 1:
            raise InvalidParamError(f"stacked parts differ in shape: {[p.shape for p in ps]}")
        return cls(ps, (len(ps),) + ps[0].shape, ps[0].dtype)

    @staticmethod
    def _check(parts: Sequence[np.ndarray]) -> tuple:
        ps = tuple(np.asarray(p) for p in parts)
        if not ps or len({p.dtype for p in ps}) != 1 or len({p.shape[1:] for p in ps}) != 1:
            raise InvalidParamError("joined parts must be one dtype and one trailing shape, got "
                                    f"{[(p.shape, p.dtype.name) for p in ps]}")
        return ps

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def nbytes(self) -> int:
        return sum(int(p.nbytes) for p in self.parts)


#: what :func:`upload_block` takes per entry
Weight = Union[np.ndarray, Joined]


def upload_block(dev, arrays: dict[str, Weight], lifetime: str = "long") -> Block:
    """Allocate one block for ``arrays`` (weights: long-lived by default) and upload them, a
    :class:`Joined` part by part into its slot (host-synchronous).  A failed upload frees the block."""
    b = Block(dev)
    for k, a in arrays.items():
        b.add(k, a.shape, a.dtype.name)
    b.allocate(lifetime=lifetime)
    try:
        for k, a in arrays.items():
            b.upload(k, a)
    except BaseException:
        b.free()
        raise
    return b


class HostPack:
    """Several small host arrays laid out like a device :class:`Block`, sent with ONE stream-ordered
    write (``Stream.write``): the per-step inputs of a job (ids, positions, masks ...)."""

    def __init__(self, block: Block, names: Sequence[str]):
        self.block = block
        offs = [block.entries[n][0] for n in names]
        self.start = min(offs)
        end = max(block.entries[n][0] + nbytes_of(block.entries[n][1], block.entries[n][2]) for n in names)
        self.buf = np.zeros(end - self.start, np.uint8)

    def put(self, name: str, arr: np.ndarray, count: int | None = None) -> None:
        off, shape, dtype = self.block.entries[name]
        a = np.ascontiguousarray(arr, dtype=dtype).reshape(-1)
        n = a.size if count is None else count
        if n > int(np.prod(shape)):
            raise InvalidParamError(f"{name}: {n} elements do not fit {shape}")
        o = off - self.start
        self.buf[o:o + a.nbytes] = a.view(np.uint8)

    def send(self, stream, upto: str | None = None, count: int | None = None) -> None:
        """One ``Stream.write`` of the pack, or of its prefix that ends after ``count`` elements of
        entry ``upto`` (the rest of the pack is not needed by this step)."""
        end = len(self.buf)
        if upto is not None:
            off, shape, dtype = self.block.entries[upto]
            n = int(np.prod(shape)) if count is None else count
            end = off - self.start + n * np.dtype(dtype).itemsize
        stream.write(self.block.base.ptr + self.start, self.buf[:end].tobytes())


# ---------------------------------------------------------------------------------------------- launches
class Launcher:
    """A device stream plus a launch counter (what a job reports as launches per token)."""

    def __init__(self, dev, stream=None, block_dim: int = 0):
        self.dev = dev
        self.block_dim = block_dim            #: 0 = the device's block-dim helper decides
        self.own_stream = stream is None
        self.stream = stream if stream is not None else dev.stream()
        self.launches = 0
        self.collectives = 0
        self.writes = 0

    def __call__(self, kernel: str, inputs, outputs, **attrs) -> None:
        self.stream.launch(kernel, inputs, outputs, attrs, self.block_dim)
        self.launches += 1

    def write(self, pack: HostPack, upto: str | None = None, count: int | None = None) -> None:
        pack.send(self.stream, upto, count)
        self.writes += 1

    def close(self) -> None:
        if self.own_stream and self.stream is not None:
            try:
                self.stream.destroy()
            finally:
                self.stream = None


# ---------------------------------------------------------------------------------------------- devices
def pick_devices(rt, n) -> list:
    """``n`` devices (the first ``n``), the devices with the given visible ids (a list), or a list of
    :class:`runtime.api.Device` objects as they are (e.g. a serving engine's placement, which may be the CPU
    fallback device of another runtime)."""
    from runtime.api import Device
    if isinstance(n, (list, tuple)) and n and all(isinstance(d, Device) for d in n):
        if len(set(map(id, n))) != len(n):
            raise InvalidParamError("devices must be distinct, got one device twice")
        return list(n)
    have = rt.device_count()
    if isinstance(n, (list, tuple)):
        ids = list(n)
        if not ids or len(set(ids)) != len(ids) or not all(isinstance(i, (int, np.integer)) for i in ids):
            raise InvalidParamError(f"devices must be distinct device ids, got {n!r}")
        bad = [i for i in ids if not 0 <= i < have]
        if bad:
            raise InvalidDeviceError(f"device id(s) {bad} do not exist (the runtime has {have})")
        return [rt.device(int(i)) for i in ids]
    if not isinstance(n, (int, np.integer)) or isinstance(n, bool) or n < 1:
        raise InvalidParamError(f"devices must be a positive integer, got {n!r}")
    if n > have:
        raise InvalidDeviceError(f"the job asks for {n} devices but only {have} exist")
    return [rt.device(i) for i in range(n)]


class DescCache:
    """Launch arguments built once from tensors (the hot loops skip per-launch descriptor objects), built
    again after a defragmentation moved memory (``dev.relocations`` changed)."""

    def __init__(self, dev, build):
        self.dev, self._build = dev, build
        self._seen = -1
        self.value = None

    def get(self):
        r = self.dev.relocations
        if r != self._seen:
            self.value = self._build()
            self._seen = r
        return self.value


def hbm_used(devs) -> list[int]:
    out = []
    for d in devs:
        free, total = d.mem_info()
        out.append(total - free)
    return out


# ---------------------------------------------------------------------------------------------- stats
@dataclass
class DeviceTime:
    device: int
    wall_ms: float
    modeled_ms: float


@dataclass
class JobStats:
    """What one call of a job did."""
    wall_s: float = 0.0
    items: int = 0                      #: sentences embedded or tokens generated
    launches: int = 0
    decode_steps: int = 0
    decode_launches: int = 0
    decode_s: float = 0.0
    prefill_s: float = 0.0
    prefill_tokens: int = 0
    collectives: int = 0
    truncated: int = 0                  #: inputs longer than the model's context, cut to ``context`` tokens
    context: int = 0                    #: the model's context (tokens) when inputs were cut to it
    devices: list[DeviceTime] = field(default_factory=list)
    device_launches_per_token: list[float] = field(default_factory=list)

    @property
    def items_per_s(self) -> float:
        return self.items / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def launches_per_token(self) -> float:
        return self.decode_launches / self.decode_steps if self.decode_steps else 0.0

    @property
    def decode_ms_per_token(self) -> float:
        return 1e3 * self.decode_s / self.decode_steps if self.decode_steps else 0.0

    def as_dict(self) -> dict:
        return {
            "wall_s": round(self.wall_s, 4), "items": self.items, "items_per_s": round(self.items_per_s, 2),
            "launches": self.launches, "collectives": self.collectives,
            "decode_steps": self.decode_steps, "launches_per_token": round(self.launches_per_token, 1),
            "decode_ms_per_token": round(self.decode_ms_per_token, 3), "prefill_s": round(self.prefill_s, 4),
            "prefill_tokens": self.prefill_tokens,
            "device_launches_per_token": [round(x, 1) for x in self.device_launches_per_token],
            "devices": [{"device": d.device, "wall_ms": round(d.wall_ms, 3), "modeled_ms": round(d.modeled_ms, 4)}
                        for d in self.devices],
        }


class DeviceTimer:
    """Start/stop events on each launcher's stream: per-device wall and modeled time of a job call."""

    def __init__(self, launchers: Iterable[Launcher]):
        self.launchers = list(launchers)
        self.ev = [(lc.dev.event(), lc.dev.event()) for lc in self.launchers]

    def start(self) -> None:
        for lc, (a, _) in zip(self.launchers, self.ev):
            a.record(lc.stream)

    def stop(self) -> list[DeviceTime]:
        out = []
        for lc, (a, b) in zip(self.launchers, self.ev):
            b.record(lc.stream)
        for lc, (a, b) in zip(self.launchers, self.ev):
            b.synchronize()
            e = a.elapsed(b)
            out.append(DeviceTime(lc.dev.index, e.wall_ms, e.modeled_ms))
        return out

    def destroy(self) -> None:
        for a, b in self.ev:
            for e in (a, b):
                try:
                    e.destroy()
                except AclError:
                    pass
        self.ev = []


class JobBase:
    """What every model job shares: ``close`` waits for each rank's stream, then tears down (the job's
    ``_teardown`` frees its device memory and communicators); usable as a context manager."""

    ranks: list
    _comms: list
    _closed: bool = False

    def _teardown(self) -> None:
        """Destroy the job's communicators, then close its ranks (all of them, even when some fail), then
        give the devices' cached pool memory back to the driver (the job's HBM is free again)."""
        c = Closer()
        for d in getattr(self, "devices", ()):
            c.push(d.empty_cache)
        for comm in self._comms:
            c.push(comm.destroy)
        for r in self.ranks:
            c.push(r.close)
        self.ranks, self._comms = [], []
        c.close()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for r in self.ranks:
            try:
                r.lc.stream.synchronize()
            except AclError:
                pass
        self._teardown()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class Closer:
    """Collects cleanup callbacks; runs them all (last first) even when some fail."""

    def __init__(self):
        self._fns: list = []

    def push(self, fn) -> None:
        self._fns.append(fn)

    def close(self) -> None:
        err = None
        while self._fns:
            fn = self._fns.pop()
            try:
                fn()
            except Exception as e:  # noqa: BLE001 - keep freeing; report the first failure
                err = err or e
        if err is not None:
            raise err


def now() -> float:
    return time.perf_counter()
