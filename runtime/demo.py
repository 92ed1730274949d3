"""``vnpu demo``: a short multi-device program on the cluster (embedded unless one is up).

Every device gets its own slice of a batch, runs a small MLP block (matmul -> gelu -> matmul -> softmax)
on its own stream, and the host checks each device's result against numpy.
"""
from __future__ import annotations

import time

import numpy as np


def run_demo(rt, batch: int = 64, d_in: int = 256, d_hidden: int = 512, d_out: int = 64) -> list[dict]:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, d_in), dtype=np.float32)
    w1 = rng.standard_normal((d_in, d_hidden), dtype=np.float32) / np.float32(np.sqrt(d_in))
    w2 = rng.standard_normal((d_hidden, d_out), dtype=np.float32) / np.float32(np.sqrt(d_hidden))
    devs = rt.devices()
    parts = np.array_split(x, len(devs))
    jobs = []
    t0 = time.perf_counter()
    for dev, part in zip(devs, parts):
        s = dev.stream()
        tx, t1, t2 = dev.from_numpy(part), dev.from_numpy(w1), dev.from_numpy(w2)
        h = dev.empty((len(part), d_hidden))
        o = dev.empty((len(part), d_out))
        s.launch("matmul", [tx, t1], [h])
        s.launch("gelu", [h], [h], {"approximate": "tanh"})
        s.launch("matmul", [h, t2], [o])
        s.launch("softmax", [o], [o], {"axis": -1})
        jobs.append((dev, s, part, [tx, t1, t2, h, o]))
    rows = []
    for dev, s, part, ts in jobs:
        got = ts[-1].numpy(stream=s)
        hh = part @ w1
        hh = 0.5 * hh * (1 + np.tanh(np.sqrt(2 / np.pi) * (hh + 0.044715 * hh ** 3)))
        ref = hh @ w2
        ref = np.exp(ref - ref.max(-1, keepdims=True))
        ref /= ref.sum(-1, keepdims=True)
        err = float(np.abs(got - ref).max())
        rows.append({"device": dev.index, "rows": len(part), "max_abs_err": err, "ok": err < 1e-4})
        for t in ts:
            t.free()
        s.destroy()
    for r in rows:
        r["wall_s"] = time.perf_counter() - t0
    return rows
