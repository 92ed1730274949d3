"""``VNPU_ALLOC_CONF``: the caching pool's settings, in the syntax of ``PYTORCH_NPU_ALLOC_CONF``.

One variable, ``key:value`` pairs separated by commas (whitespace ignored), e.g.
``VNPU_ALLOC_CONF=max_split_size_mb:64,garbage_collection_threshold:0.8``.  Keys (see :data:`KEYS`):

========================================  =====================================================================
``max_split_size_mb``                     cached blocks this large or larger are never split, and requests
                                          below it never take them (bounds fragmentation); > the large segment
                                          size (PyTorch: > 20); default unlimited
``max_non_split_rounding_mb``             a request >= max_split_size may take an unsplit cached block at most
                                          this much larger (default 20, as PyTorch)
``garbage_collection_threshold``          in (0, 1): once reserved memory passes this fraction of the allowed
                                          memory, free the oldest unused cached segments before asking the
                                          driver for more (PyTorch's GC); default off
``roundup_power2_divisions``              round requests up to one of N divisions of their power-of-two
                                          interval: ``4``, or by size ``[256:1,512:2,>:8]`` (up to 256 MiB:
                                          1, up to 512 MiB: 2, larger: 8); N is 0 or a power of two
``large_segment_size_mb``                 segment of the large pool (PyTorch 20; alias ``segment_size_mb``,
                                          torch_npu's name); an even number of MiB
``per_process_memory_fraction``           (0, 1]: this process's pool may reserve at most this fraction of HBM
                                          (``torch.npu.set_per_process_memory_fraction``); default 1
``cross_stream_reuse``                    ``True``/``False``: a wholly free segment of one stream may serve
                                          another, behind a device-side event wait (default True)
``lifetime_pools``                        ``True``/``False``: keep ``lifetime="long"`` blocks in their own
                                          segments at the top of the arena (default True); False = one pool,
                                          best-fit placement (the plain allocator, for comparisons)
``caching``                               ``True``/``False``: ``False`` gives every allocation a driver
                                          allocation of its own, freed at once (PyTorch's
                                          ``PYTORCH_NO_CUDA_MEMORY_CACHING=1``; what ``vnpu sanitize`` uses
                                          so that it sees every tensor's bounds and frees); default True
``expandable_segments``                   only ``False``: vnpu has no virtual memory management (use
                                          ``Device.defragment()`` against fragmentation)
========================================  =====================================================================

A bad setting raises :class:`AllocConfigError` (107000) naming the key, the value and what is allowed.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import Callable

from devices.errors import InvalidParamError

ENV = "VNPU_ALLOC_CONF"
MiB = 1 << 20

#: PyTorch's CUDACachingAllocator.cpp constants (torch_npu uses the same), reference/serving.md section 5
MIN_BLOCK_SIZE = 512                #: kMinBlockSize: every request is rounded up to a multiple of this
SMALL_SIZE = 1 * MiB                #: kSmallSize: requests up to this go to the small pool
SMALL_BUFFER = 2 * MiB              #: kSmallBuffer: segment of the small pool
LARGE_BUFFER = 20 * MiB             #: kLargeBuffer: segment of the large pool (requests < kMinLargeAlloc)
MIN_LARGE_ALLOC = 10 * MiB          #: kMinLargeAlloc: requests this large get a segment of their own ...
ROUND_LARGE = 2 * MiB               #: kRoundLarge: ... rounded up to this


class AllocConfigError(InvalidParamError):
    """A bad ``VNPU_ALLOC_CONF`` (107000)."""


@dataclass(frozen=True)
class AllocConfig:
    """The pool's settings (``VNPU_ALLOC_CONF`` parsed); sizes in bytes."""
    max_split_size: int | None = None            #: None = unlimited
    max_non_split_rounding: int = LARGE_BUFFER
    garbage_collection_threshold: float = 0.0    #: 0 = off
    #: (upper bound in MiB or None = any larger, divisions), bounds increasing; () = off
    roundup_power2_divisions: tuple[tuple[int | None, int], ...] = ()
    large_segment_size: int = LARGE_BUFFER
    per_process_memory_fraction: float = 1.0
    cross_stream_reuse: bool = True
    lifetime_pools: bool = True
    caching: bool = True                         #: False: one driver allocation per block, freed at once

    @classmethod
    def from_env(cls, environ: dict | None = None) -> "AllocConfig":
        return parse((os.environ if environ is None else environ).get(ENV, ""))

    def divisions(self, size: int) -> int:
        """The power-of-two divisions that apply to a request of ``size`` bytes (0 = none): the first
        entry whose bound the size does not exceed (PyTorch: ``[256:1,512:2,>:8]`` = 1 division up to
        256 MiB, 2 up to 512 MiB, 8 above)."""
        for bound, div in self.roundup_power2_divisions:
            if bound is None or size <= bound * MiB:
                return div
        return 0

    def describe(self) -> str:
        """The settings in ``VNPU_ALLOC_CONF`` syntax (defaults included)."""
        parts = [f"max_split_size_mb:{'unlimited' if self.max_split_size is None else self.max_split_size // MiB}",
                 f"max_non_split_rounding_mb:{self.max_non_split_rounding // MiB}",
                 f"garbage_collection_threshold:{self.garbage_collection_threshold:g}",
                 "roundup_power2_divisions:[" + ",".join(f"{'>' if b is None else b}:{d}"
                                                          for b, d in self.roundup_power2_divisions) + "]",
                 f"large_segment_size_mb:{self.large_segment_size // MiB}",
                 f"per_process_memory_fraction:{self.per_process_memory_fraction:g}",
                 f"cross_stream_reuse:{self.cross_stream_reuse}", f"lifetime_pools:{self.lifetime_pools}",
                 f"caching:{self.caching}",
                 "expandable_segments:False"]
        return ",".join(parts)


