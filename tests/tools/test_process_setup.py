"""Importing vnpu has no side effects; the entry points set the process up.

Each check runs a fresh interpreter with a clean environment (no ``RAY_*``, no ``VNPU_*`` but what the
test sets): importing the runtime's packages sets no environment variable, imports no Ray, starts no
thread and no sanitizer -- even with ``VNPU_SANITIZE`` set.  The entry points that may be the first to
import Ray prepare it (:func:`runtime.cluster.rayenv.prepare`): ``vnpu``'s ``main``, and a program that
only names the cluster backend (``VNPU_BACKEND=cluster``) -- Ray comes up in token mode, and the
sanitizer's exit handler is registered before Ray's (so it runs after it, last).  No cluster is started:
the program finds none and gets the no-device error.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

#: the packages a program imports without wanting a cluster
PLAIN = ("devices", "driver", "runtime", "runtime.atc", "runtime.acl", "runtime.api", "runtime.hccl",
         "runtime.offline", "runtime.models", "runtime.observe", "runtime.sanitize", "runtime.profiler")


def _run(script: str, home, **env) -> dict:
    clean = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home), "VNPU_HOME": str(home / "vnpu"),
             "OPENBLAS_NUM_THREADS": "1", **env}
    p = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], env=clean, cwd=ROOT, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_importing_sets_nothing_and_starts_nothing(tmp_path):
    out = _run(f"""
        import json, os, sys, threading
        before, threads = dict(os.environ), threading.active_count()
        import importlib
        for m in {PLAIN!r}:
            importlib.import_module(m)
        import runtime.sanitize
        print(json.dumps({{"env": sorted(k for k in os.environ if os.environ.get(k) != before.get(k)),
                          "ray": "ray" in sys.modules, "threads": threading.active_count() - threads,
                          "sanitizer": runtime.sanitize.current() is not None}}))
    """, tmp_path, VNPU_SANITIZE="racecheck")
    assert out == {"env": [], "ray": False, "threads": 0, "sanitizer": False}


@pytest.mark.parametrize("bind,single_node", [(None, "0"), ("127.0.0.1", "0"), ("node", None)])
def test_cli_main_prepares_ray(tmp_path, bind, single_node):
    """``vnpu``'s ``main`` sets Ray's import-time environment before any command runs (a loopback
    cluster: single-node, so Ray binds loopback; ``VNPU_BIND=node``: left to Ray)."""
    out = _run("""
        import contextlib, io, json, os
        from runtime.cli import main
        before = os.environ.get("RAY_AUTH_MODE")
        with contextlib.redirect_stdout(io.StringIO()):
            code = main(["--help"])
        print(json.dumps([code, before, os.environ.get("RAY_AUTH_MODE"),
                          os.environ.get("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER")]))
    """, tmp_path, **({"VNPU_BIND": bind} if bind else {}))
    assert out == [0, None, "token", single_node]


def test_program_naming_the_cluster_backend_gets_token_mode_and_the_sanitizer_first(tmp_path):
    """``VNPU_BACKEND=cluster`` with only ``runtime.api`` imported: the backend's provider is found by
    name, Ray is imported in token mode, and the sanitizer's exit handler was registered before Ray's
    (the order of ``atexit.register`` calls, read by a spy that registers each one as usual)."""
    out = _run("""
        import atexit, json
        order, register = [], atexit.register
        def spy(fn, *a, **k):
            order.append(f"{getattr(fn, '__module__', '')}.{getattr(fn, '__qualname__', '')}")
            return register(fn, *a, **k)
        atexit.register = spy
        from devices.errors import AclError
        from runtime.api import get_runtime
        try:
            get_runtime()
            error = None
        except AclError as e:
            error = e.name
        from ray._raylet import AuthenticationMode, get_authentication_mode
        print(json.dumps({"error": error, "token": get_authentication_mode() == AuthenticationMode.TOKEN,
                          "order": order}))
    """, tmp_path, VNPU_BACKEND="cluster", VNPU_SANITIZE="leakcheck", VNPU_SANITIZE_OPTIONS="summary=0")
    assert out["error"] == "ACL_ERROR_RT_NO_DEVICE" and out["token"], out
    sanitizer, ray_exit = "runtime.sanitize._finish_at_exit", "ray._private.worker.shutdown"
    assert sanitizer in out["order"] and ray_exit in out["order"], out["order"]
    assert out["order"].index(sanitizer) < out["order"].index(ray_exit), out["order"]


def test_backend_registry(monkeypatch):
    """Backends register callables; a name nobody registered is refused with the names that exist."""
    monkeypatch.setenv("VNPU_DEVICES", "1")
    monkeypatch.setenv("VNPU_HBM_BYTES", str(16 << 20))
    from devices.errors import InvalidParamError
    from runtime import backend
    with pytest.raises(InvalidParamError, match="not callable"):
        backend.register_backend("x", "runtime.backend:LocalBackend")      # the old string form
    with pytest.raises(InvalidParamError, match=r"unknown backend 'nope' \(known: cluster, local\)"):
        backend.create_backend("nope")
    b = backend.create_backend("inprocess")
    try:
        assert isinstance(b, backend.LocalBackend)
    finally:
        b.close()


def test_ray_token_is_made_owner_only_and_an_open_one_is_narrowed(tmp_path, monkeypatch):
    """Ray's cluster token (``~/.ray/auth_token``) lets a client into the GCS: vnpu makes it mode 0600
    in a 0700 directory before any cluster start (Ray itself writes it with the umask, 0644 here), keeps
    it across starts, and narrows an existing token readable by others without changing it."""
    from runtime.cluster import rayenv
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("RAY_AUTH_MODE", "token")
    old = os.umask(0o022)
    try:
        rayenv.ensure_token()
        tok = tmp_path / ".ray" / "auth_token"
        first = tok.read_text()
        assert len(first) >= 32
        assert tok.stat().st_mode & 0o777 == 0o600
        assert (tmp_path / ".ray").stat().st_mode & 0o777 == 0o700
        rayenv.ensure_token()
        assert tok.read_text() == first                     # made once, kept
        tok.chmod(0o644)                                   # as Ray's own ray.init() leaves it
        rayenv.ensure_token()
        assert tok.stat().st_mode & 0o777 == 0o600 and tok.read_text() == first
    finally:
        os.umask(old)

