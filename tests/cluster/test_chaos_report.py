"""What a chaos report says about the end state, checked against what is there (no cluster needed):

- the leak accounting finds a segment left by one of the campaign's dead device processes (it is not
  empty by construction), lists a live device's segment, and reports -- never claims -- another
  process's dead segment;
- HBM "back to baseline" covers every device of the pool: a restarted device is compared with its start,
  and a device that cannot be asked is not back;
- the default campaign config runs every workload: each workload's default HBM holds its weights (the
  old 256 MiB default could not hold SmolLM2 for ``generate``).
"""
from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest

from devices import segments
from runtime.cluster.chaos import WORKLOADS, ChaosConfig, hbm_report, leaks


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def _fake(name: str) -> str:
    path = os.path.join(segments.SHM_DIR, name)
    with open(path, "wb") as f:
        f.write(b"\0")
    return path


def test_leak_accounting_sees_what_is_left():
    mine_dead, other_dead = _dead_pid(), _dead_pid()
    start = segments.process_start(os.getpid())
    paths = {
        "dead device": _fake(f"vnpu_{mine_dead}_{start}_1_0badc0de"),
        "live device": _fake(f"vnpu_{os.getpid()}_{start}_2_0badc0df"),
        "other dead": _fake(f"vnpu_{other_dead}_{start}_3_0badc0e0"),
    }
    try:
        rep = leaks({mine_dead, os.getpid()}, set())
        names = {k: os.path.basename(v) for k, v in paths.items()}
        assert names["dead device"] in rep["segments"] and names["live device"] in rep["segments"]
        assert rep["segments_of_dead_processes"] == [names["dead device"]]
        assert names["other dead"] in rep["other_dead_pid_segments"]
        assert names["other dead"] not in rep["segments"]
        assert rep["processes"] == [os.getpid()]                   # a device pid still running
        assert all(os.path.exists(p) for p in paths.values())      # measuring removes nothing
    finally:
        for p in paths.values():
            if os.path.exists(p):
                os.unlink(p)


def test_hbm_back_to_baseline_covers_every_device():
    assert hbm_report({0: 0, 1: 4096}, {0: 0, 1: 4096})["hbm_back_to_baseline"]
    r = hbm_report({0: 0, 1: 0}, {0: 0, 1: 1 << 20})                # device 1 (restarted) holds memory
    assert not r["hbm_back_to_baseline"] and 1 in r["hbm_not_back"]
    r = hbm_report({0: 0, 1: 0}, {0: 0, 1: None})                   # device 1 could not be asked
    assert not r["hbm_back_to_baseline"] and r["hbm_not_back"][1]["end"] is None
    assert not hbm_report({0: 0}, {})["hbm_back_to_baseline"]       # nothing measured is not "back"


@pytest.mark.parametrize("workload", WORKLOADS)
def test_default_config_runs_every_workload(workload):
    """The default ChaosConfig's HBM holds the workload: prepared and one request run on a device of
    exactly that size (in-process)."""
    from devices.device import Device, DeviceConfig
    from runtime.cluster.failover import wrap_handle
    from runtime.cluster.jobrunner import make_workload
    cfg = ChaosConfig(workload=workload)
    wl = make_workload(workload)
    if wl.name != workload:
        pytest.skip(f"{workload} model files are not installed here")
    d = Device(replace(DeviceConfig(), device_id=0x7E00, arena_bytes=cfg.hbm_bytes, cores=2))
    try:
        st = wl.prepare(wrap_handle(d, "cpu"))
        try:
            out = wl.run(st, wl.make_inputs(1, seed=3)[0])
            shape = {"mlp": lambda: (wl.b, wl.d), "embed": lambda: (wl.b, wl.cfg.d),
                     "generate": lambda: (wl.tokens,)}[workload]()
            assert out.shape == shape and np.all(np.isfinite(out))     # one result per request item
            if workload == "mlp":
                np.testing.assert_allclose(out, wl.reference(wl.make_inputs(1, seed=3)[0]), rtol=2e-4, atol=2e-5)
        finally:
            wl.release(st)
    finally:
        d.close()
