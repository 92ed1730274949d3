"""Shared fixtures.

``rt`` is a :class:`runtime.api.Runtime` over each backend under test (parametrized by
``BACKENDS``): the same runtime-semantics tests run in-process and, once the cluster backend is
available, against real device actors over gRPC.  One runtime per test module.  The cluster
parameter carries the ``cluster`` marker (``-m "not cluster"`` runs the in-process half only).

The test session's environment is fixed here, BEFORE anything imports numpy or Ray:

- BLAS thread pools get one thread (OpenBLAS reads the variable once, when numpy loads it; set later it
  does nothing -- and exact-token model tests must not depend on how a multi-threaded GEMM splits).
- ``RAY_ADDRESS`` is removed: with it set, ``ray.init()`` attaches to whatever cluster it names, and a
  test must never touch a cluster it did not start (``LocalCluster`` starts its own Ray whatever the
  environment says; this is the second line of defence).
"""
from __future__ import annotations

import os

for _k in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_k] = "1"
EXTERNAL_RAY_ADDRESS = os.environ.pop("RAY_ADDRESS", None)   #: what the caller had set (never used)

import pytest  # noqa: E402

from devices.device import DeviceConfig  # noqa: E402
from runtime.api import Runtime, set_runtime  # noqa: E402
from runtime.backend import LocalBackend  # noqa: E402

BACKENDS = ["local", pytest.param("cluster", marks=pytest.mark.cluster)]
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
