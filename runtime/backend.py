"""Backends: where the runtime's devices live.

A backend hands out :class:`DeviceHandle` objects, one per physical device.  The in-process backend's
handles are :class:`devices.device.Device` objects themselves; the cluster backend
(:mod:`runtime.cluster.remote`) returns driver clients with the same methods that reach device actors
over gRPC.  The runtime programs only against :class:`DeviceHandle`, so the same runtime code and tests
run on both.

Backends are looked up by name in :data:`BACKENDS` (``VNPU_BACKEND`` picks one for
:func:`runtime.api.get_runtime`).  The in-process backend is this module's; a backend that lives above
the runtime core registers its own factory when its module is imported (:func:`register_backend`:
``runtime.cluster.remote`` registers ``cluster``).  A program that only names a backend (a script run with
``VNPU_BACKEND=cluster``) gets it through :data:`PROVIDERS`, the one place where the core names a module
above it -- ``tests/tools/test_layering.py`` reads that table as imports and checks that each module registers
the backend it provides.
"""
from __future__ import annotations

import importlib
import os
import threading
from typing import Callable, Protocol, runtime_checkable

import numpy as np

from devices.device import Device, DeviceConfig, DeviceInfo
from devices.errors import InvalidDeviceError, InvalidParamError
from devices.health import HealthReport
from devices.submit_order import OpOrder
from devices.tasks import StreamOp


@runtime_checkable
class DeviceHandle(Protocol):
    """Everything the runtime and its siblings (graphs, HCCL, acl, models, cluster tools) call on one
    device.  Both backends' handle classes, :class:`devices.device.Device` (in-process) and
    :class:`driver.client.RemoteDevice` (gRPC), satisfy it; mypy checks that (``scripts/test.sh``,
    ``tests/typecheck_handles.py``), so a method the runtime starts to use must be added here and to
    both handles: to :class:`devices.device.Device`, and (for the remote one) as a row of
    :class:`driver.calls.DeviceCalls` with its RPC -- the one path, in docs/architecture.md ("How to add a
    device method").

    ``submit`` only orders the device (it returns once the ops are queued); ``synchronize_*`` block the
    host (``timeout_ms``: -1 forever, 0 poll); ``hccl_comm_join`` blocks the host until every rank has
    joined; everything else is host-synchronous.  Failures raise the typed :class:`AclError` of the
    CANN code.  The in-process device's extra ``owner`` parameters (the tenant, supplied by the gRPC
    service) are not part of this surface: a runtime is one tenant."""

    @property
    def id(self) -> int:
        """The physical device id (device pointers carry it)."""
        ...

    @property
    def is_lost(self) -> bool:
        """True once the device is known to be gone (lost or killed; an in-process device also once
        closed): it serves no more calls."""
        ...

    def mark_lost(self, reason: str) -> bool:
        """Declare the device lost: blocked synchronizes wake, later calls fail, with the device-lost code."""
        ...

    # ---- info, health, faults, lifecycle
    def info(self) -> DeviceInfo: ...
    def telemetry(self) -> dict: ...
    def health(self) -> tuple[str, list[str]]: ...
    def health_report(self) -> HealthReport: ...
    def inject_fault(self, kind: str, **params) -> None: ...
    def clear_fault(self, kind: str | None = None) -> None: ...
    def reset(self) -> None: ...
    def close(self) -> None: ...

    # ---- memory (host-synchronous)
    def malloc(self, size: int, policy: int = 0, placement: int = 0) -> int: ...
    def free(self, ptr: int) -> None: ...
    def memcpy_h2d(self, dst: int, data) -> None: ...
    def memcpy_d2h(self, src: int, nbytes: int, *, out: np.ndarray | None = None) -> np.ndarray: ...
    def memcpy_d2d(self, dst: int, src: int, nbytes: int) -> None: ...
    def memset(self, ptr: int, value: int, nbytes: int) -> None: ...
    def mem_info(self) -> tuple[int, int]: ...

    # ---- streams and events
    def create_stream(self, priority: int = 0) -> int: ...
    def destroy_stream(self, sid: int) -> None: ...
    def create_event(self, flags: int = 0) -> int: ...
    def destroy_event(self, eid: int) -> None: ...
    def submit(self, ops: list[StreamOp] | tuple[StreamOp, ...], *, order: OpOrder | None = None) -> None: ...
    def synchronize_stream(self, sid: int, timeout_ms: float = -1, *, ops=(), order: OpOrder | None = None) -> None: ...
    def synchronize_event(self, eid: int, timeout_ms: float = -1, *, ops=(), order: OpOrder | None = None) -> None: ...
    def synchronize_device(self, timeout_ms: float = -1) -> None: ...
    def query_event(self, eid: int) -> bool: ...
    def query_stream(self, sid: int) -> bool: ...
    def event_elapsed(self, start: int, end: int) -> tuple[float, float]: ...
    def event_timestamp(self, eid: int) -> tuple[float, float]: ...
    def signal_event(self, eid: int, gen: int) -> None: ...

    # ---- captured graphs (aclmdlRI)
    def graph_create(self, ops) -> int: ...
    def graph_destroy(self, gid: int) -> None: ...
    def graph_info(self, gid: int) -> dict: ...
    def graph_rebind(self, gid: int, moves) -> int: ...

    # ---- profiling (this client's own tasks only)
    def profile(self, action: str) -> dict:
        """``start`` / ``stop`` task records of this client's work (host-synchronous)."""
        ...

    # ---- HCCL communicators
    def hccl_info(self) -> dict: ...
    def hccl_comm_init(self, comm_id: str, rank: int, peers: list[dict], config: dict | None = None) -> None: ...
    def hccl_comm_join(self, comm_id: str, rank: int, nranks: int, root: dict, config: dict | None = None,
                       timeout_s: float = 120.0) -> list[dict]: ...
    def hccl_comm_destroy(self, comm_id: str) -> None: ...
    def hccl_async_error(self, comm_id: str) -> int: ...


