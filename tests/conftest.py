"""Shared fixtures.

``rt`` is a :class:`runtime.api.Runtime` over each backend under test (parametrized by
``BACKENDS``): the same runtime-semantics tests run in-process and, once the cluster backend is
available, against real device actors over gRPC.  One runtime per test module.  The cluster
parameter carries the ``cluster`` marker (``-m "not cluster"`` runs the in-process half only).
The tests' Python kernels reach its device actors as the admin's pickled uploads: the test session is the
cluster's admin (it presents the cluster token) and starts that cluster with
``DevicePolicy(pickled_kernels=True)`` (``vnpu up --allow-pickled-kernels``), the one documented way an
operator's own Python functions reach devices without a kernel package; tenants never can (tests/security).

The test session's environment is fixed here, BEFORE anything imports numpy or Ray:

- BLAS thread pools get one thread (OpenBLAS reads the variable once, when numpy loads it; set later it
  does nothing -- and exact-token model tests must not depend on how a multi-threaded GEMM splits).
- ``RAY_ADDRESS`` is removed: with it set, ``ray.init()`` attaches to whatever cluster it names, and a
  test must never touch a cluster it did not start (``LocalCluster`` starts its own Ray whatever the
  environment says; this is the second line of defence).
- Every run is a fresh machine for Ray.  Ray keeps state outside any cluster: its default temp dir
  (``$RAY_TMPDIR/ray``, else ``/tmp/ray``; ``ray.cluster_utils`` writes ``ray_current_cluster`` there) and
  its cluster token (``~/.ray/auth_token``).  The suite must pass where neither exists -- a machine with
  them from an earlier run hid that multi-node clusters failed without them -- so the session points
  both at a new empty root, removed at the end: ``RAY_TMPDIR`` at an empty directory (Ray's default dir
  absent) and ``HOME`` at an empty home (no ``~/.ray``, no ``~/.vnpu``, no ``~/.cache/vnpu``: the
  session's first SmolLM2 load dequantises its GGUF and fills the weight cache there, which the
  ``vnpu serve`` subprocesses and Ray Serve replicas of the session then map --
  ``runtime.models.weight_cache``).  What the machine holds in ``/tmp/ray`` or ``~/.ray`` is neither read
  nor touched.  Tests of the ``multinode`` tier check that
  Ray's default dir is still absent before and after them (:data:`RAY_DEFAULT_DIR`).
"""
from __future__ import annotations

import contextlib
import os
import shutil
import tempfile

for _k in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_k] = "1"
EXTERNAL_RAY_ADDRESS = os.environ.pop("RAY_ADDRESS", None)   #: what the caller had set (never used)
FRESH_ROOT = tempfile.mkdtemp(prefix="vnpu-tests-fresh-")    #: this session's "fresh machine" (removed at exit)
os.environ["RAY_TMPDIR"] = os.path.join(FRESH_ROOT, "tmp")
os.environ["HOME"] = os.path.join(FRESH_ROOT, "home")
for _k in ("RAY_TMPDIR", "HOME"):
    os.mkdir(os.environ[_k], 0o700)
