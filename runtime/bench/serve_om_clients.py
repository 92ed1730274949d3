"""The clients of ``vnpu bench serve-om``: the official ``tritonclient`` (gRPC or HTTP, sync, binary tensor
data) in a process of their own, so that the server's process does no client work.  Run as
``python -m runtime.bench.serve_om_clients``; it reads JSON lines on stdin and answers each with one JSON line:

- first, the setup: ``{"url", "protocol" (grpc|http), "inputs": npz, "refs": npz, "names": [...],
  "datatypes": [...], "outputs": [...], "atol": [...]}`` -- sample ``i``'s input ``n`` is ``inputs["i/n"]``
  (one row), its expected output ``o`` is ``refs["i/o"]``; answered ``{"ready": n_samples}``;
- then one line per load: ``{"model", "concurrency", "requests"[, "url"]}`` (``url``: another server than
  the setup's): ``concurrency`` client threads, each
  with its own connection, send ``requests`` one-row requests in all (closed loop: a thread sends its next
  request when the last one is answered; request ``k`` carries sample ``k % n_samples``); answered with
  ``{"latencies_s": [...], "wall_s", "cpu_s" (this process's CPU time during the load), "verified", "wrong",
  "errors"}`` -- a request is verified when every
  output equals its sample's reference within ``atol`` (the caller's tolerance of the computation).

Blocking: each load blocks until its requests are answered.
"""
from __future__ import annotations

import json
import resource
import sys
import threading
import time

import numpy as np


def _load(setup: dict):
    if setup["protocol"] == "grpc":
        import tritonclient.grpc as mod
    else:
        import tritonclient.http as mod
    ins, refs = np.load(setup["inputs"]), np.load(setup["refs"])
    n = len({k.split("/")[0] for k in ins.files})
    samples = [{nm: ins[f"{i}/{nm}"] for nm in setup["names"]} for i in range(n)]
    expected = [[refs[f"{i}/{o}"] for o in setup["outputs"]] for i in range(n)]
    return mod, samples, expected


def _inputs(mod, setup: dict, sample: dict) -> list:
    out = []
    for nm, dt in zip(setup["names"], setup["datatypes"]):
        x = mod.InferInput(nm, list(sample[nm].shape), dt)
        x.set_data_from_numpy(sample[nm])
        out.append(x)
    return out


def run_load(mod, setup: dict, samples: list, expected: list, job: dict) -> dict:
    """One load (see the module)."""
    n, conc = job["requests"], job["concurrency"]
    nxt = iter(range(n))
    lock = threading.Lock()
    lat: list[float] = []
    counts = {"verified": 0, "wrong": 0}
    errors: list[str] = []
    atol = setup["atol"]
    outs = [mod.InferRequestedOutput(o) for o in setup["outputs"]]
    start = threading.Barrier(conc + 1)

    def client():
        c = mod.InferenceServerClient(job.get("url", setup["url"]))
        try:
            prepared = [_inputs(mod, setup, s) for s in samples]
            start.wait()
            while True:
                with lock:
                    k = next(nxt, None)
                if k is None:
                    return
                t0 = time.perf_counter()
                try:
                    r = c.infer(job["model"], prepared[k % len(samples)], outputs=outs)
                except Exception as e:  # noqa: BLE001 - reported
                    with lock:
                        errors.append(f"{type(e).__name__}: {e}")
                    continue
                dt = time.perf_counter() - t0
                ok = all(np.allclose(r.as_numpy(o), want, rtol=0, atol=tol)
                         for o, want, tol in zip(setup["outputs"], expected[k % len(samples)], atol))
                with lock:
                    lat.append(dt)
                    counts["verified" if ok else "wrong"] += 1
        finally:
            c.close()

    ru0 = resource.getrusage(resource.RUSAGE_SELF)
    th = [threading.Thread(target=client, daemon=True) for _ in range(conc)]
    for t in th:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    for t in th:
        t.join()
    wall = time.perf_counter() - t0
    ru = resource.getrusage(resource.RUSAGE_SELF)
    cpu = ru.ru_utime + ru.ru_stime - ru0.ru_utime - ru0.ru_stime
    return {"latencies_s": lat, "wall_s": wall, "cpu_s": cpu, **counts, "errors": errors[:3], "failed": len(errors)}


def main() -> int:
    setup = json.loads(sys.stdin.readline())
    mod, samples, expected = _load(setup)
    print(json.dumps({"ready": len(samples)}), flush=True)
    for line in sys.stdin:
        if line.strip():
            print(json.dumps(run_load(mod, setup, samples, expected, json.loads(line))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