# ---------------------------------------------------------------------------------------------- values
def _fail(key: str, value: str, why: str) -> AllocConfigError:
    return AllocConfigError(f"{ENV}: {key}:{value} -- {why}")


def _number(key: str, value: str) -> float:
    try:
        x = float(value)
    except ValueError:
        raise _fail(key, value, "not a number") from None
    if x != x or x in (float("inf"), float("-inf")):
        raise _fail(key, value, "not a finite number")
    return x


def _mib(key: str, value: str) -> int:
    x = _number(key, value)
    if x != int(x) or x <= 0:
        raise _fail(key, value, "must be a positive whole number of MiB")
    return int(x) * MiB


def _bool(key: str, value: str) -> bool:
    v = value.strip().lower()
    if v in ("true", "1", "yes", "on"):
        return True
    if v in ("false", "0", "no", "off"):
        return False
    raise _fail(key, value, "must be True or False")


def _power_of_two(key: str, value: str) -> int:
    x = _number(key, value)
    if x != int(x) or x < 0 or (int(x) & (int(x) - 1)):
        raise _fail(key, value, "divisions must be 0 or a power of two (1, 2, 4, 8, ...)")
    return int(x)


def _divisions(key: str, value: str) -> tuple[tuple[int | None, int], ...]:
    v = value.strip()
    if not v.startswith("["):
        return ((None, _power_of_two(key, v)),)
    if not v.endswith("]"):
        raise _fail(key, value, "a list must be [bound_mib:divisions,...,>:divisions]")
    out: list[tuple[int | None, int]] = []
    for item in filter(None, (x.strip() for x in v[1:-1].split(","))):
        bound, sep, div = item.partition(":")
        if not sep:
            raise _fail(key, value, f"list item {item!r} is not bound_mib:divisions")
        d = _power_of_two(key, div)
        if out and out[-1][0] is None:
            raise _fail(key, value, "'>' must be the last item")
        if bound.strip() == ">":
            out.append((None, d))
            continue
        b = _number(key, bound)
        if b != int(b) or b < 1 or (int(b) & (int(b) - 1)):
            raise _fail(key, value, f"interval bound {bound.strip()!r} must be a power-of-two number of MiB")
        if out and int(b) <= out[-1][0]:
            raise _fail(key, value, "interval bounds must increase")
        out.append((int(b), d))
    if not out:
        raise _fail(key, value, "empty list")
    return tuple(out)


