"""Offline models on devices (runtime/offline): load a ``vnpu atc`` .om (or an .onnx compiled on load),
describe it, execute it as one graph replay per call at several dynamic batch sizes, refuse every misuse
with its CANN code while the device keeps working, and give all HBM back on unload.

MiniLM-L3 goes through ``vnpu atc`` as a subprocess; a CNN built with onnx.helper through the Python
compiler and through compile-on-load.  Outputs are compared with onnxruntime on the same ONNX files.
Most tests run on in-process devices; the last one on a device actor of a local Ray cluster.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import installed, make_local_runtime
from devices.errors import (ACL_ERROR_GE_DATATYPE_INVALID, ACL_ERROR_GE_DYNAMIC_BATCH_SIZE_INVALID,
                            ACL_ERROR_GE_DYNAMIC_INPUT_ADDR_INVALID, ACL_ERROR_GE_DYNAMIC_INPUT_LENGTH_INVALID,
                            ACL_ERROR_GE_EXEC_MODEL_DATA_SIZE_INVALID, ACL_ERROR_GE_EXEC_MODEL_ID_INVALID,
                            ACL_ERROR_GE_EXEC_MODEL_PATH_INVALID, ACL_ERROR_GE_LOAD_MODEL, ACL_ERROR_GE_PARAM_INVALID,
                            ACL_ERROR_INVALID_PARAM, ACL_ERROR_MODEL_INPUT_NOT_MATCH, ACL_ERROR_MODEL_OUTPUT_NOT_MATCH,
                            ACL_ERROR_PARSE_MODEL, ACL_ERROR_RT_PARAM_INVALID, ACL_ERROR_RT_STREAM_CONTEXT, AclError)
from onnx_models import assert_close, cnn, images, ort_run
from runtime import offline
from runtime.atc import compile_model, make_options
from runtime.models.weights import minilm_l3_onnx
from test_atc import atc_header, token_inputs

ROOT = Path(__file__).resolve().parents[2]
CNN_K, CNN_DEPTH = 72, 4                       # longest reduction (3x3x8) and chained reductions of the CNN


def free_hbm(dev) -> int:
    """The device's free HBM once the caching pool gave back what it caches (the tests' own tensors come
    from the pool; the model's weights and workspace are raw allocations)."""
    dev.empty_cache()
    return dev.mem_info()[0]


@pytest.fixture(scope="module")
def rt():
    with installed(make_local_runtime(count=2, arena=160 << 20)) as r:
        yield r


@pytest.fixture(scope="module")
def cnn_om():
    m = cnn(seed=4)
    return m, compile_model(m, make_options("x:-1,3,16,16", "1,2,4")).to_bytes()


class Buffers:
    """Device buffers for one execution of a dynamic-batch CNN model, freed by ``free``."""

    def __init__(self, dev, m, batch, seed=0):
        self.x = images(batch, seed)
        self.d_x = dev.from_numpy(self.x)
        self.mb = dev.empty((1,), "int64")
        m.set_dynamic_batch_size(offline.DataBuffer(self.mb.ptr, 8), batch)
        self.y = dev.empty(m.desc.outputs[0].dims_at(batch), "float32")
        self.ins = [self.d_x, offline.DataBuffer(self.mb.ptr, 8)]
        self.outs = [self.y]

    def free(self):
        for t in (self.d_x, self.mb, self.y):
            t.free()


# ----------------------------------------------------------------------------------------- MiniLM via vnpu atc

