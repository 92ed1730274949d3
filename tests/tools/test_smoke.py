"""Smoke tier (marker ``smoke``; budget ~3 min on 2 cores: the cluster, SmolLM2 loads): every ``vnpu
bench ... --json`` at a tiny size against one small ``vnpu up`` cluster reports verified results and exits
0 (and the ``--plot`` of those that draw one holds the JSON's numbers); a benchmark whose verification fails
exits 1; one model job runs on the cluster backend.

The benchmarks run as the user runs them (a subprocess each, attached to the cluster through VNPU_HOME);
the failing-verification cases run in this process, where a defect can be planted in the runtime.  The
benchmarks whose devices live in their own process run beside those on the cluster (two lanes)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

pytestmark = [pytest.mark.smoke, pytest.mark.cluster]
ROOT = Path(__file__).resolve().parents[2]

#: benchmark -> tiny arguments (each also takes --json)
BENCHES = {
    "launch": ["--launches", "20", "--repeat", "1"],
    "memcpy": ["--min-bytes", "4K", "--max-bytes", "8K", "--grpc-max-bytes", "4K"],
    "hccl": ["--devices", "2", "--op", "allreduce,allgather", "--min-bytes", "64", "--max-bytes", "256",
             "--iters", "1", "--warmup", "0", "--no-baselines", "--dtype", "bfloat16"],
    "mdl": ["--batch", "1", "--seq", "8", "--rounds", "1", "--backend", "cluster"],
    "infer": ["--tokens", "2", "--rounds", "1", "--no-multi", "--backend", "cluster"],
    "serve": ["--concurrency", "1", "--requests", "1", "--max-tokens", "2", "--prompt-tokens", "8-16", "--backend", "cluster"],
    "sanitize": ["--tokens", "3", "--rounds", "1", "--sentences", "8", "--launches", "10"],   # in-process, ~25 s
    "memory": ["--pairs", "20", "--raw-pairs", "20", "--steps", "20", "--seeds", "1", "--defrag-tensors", "2"],
    "scale": ["--devices", "2", "--hbm-mb", "64", "--allreduce-bytes", "1K", "--iters", "1", "--no-baseline"],
    "kernels": ["--batch", "1", "--context", "16", "--prefill-tokens", "16", "--repeat", "1"],   # in-process, ~3 s
    "overhead": ["--steps", "2", "--layers", "1", "--tokens", "4", "--hidden", "64", "--ffn", "128", "--rounds", "0"],
    "serve-om": ["--concurrency", "1,3", "--requests", "9", "--backend", "local"],     # ~15 s
    "torch": ["--tokens", "3", "--sentences", "4", "--batch", "4", "--rounds", "1", "--ops", "20"],  # in-process
}


def _vnpu(args, env, timeout=300):
    return subprocess.run([sys.executable, "-m", "runtime.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=ROOT)


@pytest.fixture(scope="module")
def cluster_env(tmp_path_factory):
    env = dict(os.environ, VNPU_HOME=str(tmp_path_factory.mktemp("smoke") / "home"))
    for k in ("VNPU_TOKEN", "RAY_ADDRESS", "VNPU_BIND", "VNPU_BACKEND"):
        env.pop(k, None)
    up = _vnpu(["up", "--devices", "2", "--hbm-mb", "1024"], env)     # sparse: SmolLM2 needs ~540 MB
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        yield env
    finally:
        down = _vnpu(["down"], env)
        assert down.returncode == 0, down.stdout + down.stderr


#: benchmark with --plot -> (axes, line, the line's y values in its --json document)
PLOTTED = {
    "memcpy": ("bandwidth (GB/s)", "bound: np.copyto, same run", lambda d: [r["copyto_gbs"] for r in d["rows"]]),
    "hccl": ("bus bandwidth (GB/s)", "allreduce busbw",
             lambda d: [r["busbw"] for r in d["rows"] if r["op"] == "allreduce"]),
    "serve": ("output tokens/s", "vnpu serve", lambda d: [r["output_tokens_per_s"] for r in d["levels"]]),
    "scale": ("start time (s)", "vnpu devices", lambda d: [r["start_s"] for r in d["rows"]]),
}


#: the benchmarks that never reach the cluster (their devices are in their own process): they run one after
#: another beside the cluster's benchmarks, which run one at a time among themselves (they share its devices)
IN_PROCESS = {"sanitize", "kernels", "overhead", "serve-om", "torch"}


@pytest.fixture(scope="module")
def bench_results(cluster_env, tmp_path_factory) -> dict:
    """Every benchmark's JSON (each run once, as the user runs it) and, for those that draw, the picture.
    Two lanes: the benchmarks on the cluster in one, the in-process ones in the other, at the same time."""
    out, plots = {}, tmp_path_factory.mktemp("plots")

    def run(name: str) -> subprocess.CompletedProcess:
        plot = ["--plot", str(plots / f"{name}.png")] if name in PLOTTED else []
        return _vnpu(["bench", name, *BENCHES[name], "--json", *plot], cluster_env)

    def lane(names: list[str]) -> dict[str, subprocess.CompletedProcess]:
        return {name: run(name) for name in names}

    with ThreadPoolExecutor(2) as pool:
        lanes = [pool.submit(lane, [n for n in BENCHES if (n in IN_PROCESS) == side]) for side in (False, True)]
        done = {name: p for f in lanes for name, p in f.result().items()}
    for name in BENCHES:
        p = done[name]
        assert p.returncode == 0, f"bench {name}: exit {p.returncode}\n{p.stdout[-2000:]}\n{p.stderr[-3000:]}"
        out[name] = json.loads(p.stdout.strip().splitlines()[-1])
        if name in PLOTTED:
            out[name]["_plot"] = str(plots / f"{name}.png")
    return out


def test_bench_commands_report_verified_results(bench_results):
    from runtime.bench import BENCHMARKS
    from runtime.plots.figure import read_png_series
    assert set(BENCHES) == set(BENCHMARKS), "a benchmark without a smoke run"
    assert set(PLOTTED) == {name for name, res in bench_results.items() if "_plot" in res}
    for name, res in bench_results.items():
        assert res["verified"] is True, (name, res)
        if "_plot" in res:                         # the picture's line holds the run's JSON numbers
            axes, label, ys = PLOTTED[name]
            assert read_png_series(res["_plot"])[axes][label]["y"] == ys(res), name


def test_serve_om_json_is_consistent(bench_results):
    """``vnpu bench serve-om``'s figures agree with each other (never with a speed): every level has both
    modes, the requests sent were answered and counted by the server, the executed batches add up to
    them (batching off: one row each), the bound is positive, the transport floor answered every request
    correctly, and every ratio is its fields' quotient."""
    res = bench_results["serve-om"]
    n = int(BENCHES["serve-om"][BENCHES["serve-om"].index("--requests") + 1])
    assert [r["concurrency"] for r in res["levels"]] == [1, 3] and res["gears"] == sorted(res["gears"])
    assert 1 <= res["max_batch_size"] <= res["gears"][-1]

    def rel(a, b, digits):                      # a: b rounded to ``digits`` decimals, of fields rounded too
        return abs(a - b) <= 0.5 * 10 ** -digits + 0.002 * abs(b)
    for r in res["levels"]:
        for mode in ("on", "off"):
            m = r[mode]
            assert m["requests"] == m["answered"] == m["verified"] == m["server_rows"] == n, (mode, m)
            assert m["wrong"] == m["failed"] == 0
            batches = {int(k): v for k, v in m["batches"].items()}
            assert sum(k * v for k, v in batches.items()) == n and sum(batches.values()) == m["executions"]
            assert max(batches) <= (res["max_batch_size"] if mode == "on" else 1)
            assert m["mean_batch"] == round(n / m["executions"], 2)
            assert 0 < m["p50_ms"] <= m["p90_ms"] <= m["p99_ms"] and m["wall_s"] > 0
            assert rel(m["requests_per_s"], n / m["wall_s"], 1)
            assert m["server_cpu_ms_per_request"] > 0 and m["client_cpu_ms_per_request"] > 0
        assert r["numpy_bound_rps"] > 0 and r["ort_bound_rps"] > 0 and r["exec_ms_largest_batch"] > 0
        assert rel(r["x_off"], r["on"]["requests_per_s"] / r["off"]["requests_per_s"], 2)
        assert rel(r["of_numpy_bound"], r["on"]["requests_per_s"] / r["numpy_bound_rps"], 3)
        assert rel(r["of_ort_bound"], r["on"]["requests_per_s"] / r["ort_bound_rps"], 3)
        assert r["numpy_bound_cpu_ms_per_row"] > 0 and r["x_off_bound"] > 0
        assert rel(r["of_numpy_bound_cpu"], r["numpy_bound_cpu_ms_per_row"] / r["on"]["server_cpu_ms_per_request"], 3)
        assert rel(r["p99_budget_ms"], res["delay_us"] / 1e3 + 2 * r["exec_ms_largest_batch"], 3)
        assert rel(r["p99_of_budget"], r["on"]["p99_ms"] / r["p99_budget_ms"], 2)
        e = r["echo"]                           # the transport floor (gRPC, the default protocol)
        assert e["requests"] == e["answered"] == e["verified"] == n and e["failed"] == 0, e
        assert e["requests_per_s"] > 0 and rel(r["of_echo"], r["on"]["requests_per_s"] / e["requests_per_s"], 3)