def _fraction(key: str, value: str, *, open_top: bool) -> float:
    x = _number(key, value)
    if not (0.0 < x < 1.0 if open_top else 0.0 < x <= 1.0):
        raise _fail(key, value, "must be in (0, 1)" if open_top else "must be in (0, 1]")
    return x


def _expandable(key: str, value: str) -> None:
    if _bool(key, value):
        raise _fail(key, value, "not supported: vnpu devices have no virtual memory management (call "
                                "Device.defragment() to coalesce free memory instead)")
    return None


#: key -> (AllocConfig field or None, parser).  The one table of settings.
KEYS: dict[str, tuple[str | None, Callable[[str, str], object]]] = {
    "max_split_size_mb": ("max_split_size", _mib),
    "max_non_split_rounding_mb": ("max_non_split_rounding", _mib),
    "garbage_collection_threshold": ("garbage_collection_threshold",
                                     lambda k, v: _fraction(k, v, open_top=True)),
    "roundup_power2_divisions": ("roundup_power2_divisions", _divisions),
    "large_segment_size_mb": ("large_segment_size", _mib),
    "segment_size_mb": ("large_segment_size", _mib),
    "per_process_memory_fraction": ("per_process_memory_fraction", lambda k, v: _fraction(k, v, open_top=False)),
    "cross_stream_reuse": ("cross_stream_reuse", _bool),
    "lifetime_pools": ("lifetime_pools", _bool),
    "caching": ("caching", _bool),
    "expandable_segments": (None, _expandable),
}


def _pairs(text: str) -> list[tuple[str, str]]:
    """``k:v,k2:[a:b,c:d]`` -> pairs (commas inside brackets do not separate)."""
    items, depth, cur = [], 0, []
    for ch in text:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        if ch == "," and depth == 0:
            items.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    items.append("".join(cur))
    if depth != 0:
        raise AllocConfigError(f"{ENV}={text!r}: unbalanced brackets")
    out = []
    for item in items:
        item = item.strip()
        if not item:
            continue
        key, sep, value = item.partition(":")
        if not sep or not value.strip():
            raise AllocConfigError(f"{ENV}: {item!r} is not key:value")
        out.append((key.strip(), value.strip()))
    return out


def parse(text: str) -> AllocConfig:
    """Parse a ``VNPU_ALLOC_CONF`` string (empty = all defaults); bad settings raise AllocConfigError."""
    values: dict[str, object] = {}
    for key, value in _pairs(text or ""):
        entry = KEYS.get(key)
        if entry is None:
            raise AllocConfigError(f"{ENV}: unknown key {key!r} (known: {', '.join(sorted(KEYS))})")
        field_name, conv = entry
        v = conv(key, value)
        if field_name is not None:
            values[field_name] = v
    cfg = replace(AllocConfig(), **values)
    if cfg.large_segment_size % ROUND_LARGE:
        raise AllocConfigError(f"{ENV}: large_segment_size_mb:{cfg.large_segment_size // MiB} -- must be a "
                               f"multiple of {ROUND_LARGE // MiB} MiB")
    if cfg.max_split_size is not None and cfg.max_split_size <= cfg.large_segment_size:
        raise AllocConfigError(f"{ENV}: max_split_size_mb:{cfg.max_split_size // MiB} -- too small, must be > "
                               f"{cfg.large_segment_size // MiB} (the large segment size)")
    return cfg