def test_minilm_through_vnpu_atc_and_the_device(rt, tmp_path):
    onnx_path = str(minilm_l3_onnx())
    out = tmp_path / "minilm"
    p = subprocess.run([sys.executable, "-m", "runtime.cli", "atc", f"--model={onnx_path}", "--framework=5",
                        f"--output={out}", "--input_shape=input_ids:-1,16;attention_mask:-1,16",
                        "--dynamic_batch_size=1,2,4", "--soc_version=Ascend910B3"],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines()[-1] == "ATC run success, welcome to the next use."
    dev = rt.device(0)
    free0 = free_hbm(dev)
    m = offline.load(f"{out}.om", dev)
    try:
        d = m.desc
        assert [s.name for s in d.inputs] == ["input_ids", "attention_mask", "ascend_mbatch_shape_data"]
        assert d.inputs[0].dims == (-1, 16) and d.inputs[0].size == 4 * 16 * 8 and d.inputs[0].acl_dtype == 9
        assert d.dynamic_batch == (1, 2, 4) and d.dynamic_input == 2 and d.inputs[2].size == 8
        assert d.outputs[2].dims == (4, 16, 384) and d.outputs[3].dims_at(2) == (2, 384)
        assert len(m.graphs) == 3
        stream = dev.stream()
        for b in (2, 1, 4):
            ids, mask = token_inputs(b, 16, seed=b)
            ref = ort_run(onnx_path, {"input_ids": ids, "attention_mask": mask})
            d_ids, d_mask, mb = dev.from_numpy(ids), dev.from_numpy(mask), dev.empty((1,), "int64")
            outs = [dev.empty(s.dims_at(b), s.dtype) for s in d.outputs]
            m.set_dynamic_batch_size((mb.ptr, 8), b)
            assert m.output_dims(3) == (b, 384)
            m.execute([d_ids, d_mask, (mb.ptr, 8)], outs, stream)
            got = [o.numpy(stream) for o in outs]
            np.testing.assert_array_equal(got[0], ref[0])
            np.testing.assert_array_equal(got[1], ref[1])
            assert_close(got[2], ref[2], k=1536, depth=3, what=f"token embeddings, batch {b}")
            assert_close(got[3], ref[3], k=1536, depth=3, what=f"sentence embeddings, batch {b}")
            for t in [d_ids, d_mask, mb] + outs:
                t.free()
        stream.destroy()
    finally:
        m.unload()
    assert free_hbm(dev) == free0


# ----------------------------------------------------------------------------------------- CNN

def test_cnn_at_every_gear_matches_onnxruntime(rt, cnn_om):
    model, blob = cnn_om
    dev = rt.device(0)
    free0 = free_hbm(dev)
    m = offline.load_from_bytes(blob, dev)
    assert free_hbm(dev) < free0 - m.hbm_bytes + 1                      # weights + workspace, once
    try:
        d = m.desc
        assert d.inputs[0].dims == (-1, 3, 16, 16) and d.inputs[0].format == "NCHW" and d.inputs[0].acl_format == 0
        assert d.inputs[0].size == 4 * 3 * 16 * 16 * 4 and d.outputs[0].size == 4 * 10 * 4
        assert d.input_index("ascend_mbatch_shape_data") == 1 and d.input_index("nope") is None
        for b in (4, 1, 2, 1):
            x = images(b, seed=10 + b)
            got = m.run([x], batch=b)[0]
            assert_close(got, ort_run(model, {"x": x})[0], k=CNN_K, depth=CNN_DEPTH, what=f"batch {b}")
    finally:
        m.unload()
    assert free_hbm(dev) == free0


def test_each_gear_is_one_graph_captured_once_and_replayed(rt, cnn_om):
    _, blob = cnn_om
    dev = rt.device(0)
    m = offline.load_from_bytes(blob, dev)
    bufs = Buffers(dev, m, 2)
    try:
        steps = {g["batch"]: len(g["steps"]) for g in m.manifest["gears"]}
        assert set(m.graphs) == {1, 2, 4}
        info = m.graphs[2].info()
        assert info["tasks"] == steps[2] and info["replays"] == 0
        s = dev.stream()
        for k in range(3):
            m.execute(bufs.ins, bufs.outs, s)
        assert m.graphs[2].info()["replays"] == 3 and m.graphs[4].info()["replays"] == 0
        s.destroy()
    finally:
        bufs.free()
        m.unload()


def test_run_in_place_gives_what_execute_gives_with_one_replay_and_no_copies(rt, cnn_om):
    """The server's per-batch path: host arrays into the model's own slots, one replay, outputs out of its
    slots -- the same numbers as execute() into the caller's buffers (and onnxruntime), every gear; the
    same replay counted; a wrong size or gear refused before anything is queued."""
    model, blob = cnn_om
    dev = rt.device(0)
    m = offline.load_from_bytes(blob, dev)
    s = dev.stream()
    try:
        for b in (2, 4, 1, 2):
            x = images(b, seed=30 + b)
            bufs = Buffers(dev, m, b, seed=30 + b)
            try:
                m.execute(bufs.ins, bufs.outs, s)
                want = bufs.y.numpy(s)
            finally:
                bufs.free()
            before = m.graphs[b].info()["replays"]
            got = m.run_in_place([x], b, s)
            assert m.graphs[b].info()["replays"] == before + 1
            assert got[0].shape == want.shape and got[0].dtype == np.float32
            np.testing.assert_array_equal(got[0], want)
            assert_close(got[0], ort_run(model, {"x": x})[0], k=CNN_K, depth=CNN_DEPTH, what=f"batch {b}")
        replays = {g: m.graphs[g].info()["replays"] for g in m.graphs}
        assert code_of(lambda: m.run_in_place([images(3, 0)], 2, s)) == ACL_ERROR_GE_PARAM_INVALID
        assert code_of(lambda: m.run_in_place([images(3, 0)], 3, s)) == ACL_ERROR_GE_DYNAMIC_BATCH_SIZE_INVALID
        assert code_of(lambda: m.run_in_place([], 2, s)) == ACL_ERROR_GE_PARAM_INVALID
        assert {g: m.graphs[g].info()["replays"] for g in m.graphs} == replays        # nothing queued
        np.testing.assert_array_equal(m.run_in_place([images(1, 31)], 1, s)[0],
                                      m.run([images(1, 31)], batch=1)[0])            # the device still works
    finally:
        s.destroy()
        m.unload()


def test_onnx_compiles_on_load(rt, tmp_path):
    model = cnn(seed=6, batch=2)
    path = tmp_path / "cnn.onnx"
    path.write_bytes(model.SerializeToString())
    dev = rt.device(1)
    free0 = free_hbm(dev)
    m = offline.load(path, dev)                     # static shapes in the file: no input_shape needed
    try:
        assert m.desc.dynamic_batch == () and m.report["fused"]["conv_bn"] == 2
        x = images(2, seed=3)
        assert_close(m.run([x])[0], ort_run(model, {"x": x})[0], k=CNN_K, depth=CNN_DEPTH)
    finally:
        m.unload()
    m2 = offline.load(path, dev, input_shape="x:-1,3,16,16", dynamic_batch_size="1,3")
    try:
        assert m2.desc.dynamic_batch == (1, 3)
        x = images(3, seed=4)
        ref = ort_run(cnn(seed=6), {"x": x})[0]                             # same weights, symbolic batch
        assert_close(m2.run([x], batch=3)[0], ref, k=CNN_K, depth=CNN_DEPTH)
    finally:
        m2.unload()
    assert free_hbm(dev) == free0


def test_two_streams_never_share_the_workspace(rt, cnn_om):
    model, blob = cnn_om
    dev = rt.device(0)
    m = offline.load_from_bytes(blob, dev)
    a, b = Buffers(dev, m, 4, seed=1), Buffers(dev, m, 4, seed=2)
    s1, s2 = dev.stream(), dev.stream()
    try:
        for _ in range(3):
            m.execute_async(a.ins, a.outs, s1)
            m.execute_async(b.ins, b.outs, s2)
        s1.synchronize()
        s2.synchronize()
        for bufs in (a, b):
            assert_close(bufs.y.numpy(), ort_run(model, {"x": bufs.x})[0], k=CNN_K, depth=CNN_DEPTH)
    finally:
        a.free()
        b.free()
        s1.destroy()
        s2.destroy()
        m.unload()


# ----------------------------------------------------------------------------------------- misuse

def code_of(fn):
    with pytest.raises(AclError) as ei:
        fn()
    return ei.value.code


def test_every_misuse_returns_its_code_and_the_device_keeps_working(rt, cnn_om):
    model, blob = cnn_om
    dev, other = rt.device(0), rt.device(1)
    m = offline.load_from_bytes(blob, dev)
    good = Buffers(dev, m, 2, seed=7)
    small = dev.empty((5,), "float32")
    big = dev.empty((4, 3, 16, 16), "float32")
    f64 = dev.empty((2, 3, 16, 8), "float64")                     # the right byte size, the wrong dtype
    mb4 = dev.empty((1,), "int32")
    other_x = other.empty((2, 3, 16, 16), "float32")
    s = dev.stream()
    s_other = other.stream()
    mbuf = offline.DataBuffer(good.mb.ptr, 8)
    try:
        cases = {
            "too few inputs": (lambda: m.execute([good.d_x], good.outs, s), ACL_ERROR_MODEL_INPUT_NOT_MATCH),
            "extra output": (lambda: m.execute(good.ins, good.outs * 2, s), ACL_ERROR_MODEL_OUTPUT_NOT_MATCH),
            "input too small": (lambda: m.execute([(small.ptr, small.nbytes), mbuf], good.outs, s),
                                ACL_ERROR_GE_PARAM_INVALID),
            "input larger than the model's": (lambda: m.execute([(big.ptr, big.nbytes + 64), mbuf], good.outs, s),
                                              ACL_ERROR_GE_PARAM_INVALID),
            "output too small": (lambda: m.execute(good.ins, [(small.ptr, small.nbytes)], s),
                                 ACL_ERROR_GE_PARAM_INVALID),
            "wrong dtype": (lambda: m.execute([f64, mbuf], good.outs, s), ACL_ERROR_GE_DATATYPE_INVALID),
            "null input": (lambda: m.execute([(0, good.d_x.nbytes), mbuf], good.outs, s), ACL_ERROR_INVALID_PARAM),
            "not a buffer": (lambda: m.execute(["x", mbuf], good.outs, s), ACL_ERROR_INVALID_PARAM),
            "batch not a gear": (lambda: m.set_dynamic_batch_size(mbuf, 3), ACL_ERROR_GE_DYNAMIC_BATCH_SIZE_INVALID),
            "null dynamic input": (lambda: m.execute([good.d_x, (0, 8)], good.outs, s),
                                   ACL_ERROR_GE_DYNAMIC_INPUT_ADDR_INVALID),
            "short dynamic input": (lambda: m.execute([good.d_x, (good.mb.ptr, 2)], good.outs, s),
                                    ACL_ERROR_GE_DYNAMIC_INPUT_LENGTH_INVALID),
            "stream of another device": (lambda: m.execute(good.ins, good.outs, s_other), ACL_ERROR_RT_STREAM_CONTEXT),
            "input in host memory": (lambda: m.execute([(good.x.ctypes.data, good.x.nbytes), mbuf], good.outs, s),
                                     ACL_ERROR_INVALID_PARAM),
            "input on another device": (lambda: m.execute([(other_x.ptr, other_x.nbytes), mbuf], good.outs, s),
                                        ACL_ERROR_INVALID_PARAM),
            "input past its allocation": (lambda: m.execute([(small.ptr, good.d_x.nbytes), mbuf], good.outs, s),
                                          ACL_ERROR_RT_PARAM_INVALID),
            "dynamic input in host memory": (lambda: m.execute([good.d_x, (good.x.ctypes.data, 8)], good.outs, s),
                                             ACL_ERROR_GE_DYNAMIC_INPUT_ADDR_INVALID),
        }
        for what, (fn, code) in cases.items():
            assert code_of(fn) == code, what
            m.execute(good.ins, good.outs, s)                       # still works, and the device with it
            assert_close(good.y.numpy(s), ort_run(model, {"x": good.x})[0], k=CNN_K, depth=CNN_DEPTH, what=what)
        # a batch written into the buffer by hand that is not a gear
        good.mb.copy_from(np.array([3], np.int64))
        assert code_of(lambda: m.execute(good.ins, good.outs, s)) == ACL_ERROR_GE_DYNAMIC_BATCH_SIZE_INVALID
        # a 4-byte dynamic input holds a uint32
        m.set_dynamic_batch_size((mb4.ptr, 4), 2)
        assert int(mb4.numpy()[0]) == 2
        m.execute([good.d_x, (mb4.ptr, 4)], good.outs, s)
        assert_close(good.y.numpy(s), ort_run(model, {"x": good.x})[0], k=CNN_K, depth=CNN_DEPTH)
    finally:
        for t in (small, big, f64, mb4, other_x):
            t.free()
        good.free()
        s.destroy()
        s_other.destroy()
        m.unload()
    assert dev.telemetry() is not None


def test_unloaded_model_is_refused(rt, cnn_om):
    _, blob = cnn_om
    dev = rt.device(0)
    free0 = free_hbm(dev)
    m = offline.load_from_bytes(blob, dev)
    mid = m.id
    assert offline.get_model(mid) is m
    bufs = Buffers(dev, m, 1)
    m.unload()
    try:
        assert code_of(lambda: m.execute(bufs.ins, bufs.outs)) == ACL_ERROR_GE_EXEC_MODEL_ID_INVALID
        assert code_of(lambda: m.set_dynamic_batch_size(bufs.ins[1], 1)) == ACL_ERROR_GE_EXEC_MODEL_ID_INVALID
        assert code_of(m.unload) == ACL_ERROR_GE_EXEC_MODEL_ID_INVALID
        assert code_of(lambda: offline.get_model(mid)) == ACL_ERROR_GE_EXEC_MODEL_ID_INVALID
        assert code_of(lambda: offline.get_model(10 ** 9)) == ACL_ERROR_GE_EXEC_MODEL_ID_INVALID
    finally:
        bufs.free()
    assert free_hbm(dev) == free0


def test_bad_files_and_other_soc_are_refused(rt, tmp_path):
    dev = rt.device(0)
    free0 = free_hbm(dev)
    assert code_of(lambda: offline.load(tmp_path / "missing.om", dev)) == ACL_ERROR_GE_EXEC_MODEL_PATH_INVALID
    assert code_of(lambda: offline.load(tmp_path, dev)) == ACL_ERROR_GE_EXEC_MODEL_PATH_INVALID
    atc_file = tmp_path / "resnet50_huawei.om"
    atc_file.write_bytes(atc_header())
    with pytest.raises(AclError, match="Huawei's ATC") as ei:
        offline.load(atc_file, dev)
    assert ei.value.code == ACL_ERROR_PARSE_MODEL
    blob = compile_model(cnn(batch=1), make_options(soc_version="Ascend310P3")).to_bytes()
    cut = tmp_path / "cut.om"
    cut.write_bytes(blob[: len(blob) // 3])
    assert code_of(lambda: offline.load(cut, dev)) == ACL_ERROR_GE_EXEC_MODEL_DATA_SIZE_INVALID
    with pytest.raises(AclError, match="Ascend310P3") as ei:
        offline.load_from_bytes(blob, dev)
    assert ei.value.code == ACL_ERROR_GE_LOAD_MODEL
    assert free_hbm(dev) == free0                                       # nothing left behind


# ----------------------------------------------------------------------------------------- a real device actor

@pytest.mark.cluster
def test_offline_model_on_a_device_actor(cnn_om):
    from runtime.api import Runtime
    from runtime.cluster import ClusterSpec, LocalCluster
    model, blob = cnn_om
    cluster = LocalCluster(ClusterSpec(devices=1, arena_bytes=32 << 20))
    r = Runtime(cluster.backend())
    try:
        dev = r.device(0)
        free0 = free_hbm(dev)
        m = offline.load_from_bytes(blob, dev)
        bufs = Buffers(dev, m, 4, seed=9)
        s = dev.stream()
        for _ in range(2):
            m.execute(bufs.ins, bufs.outs, s)
        assert_close(bufs.y.numpy(s), ort_run(model, {"x": bufs.x})[0], k=CNN_K, depth=CNN_DEPTH)
        assert m.graphs[4].info()["replays"] == 2
        small = dev.empty((8,), "float32")
        assert code_of(lambda: m.execute([small, bufs.ins[1]], bufs.outs, s)) == ACL_ERROR_GE_PARAM_INVALID
        m.execute(bufs.ins, bufs.outs, s)
        small.free()
        bufs.free()
        s.destroy()
        m.unload()
        assert free_hbm(dev) == free0
    finally:
        r.close()
        cluster.close()


def test_bench_mdl_measures_all_three_in_one_run():
    """``vnpu bench mdl`` at a tiny size: every path timed, outputs checked, HBM back to baseline."""
    from runtime.bench.mdl import bench
    res = bench("minilm-l3", 2, 8, 1, "Ascend910B3", "local")
    assert set(res["latency_ms"]) == {"acl", "vnpu", "vnpu_e2e", "ort", "numpy"}
    assert res["acl_equals_offline"]                 # acl.mdl.execute computed the same outputs
    assert all(v > 0 for v in res["latency_ms"].values())
    r = res["report"]
    assert res["hbm_back_to_baseline"] and r["launches_after_fusion"] < r["launches_before_fusion"]
    assert max(res["max_abs_diff_vs_onnxruntime"].values()) < 1e-4
    assert max(res["max_abs_diff_vs_numpy_bound"].values()) < 1e-5
    assert res["report"]["plan_peak_bytes"] < res["report"]["intermediate_bytes_after_fusion"]