class Backend(Protocol):
    name: str

    def device_ids(self) -> list[int]: ...
    def device(self, physical_id: int) -> DeviceHandle: ...
    def close(self) -> None: ...


class LocalBackend:
    """N in-process devices (threads, no Ray, no sockets)."""
    name = "local"

    def __init__(self, count: int | None = None, config: DeviceConfig | None = None):
        count = count if count is not None else int(os.environ.get("VNPU_DEVICES", "4"))
        base = config or DeviceConfig(arena_bytes=int(os.environ.get("VNPU_HBM_BYTES", 1 << 30)))
        self._devices = [Device(_with_id(base, i)) for i in range(count)]
        self._lock = threading.Lock()

    def device_ids(self) -> list[int]:
        return [d.id for d in self._devices]

    def device(self, physical_id: int) -> Device:
        for d in self._devices:
            if d.id == physical_id:
                return d
        raise InvalidDeviceError(f"no device {physical_id}")

    def restart(self, physical_id: int) -> Device:
        """Power-cycle device ``physical_id``: close it (a lost device still closes) and put a fresh one
        with the same configuration in its place (empty HBM, no faults)."""
        with self._lock:
            for k, d in enumerate(self._devices):
                if d.id == physical_id:
                    d.close()
                    self._devices[k] = Device(d.config)
                    return self._devices[k]
        raise InvalidDeviceError(f"no device {physical_id}")

    def close(self) -> None:
        for d in self._devices:
            d.close()


def _with_id(cfg: DeviceConfig, i: int) -> DeviceConfig:
    from dataclasses import replace
    return replace(cfg, device_id=i)


def parse_visible_devices(value: str | None, available: list[int]) -> list[int]:
    """``ASCEND_RT_VISIBLE_DEVICES`` as CANN reads it: unset -> all; ids ascending; parsing stops at the
    first invalid token (not an integer, not an existing device, or not ascending)."""
    if value is None:
        return list(available)
    value = value.strip()
    if value in ("", "NoDevFiles"):
        return []
    out: list[int] = []
    for tok in value.split(","):
        if not tok.isdigit():
            break
        i = int(tok)
        if i >= len(available) or (out and i <= out[-1]):
            break
        out.append(i)
    return [available[i] for i in out]


#: backend name -> factory: takes no arguments and returns a connected Backend
BACKENDS: dict[str, Callable[[], Backend]] = {"local": LocalBackend}
#: backends registered by a module above the runtime core: name -> the module that registers it when
#: imported (:func:`create_backend` imports it the first time the name is asked for)
PROVIDERS: dict[str, str] = {"cluster": "runtime.cluster.remote"}
#: other names users write for the same backends
ALIASES = {"ray": "cluster", "remote": "cluster", "inprocess": "local"}


def register_backend(name: str, factory: Callable[[], Backend]) -> None:
    """Add (or replace) backend ``name``: ``factory()`` returns a connected :class:`Backend`."""
    if not callable(factory):
        raise InvalidParamError(f"backend factory for {name!r} is not callable: {factory!r}")
    BACKENDS[name] = factory


def create_backend(name: str) -> Backend:
    """Build the backend registered as ``name`` (or one of its aliases); host-blocking while it connects."""
    key = ALIASES.get(name, name)
    if key not in BACKENDS and key in PROVIDERS:
        importlib.import_module(PROVIDERS[key])          # registers it
    factory = BACKENDS.get(key)
    if factory is None:
        known = ", ".join(sorted(set(BACKENDS) | set(PROVIDERS)))
        raise InvalidParamError(f"unknown backend {name!r} (known: {known})")
    return factory()
