"""Running a ``vnpu`` command in-process for argument-checking tests, and the tripwires that prove it did
no work: whatever would start work -- a cluster, an in-process device, a chaos campaign -- is replaced by
one that raises :class:`WorkStarted` (tests/tools/test_cli_args.py, tests/tools/test_cli_outputs.py)."""
from __future__ import annotations

import pytest

from runtime.cli import main


class WorkStarted(Exception):
    pass


@pytest.fixture
def tripwires(monkeypatch):
    """Anything that starts work raises WorkStarted."""
    import runtime.backend
    import runtime.cluster
    import runtime.cluster.chaos
    import runtime.cluster.local
    import runtime.cluster.remote

    def trip(*a, **k):
        raise WorkStarted("work started before the arguments were checked")
    monkeypatch.setattr(runtime.cluster.chaos, "run_campaign", trip)
    monkeypatch.setattr(runtime.cluster.local.LocalCluster, "__init__", trip)
    monkeypatch.setattr(runtime.backend.LocalBackend, "__init__", trip)
    monkeypatch.setattr(runtime.cluster.remote.RemoteBackend, "connect", trip)
    monkeypatch.setattr(runtime.cluster.local, "cluster_up", trip)
    monkeypatch.setattr(runtime.cluster, "cluster_up", trip)
    monkeypatch.setattr(runtime.cluster.local, "cluster_runtime", trip)
    monkeypatch.setattr(runtime.cluster, "cluster_runtime", trip)


def cli(argv, capsys) -> tuple[int, str, str]:
    """``vnpu ARGV`` in this process: (exit status, stdout, stderr)."""
    try:
        rc = main([str(x) for x in argv])
    except SystemExit as e:
        rc = e.code
    out, err = capsys.readouterr()
    return rc, out, err
