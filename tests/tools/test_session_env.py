"""The test session's environment is fixed before anything loads numpy or Ray (tests/conftest.py):
BLAS runs one thread however pytest is started, and ``RAY_ADDRESS`` never reaches the tests.

Each check runs twice: here (whatever started this session) and in a child ``python -m pytest`` whose
environment has no BLAS thread variables and a ``RAY_ADDRESS`` naming a cluster nobody runs -- the way
a developer runs pytest directly from a shell attached to some Ray cluster."""
from __future__ import annotations

import ctypes
import os
import subprocess
import sys

import numpy as np  # noqa: F401 - the library whose thread pool is checked
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_GETTERS = ("openblas_get_num_threads", "openblas_get_num_threads64_", "scipy_openblas_get_num_threads64_",
            "scipy_openblas_get_num_threads")


def openblas_threads() -> int | None:
    """Threads of the OpenBLAS that numpy loaded (None: numpy uses another BLAS)."""
    with open("/proc/self/maps") as f:
        libs = sorted({ln.split()[-1] for ln in f if "openblas" in ln.lower() and ln.rstrip().endswith(".so")})
    for path in libs:
        lib = ctypes.CDLL(path)
        for name in _GETTERS:
            fn = getattr(lib, name, None)
            if fn is not None:
                fn.restype = ctypes.c_int
                return int(fn())
    return None


def test_blas_runs_one_thread():
    n = openblas_threads()
    if n is None:
        pytest.skip("numpy is not linked against OpenBLAS here")
    assert n == 1, f"OpenBLAS runs {n} threads: the thread variables were set after numpy loaded it"


def test_no_ray_address_in_the_session():
    assert "RAY_ADDRESS" not in os.environ


def test_a_plain_pytest_run_gets_the_same_environment(tmp_path):
    env = {k: v for k, v in os.environ.items()
           if k not in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "PYTEST_ADDOPTS")}
    env["RAY_ADDRESS"] = "127.0.0.1:9"          # nobody's cluster: a test that attached would hang or fail
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rA",
                        "tests/tools/test_session_env.py::test_blas_runs_one_thread",
                        "tests/tools/test_session_env.py::test_no_ray_address_in_the_session"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-2000:]
    assert p.stdout.count("\nPASSED ") == 2, p.stdout[-2000:]