for _k in ("RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):           # no token from the caller either
    os.environ.pop(_k, None)
for _k in ("VNPU_CACHE_DIR", "XDG_CACHE_HOME"):                # the weight cache lives in the empty home too ...
    os.environ.pop(_k, None)
#: ... unless scripts/test.sh gives its run one (a fresh directory of that run, removed after it): then both
#: parts of the run and every xdist worker share it, and SmolLM2 is dequantised once per run, not per session
if os.environ.get("VNPU_TEST_WEIGHT_CACHE"):
    os.environ["VNPU_CACHE_DIR"] = os.environ["VNPU_TEST_WEIGHT_CACHE"]
#: Ray's default temp dir in this session: absent, and the multinode tier proves it stays so
RAY_DEFAULT_DIR = os.path.join(os.environ["RAY_TMPDIR"], "ray")

import pytest  # noqa: E402

from devices.device import DeviceConfig  # noqa: E402
from runtime.api import Runtime, set_runtime  # noqa: E402
from runtime.backend import LocalBackend  # noqa: E402
from runtime.cluster import rayenv  # noqa: E402

rayenv.prepare()    # Ray's environment, as vnpu's entry points set it: tests import Ray themselves too

BACKENDS = ["local", pytest.param("cluster", marks=pytest.mark.cluster)]
TEST_ARENA = 64 << 20


def make_local_runtime(count: int = 4, arena: int = TEST_ARENA, **kw) -> Runtime:
    return Runtime(LocalBackend(count, DeviceConfig(arena_bytes=arena)), **kw)


@contextlib.contextmanager
def installed(r: Runtime):
    """``r`` as the process runtime (:func:`runtime.api.set_runtime`) for the block; after it (also on
    failure) the previous runtime is back and ``r`` is closed."""
    old = set_runtime(r)
    try:
        yield r
    finally:
        set_runtime(old)
        r.close()


def pytest_unconfigure(config):
    shutil.rmtree(FRESH_ROOT, ignore_errors=True)


@pytest.fixture(autouse=True)
def _ray_default_dir_absent(request):
    """A multinode test runs where Ray's default temp dir does not exist, and leaves it so (a multi-node
    cluster keeps everything of Ray's in its own temp dir)."""
    if request.node.get_closest_marker("multinode") is None:
        yield
        return
    assert not os.path.exists(RAY_DEFAULT_DIR), f"{RAY_DEFAULT_DIR} exists: not the fresh-machine case"
    yield
    assert not os.path.exists(RAY_DEFAULT_DIR), f"a multinode test left Ray's default temp dir {RAY_DEFAULT_DIR}"


def _test_cluster():
    from driver.policy import DevicePolicy
    from runtime.cluster import ClusterSpec, LocalCluster
    return LocalCluster(ClusterSpec(devices=4, arena_bytes=TEST_ARENA, policy=DevicePolicy(pickled_kernels=True)))


class SharedCluster:
    """One 4-device cluster for consecutive ``rt[cluster]`` modules that leave their devices as they found
    them (each module still gets its own runtime, closed -- its memory, streams and events freed -- when the
    module ends).  It is started by the first such module and closed before the next test that may start a
    Ray cluster of its own in this process (a test of the cluster/serve/multinode/smoke/security tiers that
    is not such a module: one process holds one Ray cluster), and at the end.  A module that kills, hangs or
    resets the devices of ``rt`` sets ``OWN_CLUSTER = True`` and gets a cluster of its own."""

    def __init__(self):
        self._cluster = None

    @property
    def started(self) -> bool:
        return self._cluster is not None

    def get(self):
        if self._cluster is None:
            self._cluster = _test_cluster()
        return self._cluster

    def close(self) -> None:
        c, self._cluster = self._cluster, None
        if c is not None:
            c.close()


SHARED_CLUSTER = SharedCluster()
#: the tiers whose tests may start a Ray cluster in the test process
RAY_TIERS = ("cluster", "serve", "multinode", "smoke", "security")


def _shares_the_cluster(item) -> bool:
    cs = getattr(item, "callspec", None)
    return (cs is not None and cs.params.get("rt") == "cluster"
            and not getattr(item.module, "OWN_CLUSTER", False))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    yield                                             # the item's fixtures (a module's runtime) are gone now
    if SHARED_CLUSTER.started and (nextitem is None or (
            not _shares_the_cluster(nextitem) and any(nextitem.get_closest_marker(t) for t in RAY_TIERS))):
        SHARED_CLUSTER.close()


@pytest.fixture(scope="module", params=BACKENDS)
def rt(request):
    cluster = None
    if request.param == "local":
        r = make_local_runtime()
    elif getattr(request.module, "OWN_CLUSTER", False):
        cluster = _test_cluster()
        r = Runtime(cluster.backend())
    else:
        r = Runtime(SHARED_CLUSTER.get().backend())
    try:
        with installed(r):
            yield r
    finally:
        if cluster is not None:
            cluster.close()


# ------------------------------------------------------------------------------------------ tier budgets
#: the budgets and how a tier's time is counted (the union of its tests' intervals): tests/tier_budgets.py
from tier_budgets import (SPANS_ENV, TIER_BUDGETS_S, append_spans, enforced, over_budget,  # noqa: E402
                          summary, tier_seconds)

_tier_spans: dict[str, list[tuple[float, float]]] = {}


#: the user_properties key under which a test's report carries the budgeted tiers its markers name: an
#: xdist controller collects nothing itself, so the tiers travel with each report from the worker
TIERS_PROPERTY = "vnpu_tiers"


def pytest_collection_modifyitems(items):
    # by marker, not by keyword: a test's keywords also hold its folders' names (tests/serve/, tests/security/)
    for item in items:
        tiers = [t for t in TIER_BUDGETS_S if item.get_closest_marker(t) is not None]
        if tiers:
            item.user_properties.append((TIERS_PROPERTY, tiers))


def _is_xdist_worker(config) -> bool:
    return hasattr(config, "workerinput")


def pytest_runtest_logreport(report):
    for tier in next((v for k, v in report.user_properties if k == TIERS_PROPERTY), ()):
        _tier_spans.setdefault(tier, []).append((report.start, report.stop))


def pytest_sessionfinish(session, exitstatus):
    SHARED_CLUSTER.close()                            # also after -x or Ctrl-C
    if _is_xdist_worker(session.config):              # the controller counts (and writes) the workers' reports
        return
    spans_file = os.environ.get(SPANS_ENV)
    if spans_file:                                    # one session of scripts/test.sh's run: the run decides
        append_spans(spans_file, _tier_spans)
    elif enforced() and over_budget(tier_seconds(_tier_spans)) and exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter):
    if not _tier_spans:
        return
    part = bool(os.environ.get(SPANS_ENV))
    for line in summary(tier_seconds(_tier_spans), enforced() and not part,
                        label=" (this part of the run)" if part else ""):
        terminalreporter.write_line(line)
