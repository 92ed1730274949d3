"""Shared fixtures.

``rt`` is a :class:`runtime.api.Runtime` over each backend under test (parametrized by
``BACKENDS``): the same runtime-semantics tests run in-process and, once the cluster backend is
available, against real device actors over gRPC.  One runtime per test module.
"""
from __future__ import annotations

import os

import pytest

from devices.device import DeviceConfig
from runtime.api import Runtime, set_runtime
from runtime.backend import LocalBackend

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

BACKENDS = ["local", "cluster"]
TEST_ARENA = 64 << 20


def make_local_runtime(count: int = 4, arena: int = TEST_ARENA, **kw) -> Runtime:
    return Runtime(LocalBackend(count, DeviceConfig(arena_bytes=arena)), **kw)


@pytest.fixture(scope="module", params=BACKENDS)
def rt(request):
    cluster = None
    if request.param == "local":
        r = make_local_runtime()
    else:
        from runtime.cluster import ClusterSpec, LocalCluster
        cluster = LocalCluster(ClusterSpec(devices=4, arena_bytes=TEST_ARENA))
        r = Runtime(cluster.backend())
    old = set_runtime(r)
    try:
        yield r
    finally:
        set_runtime(old)
        r.close()
        if cluster is not None:
            cluster.close()