def test_torch_json_is_consistent(bench_results):
    """``vnpu bench torch``: every speed is positive and every ratio is its fields' quotient; the dispatch
    overhead is the npu op's time less the CPU op's; the decode produced the tokens asked for."""
    res = bench_results["torch"]
    d, e, o = res["decode"], res["embed"], res["dispatch"]
    assert len(d["tokens"]) == 3 and d["tokens_equal_cpu"] is True
    for k in ("cpu_tokens_per_s", "npu_tokens_per_s", "api_tokens_per_s"):
        assert d[k] > 0, k
    for k in ("cpu_sentences_per_s", "npu_sentences_per_s", "api_sentences_per_s"):
        assert e[k] > 0, k

    def near(ratio, a, b):                       # a / b of fields rounded to 2 (speeds) or 1 decimal(s)
        q = a / b
        return abs(ratio - q) <= 0.0005 + q * (0.05 / a + 0.05 / b)
    assert near(d["npu_of_cpu_bound"], d["cpu_ms_per_token"], d["npu_ms_per_token"])
    assert near(d["npu_of_api"], d["npu_tokens_per_s"], d["api_tokens_per_s"])
    assert near(e["npu_of_api"], e["npu_sentences_per_s"], e["api_sentences_per_s"])
    assert o["npu_us_per_op"] > 0 and o["cpu_us_per_op"] > 0 and o["api_launch_us"] > 0
    assert abs(o["overhead_us_vs_cpu"] - (o["npu_us_per_op"] - o["cpu_us_per_op"])) <= 0.011
    assert isinstance(res["fallbacks"], dict) and all(v > 0 for v in res["fallbacks"].values())


