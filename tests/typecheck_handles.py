"""Static check (mypy, run by scripts/test.sh; not a pytest module): both backends' device handles and
both backends (and the sanitizer's layer over either) satisfy the protocols the runtime programs against (:class:`runtime.backend.DeviceHandle`,
:class:`runtime.backend.Backend`).  Nothing here runs: mypy rejects the assignments below when a handle
lacks a method of the protocol or has an incompatible signature for it."""
from __future__ import annotations

from devices.device import Device
from driver.client import RemoteDevice
from runtime.backend import Backend, DeviceHandle, LocalBackend
from runtime.cluster.remote import RemoteBackend
from runtime.sanitize.handle import SanitizedHandle


def in_process_handle(d: Device) -> DeviceHandle:
    return d


def remote_handle(d: RemoteDevice) -> DeviceHandle:
    return d


def sanitized_handle(d: SanitizedHandle) -> DeviceHandle:
    return d


def backends(local: LocalBackend, remote: RemoteBackend) -> list[Backend]:
    return [local, remote]
