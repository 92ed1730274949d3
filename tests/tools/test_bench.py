"""Benchmarks that carry physical bounds and scale figures: the memory-bound reference does exactly the
work of each collective (checked against numpy), ``vnpu bench hccl`` prints it beside every row, and
``vnpu bench scale`` (smoke, 4 devices) reports start time, memory and a verified AllReduce.  Figures are
printed, never asserted (tests do not time things); what is asserted is that they exist and add up."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from runtime.bench.bound import Bound, collective_bound, cores

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _cli(*args, env=None, timeout=300):
    e = dict(os.environ, OPENBLAS_NUM_THREADS="1", **(env or {}))
    e.pop("VNPU_TOKEN", None)
    return subprocess.run([sys.executable, "-m", "runtime.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env=e, cwd=ROOT)


def _reference(op, ins, r, count, root):
    n = len(ins)
    if op == "allreduce":
        return np.sum(ins, axis=0)
    if op == "reduce":
        return np.sum(ins, axis=0) if r == root else None
    if op == "broadcast":
        return ins[root] if r != root else None
    if op == "reducescatter":
        return np.sum([x[r * count:(r + 1) * count] for x in ins], axis=0)
    if op == "allgather":
        return np.concatenate(ins)
    if op == "alltoall":
        return np.concatenate([ins[q][r * count:(r + 1) * count] for q in range(n)])
    raise ValueError(op)


@pytest.mark.parametrize("op", ["allreduce", "reduce", "broadcast", "reducescatter", "allgather", "alltoall"])
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_bound_does_the_collectives_work(op, threads):
    """The bound's buffers end up holding exactly what the collective produces (segment-blocked, split
    over threads), so its time is the time of the real work."""
    n, count = 3, 100_003                     # several segments, uneven thread slices
    b = Bound(op, n, count, "float32")
    try:
        for r, x in enumerate(b.ins):
            x[:] = (np.arange(x.size) * (r + 2)) % 17
        b.run(threads)
        for r in range(n):
            want = _reference(op, [x.copy() for x in b.ins], r, count, 0)
            if want is not None:
                np.testing.assert_array_equal(b.outs[r], want)
    finally:
        b.close()


def test_collective_bound_reports_both_thread_counts():
    b = collective_bound("allreduce", 4, 1 << 16, iters=2)
    assert b["t1_s"] > 0 and b["tn_s"] > 0 and b["threads"] == cores()
    assert "skipped" in collective_bound("allreduce", 4, 1024, "bfloat16")


def test_bench_hccl_rows_carry_the_bound():
    """In-process devices (VNPU_BACKEND=local): every row has its bound, and the results are right."""
    p = _cli("bench", "hccl", "--devices", "3", "--min-bytes", "256K", "--max-bytes", "1M", "--op",
             "allreduce,allgather", "--no-baselines", "--json", env={"VNPU_BACKEND": "local"})
    assert p.returncode == 0, p.stderr[-2000:]
    r = json.loads(p.stdout.strip().splitlines()[-1])
    assert r["out_of_bounds"] == 0 and len(r["rows"]) == 6
    for row in r["rows"]:
        assert row["wrong"] == 0
        assert row["bound"]["t1_us"] > 0 and row["bound"]["tn_us"] > 0 and row["bound"]["threads"] == cores()
    print(json.dumps(r["rows"], indent=1))


def test_bench_hccl_bad_arguments_exit_cleanly():
    """Exit 2 with one line on stderr (runtime.cliargs), before any cluster starts."""
    for args, says in ((["hccl", "--op", "scatter"], "argument --op"),
                       (["scale", "--devices", "four"], "argument --devices"),
                       (["scale", "--devices", "4,0"], "argument --devices"),
                       (["scale", "--hbm-mb", "0"], "argument --hbm-mb"),
                       (["scale", "--iters", "0"], "argument --iters"),
                       (["scale", "--allreduce-bytes", "2"], "argument --allreduce-bytes")):
        p = _cli("bench", *args, env={"VNPU_BACKEND": "local"})
        lines = p.stderr.strip().splitlines()
        assert p.returncode == 2 and len(lines) == 1 and says in lines[0], (args, p.stderr)
        assert not p.stdout.strip()


def test_bench_serve_om_bad_models_exit_cleanly(tmp_path):
    """A missing file, a file that is no .om, an .om without dynamic batch gears: exit 2 with one line on
    stderr, before any server starts."""
    from runtime.atc import compile_model, make_options
    from runtime.bench.serve_om_model import cnn_onnx
    static = tmp_path / "static.om"
    compile_model(str(cnn_onnx(tmp_path / "cnn.onnx")), make_options("x:1,3,16,16")).save(str(static))
    (tmp_path / "junk.om").write_bytes(b"not a model")
    for args, says in ((["--model", str(tmp_path / "none.om")], "cannot read"),
                       (["--model", str(tmp_path / "junk.om")], "not a vnpu .om file"),
                       (["--model", str(static)], "needs a .om with dynamic batch gears")):
        p = _cli("bench", "serve-om", *args)
        lines = p.stderr.strip().splitlines()
        assert p.returncode == 2 and len(lines) == 1 and says in lines[0], (args, p.stderr)
        assert not p.stdout.strip()


def test_bench_serve_om_model_flags_that_contradict_exit_2_before_any_work(tmp_path, capsys):
    """``--preset`` with ``--model``, ``--onnx`` without ``--model``: exit 2 with one line, nothing built (the
    CLI's own parser and command, in this process)."""
    from runtime.cli import build_parser
    for args, says in ((["--model", str(tmp_path / "x.om"), "--preset", "minilm"], "give --preset or --model"),
                       (["--onnx", str(tmp_path / "x.onnx")], "--onnx is the ONNX of --model")):
        a = build_parser().parse_args(["bench", "serve-om", *args])
        assert a.fn(a) == 2
        out, err = capsys.readouterr()
        assert not out and len(err.strip().splitlines()) == 1 and says in err, err


def test_bench_serve_om_inputs_are_valid_for_a_token_model():
    """The requests ``vnpu bench serve-om`` makes for a model's declared inputs: token ids below the rows of
    the embedding table the ONNX indexes with them (MiniLM-L3: 30522, read from the graph), masks of ones,
    zero token types, positions 0..L-1 -- and onnxruntime runs MiniLM on them (an id past the table would
    be an error there)."""
    import onnx
    import onnxruntime as ort
    from runtime.bench.serve_om_model import Tensor, index_ranges, samples
    from runtime.models.weights import minilm_l3_onnx
    path = minilm_l3_onnx()
    table = {i.name: i.dims[0] for i in onnx.load(str(path)).graph.initializer if i.name.endswith("word_embeddings.weight")}
    assert index_ranges(path) == {"input_ids": next(iter(table.values()))} and index_ranges(None) == {}
    ins = [Tensor("input_ids", "int64", (8,)), Tensor("attention_mask", "int64", (8,)),
           Tensor("token_type_ids", "int32", (8,)), Tensor("position_ids", "int64", (8,)), Tensor("x", "float32", (3,))]
    reqs = samples(ins, 40, vocab={"input_ids": 1500})
    ids = np.concatenate([r["input_ids"] for r in reqs])
    assert ids.dtype == np.int64 and ids.shape == (40, 8) and 0 <= ids.min() and ids.max() < 1500
    assert len(np.unique(ids)) > 100                          # ids, not one constant
    for r in reqs:
        assert (r["attention_mask"] == 1).all() and (r["token_type_ids"] == 0).all()
        assert r["token_type_ids"].dtype == np.int32 and r["position_ids"].tolist() == [list(range(8))]
        assert r["x"].dtype == np.float32 and r["x"].shape == (1, 3)
    so = ort.SessionOptions()
    so.intra_op_num_threads = so.inter_op_num_threads = 1
    sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    reqs = samples(ins[:2], 4, vocab=index_ranges(path))
    feeds = {n: np.concatenate([r[n] for r in reqs]) for n in ("input_ids", "attention_mask")}
    assert feeds["input_ids"].max() >= 1000                   # BERT's ids above the special tokens
    pooled = sess.run(None, feeds)[-1]
    assert pooled.shape == (4, 384) and np.isfinite(pooled).all()


def test_bench_serve_om_reads_the_vocabulary_from_a_compiled_model(tmp_path):
    """Without an ONNX, the vocabulary comes from the ``.om``'s kernel graph (a ``gather`` of a weight fed by
    the input): a 50-row table gives ids in 0..49, and the kernel graph's answer to them equals the table's
    rows looked up by numpy."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    from runtime.atc import compile_model, make_options
    from runtime.atc.hostrun import HostRun
    from runtime.atc.om import read_om
    from runtime.bench.serve_om_model import Tensor, om_index_ranges, samples, stack
    table = np.random.default_rng(3).standard_normal((50, 8)).astype(np.float32)
    g = helper.make_graph([helper.make_node("Gather", ["emb", "ids"], ["e"]), helper.make_node("Relu", ["e"], ["y"])],
                          "g", [helper.make_tensor_value_info("mask", TensorProto.INT64, ["N", 4]),
                                helper.make_tensor_value_info("ids", TensorProto.INT64, ["N", 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4, 8])],
                          [numpy_helper.from_array(table, "emb")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, str(tmp_path / "emb.onnx"))
    manifest, weights = read_om(compile_model(str(tmp_path / "emb.onnx"), make_options("mask:-1,4;ids:-1,4", "1,2"))
                                .to_bytes())
    assert om_index_ranges(manifest) == {"ids": 50}
    reqs = samples([Tensor("mask", "int64", (4,)), Tensor("ids", "int64", (4,))], 30, vocab=om_index_ranges(manifest))
    ids = np.concatenate([r["ids"] for r in reqs])
    assert ids.min() >= 0 and ids.max() < 50 and len(np.unique(ids)) > 20
    (y,) = HostRun(manifest, weights, 2).run(stack(reqs, ["mask", "ids"], 2))
    np.testing.assert_array_equal(y, np.maximum(table[ids[:2]], 0))


def test_bench_serve_om_mlp_preset_computes_its_layers(tmp_path):
    """The ``mlp`` preset's model (at a small width): onnxruntime on its ONNX and the compiled ``.om``'s kernel
    graph at every gear both equal a float64 numpy forward of the same weights, Gemm + bias with ReLU between
    layers and none after the last; the bench's HBM covers both served copies of a model."""
    import onnx
    from onnx import numpy_helper
    import onnxruntime as ort
    from runtime.atc.hostrun import HostRun
    from runtime.atc.om import read_om
    from runtime.bench.serve_om import arena_bytes
    from runtime.bench.serve_om_model import build_mlp, stack
    om, path = build_mlp(tmp_path, gears=(1, 4, 8), hidden=48, layers=3)
    w = {i.name: numpy_helper.to_array(i).astype(np.float64) for i in onnx.load(str(path)).graph.initializer}
    assert sorted(w) == ["fc0_b", "fc0_w", "fc1_b", "fc1_w", "fc2_b", "fc2_w"]
    x = np.random.default_rng(5).standard_normal((8, 48)).astype(np.float32)
    h = x.astype(np.float64)
    for i in range(3):
        h = h @ w[f"fc{i}_w"] + w[f"fc{i}_b"]
        h = np.maximum(h, 0) if i < 2 else h
    tol = 1e-5 * max(1.0, float(np.abs(h).max()))             # float32 sums of 48 products, three layers deep
    (y_ort,) = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    np.testing.assert_allclose(y_ort, h, rtol=0, atol=tol)
    manifest, weights = read_om(om.read_bytes())
    assert sorted(manifest["dynamic_batch"]) == [1, 4, 8]
    reqs = [{"x": x[i:i + 1]} for i in range(8)]
    for gear in (1, 4, 8):
        (y,) = HostRun(manifest, weights, gear).run(stack(reqs, ["x"], gear))
        np.testing.assert_allclose(y, h[:gear], rtol=0, atol=tol)
    assert arena_bytes(1000) == 1 << 30
    big = 600 << 20
    assert arena_bytes(big) >= 2 * big + (256 << 20) and arena_bytes(big) % (1 << 20) == 0


@pytest.mark.cluster
def test_bench_scale_smoke():
    """4 device actors: start time beside as many empty Ray actors, memory per device process, and an
    AllReduce across all of them whose result is checked element by element."""
    p = _cli("bench", "scale", "--devices", "4", "--hbm-mb", "8", "--iters", "3", "--json", timeout=600)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    r = json.loads(p.stdout.strip().splitlines()[-1])
    assert r["machine"]["cores"] == cores()
    (row,) = r["rows"]
    assert row["devices"] == 4 and row["start_s"] > 0 and row["plain_actors"]["start_s"] > 0
    mem = row["memory"]
    assert mem["n"] == 4 and 0 < mem["pss_median"] <= mem["rss_median"] <= mem["rss_max"]
    assert row["plain_actors"]["rss_median"] > 0
    assert mem["cpu_s_median"] > 0 and row["plain_actors"]["cpu_s_median"] > 0     # read from /proc
    ar = row["allreduce"]
    assert ar["wrong"] == 0 and ar["count"] == (1 << 20) // 4 and ar["time_us"] > 0
    assert row["bound"]["t1_us"] > 0
    print(json.dumps(row, indent=1))


@pytest.mark.cluster
def test_bench_hccl_on_device_actors_reports_their_cpu_time():
    """On device actors of this machine each row also carries the device processes' CPU time per operator
    beside the 1-thread bound's, and the results are right."""
    p = _cli("bench", "hccl", "--devices", "2", "--min-bytes", "4M", "--max-bytes", "4M", "--no-baselines", "--json",
             env={"VNPU_BACKEND": "cluster"}, timeout=600)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    r = json.loads(p.stdout.strip().splitlines()[-1])
    (row,) = r["rows"]
    assert row["wrong"] == 0 and r["backend"] == "cluster"
    assert row["cpu_us"] > 0 and row["bound"]["cpu1_us"] > 0
    print(json.dumps(row, indent=1))