# In a child process each (a process attached to the cluster as a Ray driver holds files under its
# temp dir, and `vnpu down` stops every process that does).
_FAILED_VERIFICATION = """
import json, sys
import numpy as np
from runtime import api
from runtime.cli import main
memcpy, launch = json.loads(sys.argv[1]), json.loads(sys.argv[2])
real_d2h = api.Device.memcpy_d2h

def corrupt(self, src, nbytes, out=None):          # a copy that comes back different
    res = real_d2h(self, src, nbytes, out)
    res.reshape(-1).view(np.uint8)[0] ^= 0xFF
    return res
api.Device.memcpy_d2h = corrupt
rc_memcpy = main(["bench", "memcpy", *memcpy, "--json"])
api.Device.memcpy_d2h = real_d2h
real_launch = api.Stream.launch                     # a kernel that computes something else
api.Stream.launch = lambda self, kernel, *a, **k: real_launch(self, "mul" if kernel == "add" else kernel, *a, **k)
rc_launch = main(["bench", "launch", *launch, "--json"])
print(json.dumps({"memcpy": rc_memcpy, "launch": rc_launch}))
"""

_MODEL_JOB = """
import json
import numpy as np
from runtime.cluster import cluster_runtime
from runtime.models.bench import numpy_bert
from runtime.models.bert import EmbedJob, load_encoder
texts = ["virtual devices run kernels", "a cluster of two", "embeddings over gRPC"]
cfg, w = load_encoder("minilm-l3")
with cluster_runtime() as rt:
    backend, n = rt.backend.name, rt.device_count()
    with EmbedJob(rt, "minilm-l3", devices=2, parallel="tp", batch_size=4) as job:
        got = job.embed(texts)
        ids, mask = job.tok.encode_batch(texts)
    collectives = job.last_stats.collectives
want = numpy_bert(w, cfg.n_layers, ids, mask, cfg.normalize)
print(json.dumps({"backend": backend, "devices": n, "shape": list(got.shape), "collectives": collectives,
                  "max_abs_diff": float(np.abs(got - want).max())}))
"""


def _child(code: str, env, *args) -> dict:
    p = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=300, env=env,
                       cwd=ROOT)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    return [json.loads(ln) for ln in p.stdout.splitlines() if ln.startswith("{")]


def test_a_failed_verification_exits_1(cluster_env):
    """A copy that comes back different (memcpy), a kernel that computes something else (launch): the
    benchmark says so in its JSON and exits 1."""
    mem, la, rcs = _child(_FAILED_VERIFICATION, cluster_env, json.dumps(BENCHES["memcpy"]),
                          json.dumps(BENCHES["launch"]))
    assert rcs == {"memcpy": 1, "launch": 1}
    assert mem["verified"] is False and la["verified"] is False
    assert not all(r["verified"] for r in mem["rows"])


def test_a_model_job_on_the_cluster_backend(cluster_env):
    """MiniLM-L3 embeddings, tensor parallel over the cluster's two device actors, equal numpy's."""
    (r,) = _child(_MODEL_JOB, cluster_env)
    assert r["backend"] == "cluster" and r["devices"] == 2 and r["shape"] == [3, 384], r
    assert r["collectives"] == 2 * 3 * 2, r            # 2 all-reduces a layer, 3 layers, on each of 2 ranks
    assert r["max_abs_diff"] <= 1e-4, r
