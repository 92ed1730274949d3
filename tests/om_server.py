"""A real ``vnpu serve`` server in the test process over a model repository of compiled models: one
in-process device, HTTP and gRPC on free loopback ports, every model loaded; stopped and the runtime
closed after the block (also on failure)."""
from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Iterator

from devices.device import DeviceConfig
from runtime.api import Runtime
from runtime.backend import LocalBackend
from runtime.serve.modelrepo import scan_repository
from runtime.serve.server import Server, Service


@contextlib.contextmanager
def repository_server(root: Path, arena_bytes: int = 64 << 20) -> Iterator[tuple[Server, Service]]:
    """(server, service) of the repository at ``root`` (checked), loaded and serving."""
    rt = Runtime(LocalBackend(1, DeviceConfig(arena_bytes=arena_bytes)))
    try:
        repo = scan_repository(root)
        repo.check()
        svc = Service(rt, (), repositories=(repo,))
        srv = Server(svc, grpc_port=0).start()
        try:
            svc.load()
            yield srv, svc
        finally:
            srv.stop()
    finally:
        rt.close()
