"""The offline-model compiler (runtime/atc) without a device: flag parsing, constant folding, fusion,
lowering, the static memory plan, the .om container and its refusals, and the ``vnpu atc`` command.

Numbers are checked against onnxruntime on the same ONNX graphs (the compiled kernel graph run by
numpy, runtime.atc.hostrun, is exactly what the device replays).  The memory plan is checked
symbolically: lifetimes are recomputed here from the steps of the written .om, and no two buffers live
at the same step may share a byte.
"""
from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from devices.errors import (ACL_ERROR_DESERIALIZE_MODEL, ACL_ERROR_GE_EXEC_MODEL_DATA_SIZE_INVALID,
                            ACL_ERROR_GE_EXEC_MODEL_PATH_INVALID, ACL_ERROR_GE_PARAM_INVALID, ACL_ERROR_GE_SHAPE_INVALID,
                            ACL_ERROR_OP_NOT_FOUND, ACL_ERROR_PARSE_MODEL, AtcError, ModelError)
from onnx_models import (assert_close, bad_matmul, cnn, gelu_mlp, layernorm_decomposed, misc_ops, ort_run,
                         shape_arith, single_op, softmax_opset11)
from runtime.atc import compile_model, make_options, read_om, write_om
from runtime.atc.hostrun import HostRun
from runtime.atc.om import HEADER_SIZE
from runtime.models.weights import minilm_l3_onnx

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def minilm():
    """MiniLM-L3 compiled for seq 16 at gears 1, 2, 4 (the graph and its compiled form)."""
    path = str(minilm_l3_onnx())
    return path, compile_model(path, make_options("input_ids:-1,16;attention_mask:-1,16", "1,2,4"))


def token_inputs(b, s, seed=0):
    rng = np.random.default_rng(seed)
    ids = rng.integers(1000, 30000, (b, s)).astype(np.int64)
    mask = np.ones((b, s), np.int64)
    mask[b - 1, s // 2:] = 0                                    # one padded row
    return ids, mask


# ----------------------------------------------------------------------------------------- options

@pytest.mark.parametrize("shape,ecode", [("x:1,a", "E10002"), ("1,2,3", "E10002"), ("x:1,0", "E10011"),
                                         ("x:1,-2", "E10011"), ("x:1;x:2", "E10002")])
def test_input_shape_errors(shape, ecode):
    with pytest.raises(AtcError) as ei:
        make_options(shape)
    assert ei.value.ecode == ecode and ei.value.code == ACL_ERROR_GE_PARAM_INVALID
    assert ei.value.line.startswith(ecode + ": ")


@pytest.mark.parametrize("gears,ecode", [("4", "E10035"), (",".join(map(str, range(1, 103))), "E10036"),
                                         ("1,0", "E10038"), ("2,2", "E10039"), ("1,x", "E10001")])
def test_dynamic_batch_errors(gears, ecode):
    with pytest.raises(AtcError) as ei:
        make_options("x:-1,3", gears)
    assert ei.value.ecode == ecode


def test_options_and_soc():
    o = make_options("input_ids:-1,16;attention_mask:-1,16", "1,2,4", "Ascend310P3")
    assert o.shapes() == {"input_ids": (-1, 16), "attention_mask": (-1, 16)}
    assert o.dynamic_batch == (1, 2, 4) and o.soc_version == "Ascend310P3"
    assert make_options().soc_version == "Ascend910B3"
    with pytest.raises(AtcError, match="Ascend999") as ei:
        make_options(soc_version="Ascend999")
    assert ei.value.ecode == "E10001"


def test_input_shape_must_match_the_model():
    with pytest.raises(AtcError) as ei:
        compile_model(cnn(), make_options("image:1,3,16,16"))
    assert ei.value.ecode == "E10016" and "image" in str(ei.value)
    with pytest.raises(AtcError) as ei:                        # symbolic dims, not given
        compile_model(cnn())
    assert ei.value.ecode == "E10001" and "--input_shape" in str(ei.value)
    with pytest.raises(AtcError) as ei:                        # -1 without gears
        compile_model(cnn(), make_options("x:-1,3,16,16"))
    assert ei.value.ecode == "E10011"
    with pytest.raises(AtcError) as ei:                        # gears without a -1 batch axis
        compile_model(cnn(), make_options("x:2,3,16,16", "1,2"))
    assert ei.value.ecode == "E10031"
    with pytest.raises(AtcError) as ei:                        # -1 off the batch axis
        compile_model(cnn(), make_options("x:1,3,-1,16", "1,2"))
    assert ei.value.ecode == "E10018"


# ----------------------------------------------------------------------------------------- errors naming the node

def test_unsupported_operator_names_type_and_node():
    with pytest.raises(AtcError) as ei:
        compile_model(single_op("NonZero", "mask_nonzero"))
    e = ei.value
    assert e.ecode == "EZ9010" and e.code == ACL_ERROR_OP_NOT_FOUND
    assert "mask_nonzero" in e.line and "ai.onnx::17::NonZero" in e.line
    with pytest.raises(AtcError) as ei:
        compile_model(single_op("FancyOp", "n7", domain="com.example"))
    assert "n7" in ei.value.line and "com.example::FancyOp" in ei.value.line


def test_unsupported_shape_names_the_node():
    with pytest.raises(AtcError) as ei:
        compile_model(bad_matmul())
    e = ei.value
    assert e.ecode == "EZ0009" and e.code == ACL_ERROR_GE_SHAPE_INVALID
    assert "mm_bad(MatMul)" in e.line and "(2, 3)" in e.line and "(4, 5)" in e.line


def test_malformed_attribute_is_an_error_naming_the_node():
    import onnx
    from onnx import TensorProto, helper
    node = helper.make_node("Transpose", ["x"], ["y"], name="tp_bad", perm=[0, 0])
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 2])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(AtcError, match=r"tp_bad\(Transpose\)") as ei:
        compile_model(m)
    assert ei.value.ecode == "EZ0009"
    node.ClearField("attribute")
    node.attribute.append(helper.make_attribute("perm", "zz"))           # a string where ints belong
    with pytest.raises(AtcError, match="tp_bad") as ei:
        compile_model(onnx.ModelProto.FromString(m.SerializeToString()))
    assert ei.value.ecode == "EZ0009"
    fake = single_op("Attention", "not_ours")                             # our internal op names are not ONNX's
    with pytest.raises(AtcError) as ei:
        compile_model(fake)
    assert ei.value.ecode == "EZ9010" and "not_ours" in ei.value.line


def test_bad_model_files():
    with pytest.raises(AtcError) as ei:
        compile_model("/nonexistent/m.onnx")
    assert ei.value.ecode == "E10001" and ei.value.code == ACL_ERROR_GE_EXEC_MODEL_PATH_INVALID
    with pytest.raises(AtcError) as ei:
        compile_model(b"\x00\x01garbage that is not protobuf" * 3)
    assert ei.value.ecode == "E10041" and ei.value.code == ACL_ERROR_PARSE_MODEL


# ----------------------------------------------------------------------------------------- folding / fusion

def test_shape_arithmetic_folds_away():
    m = shape_arith()
    cm = compile_model(m)
    prog = cm.gears[0].program
    assert prog.kernel_counts() == {"add": 1, "relu": 1}        # Shape .. Cast, both Reshapes: no launches
    assert cm.report["folded_nodes"] == 12
    x = np.random.default_rng(0).standard_normal((3, 6, 8)).astype(np.float32)
    np.testing.assert_array_equal(HostRun(cm.manifest, cm.weights).run([x])[0], ort_run(m, {"x": x})[0])


def test_minilm_folding_and_fusion_are_visible(minilm):
    path, cm = minilm
    r = cm.report
    assert r["folded_nodes"] > 200                            # the exporter's Shape/Gather/Concat arithmetic
    assert r["fused"]["attention"] == 3 and r["fused"]["gelu"] == 3 and r["fused"]["matmul_bias"] == 18
    assert r["fused"]["activation"] == 3                       # the GELUs went into the FFN matmuls
    assert r["launches_before_fusion"] > r["launches_after_fusion"] + 40
    assert r["intermediate_bytes_before_fusion"] > 2 * r["intermediate_bytes_after_fusion"]
    kc = cm.gears[-1].program.kernel_counts()
    assert kc["attention"] == 3 and kc["fused_matmul"] == 3 and kc["layernorm"] == 7
    assert "softmax" not in kc and "erf" not in kc and "batch_matmul" not in kc
    steps = [s["kernel"] for s in cm.manifest["gears"][-1]["steps"]]
    assert len(steps) == r["launches_after_fusion"]


@pytest.mark.parametrize("half_first", [False, True])
def test_gelu_pattern_fuses_into_the_matmul(half_first):
    m = gelu_mlp(half_first=half_first)
    cm = compile_model(m)
    assert cm.report["fused"]["gelu"] == 1
    prog = cm.gears[0].program
    assert prog.kernel_counts() == {"fused_matmul": 1, "matmul": 1}
    assert [s.attrs.get("act") for s in prog.steps if s.kernel == "fused_matmul"] == ["gelu"]
    x = np.random.default_rng(1).standard_normal((4, 16)).astype(np.float32)
    assert_close(HostRun(cm.manifest, cm.weights).run([x])[0], ort_run(m, {"x": x})[0], k=32, depth=2)
    unfused = compile_model(m, make_options()).gears[0]
    assert unfused.before["launches"] == 8


def test_decomposed_layernorm_becomes_one_kernel():
    m = layernorm_decomposed()
    cm = compile_model(m)
    assert cm.gears[0].program.kernel_counts() == {"layernorm": 1}
    assert cm.report["launches_before_fusion"] == 9
    x = (np.random.default_rng(2).standard_normal((2, 5, 24)) * 3 + 1).astype(np.float32)
    assert_close(HostRun(cm.manifest, cm.weights).run([x])[0], ort_run(m, {"x": x})[0], k=24, depth=2)


def test_cnn_fusion_and_numbers():
    m = cnn()
    cm = compile_model(m, make_options("x:-1,3,16,16", "1,3"))
    r = cm.report
    assert r["fused"]["conv_bn"] == 2 and r["fused"]["activation"] == 3
    kc = cm.gears[-1].program.kernel_counts()
    assert kc["conv2d"] == 3 and "batch_norm" not in kc and "relu" not in kc
    acts = [s.attrs["act"] for s in cm.gears[-1].program.steps if s.kernel == "conv2d"]
    assert acts == ["relu", "relu", "relu"]
    for b in (1, 3):
        x = np.random.default_rng(b).standard_normal((b, 3, 16, 16)).astype(np.float32)
        got = HostRun(cm.manifest, cm.weights, b).run([x])[0]
        assert_close(got, ort_run(m, {"x": x})[0], k=72, depth=4, what=f"batch {b}")


def test_many_lowering_paths_match_onnxruntime():
    """Slices (a view and a strided_slice), Concat, a Transpose that only moves a size-1 axis (a view),
    Softmax over axis 1, inner-axis reductions, Clip/Sigmoid/Tanh/Pow/Sqrt, Equal+Where, Gather with
    run-time indices (negative ones too), LayerNormalization over 2 axes, Squeeze/Unsqueeze, a 1-D conv
    and pool, Gemm with transA/alpha/beta/[M, N] C + Relu, Gemm with a run-time B."""
    m = misc_ops()
    cm = compile_model(m)
    kc = cm.gears[0].program.kernel_counts()
    assert kc["strided_slice"] == 1 and "transpose" not in kc and kc["conv2d"] == 1 and kc["max_pool2d"] == 1
    x = np.random.default_rng(0).standard_normal((2, 3, 4, 5)).astype(np.float32)
    idx = np.array([4, -2], np.int64)
    ref = ort_run(m, {"x": x, "idx": idx})
    got = HostRun(cm.manifest, cm.weights).run([x, idx])
    for name, g, r in zip([o.name for o in m.graph.output], got, ref):
        assert_close(g, r, k=60, depth=3, what=name)
    m = softmax_opset11()
    x = np.random.default_rng(1).standard_normal((2, 3, 4)).astype(np.float32)
    assert_close(HostRun(*_mw(compile_model(m))).run([x])[0], ort_run(m, {"x": x})[0], k=12)


def _mw(cm):
    return cm.manifest, cm.weights


def test_fusion_can_be_turned_off():
    opts = make_options("x:-1,3,16,16", "1,3", fuse=False)
    cm = compile_model(cnn(), opts)
    kc = cm.gears[-1].program.kernel_counts()
    assert kc["batch_norm"] == 2 and kc["relu"] == 3
    assert cm.report["launches_after_fusion"] == cm.report["launches_before_fusion"]


# ----------------------------------------------------------------------------------------- memory plan

def spans_by_buffer(prog):
    """Step interval each workspace buffer is live over, derived here from the program's steps (inputs
    are copied in before step 0, outputs copied out after the last step)."""
    spans = {}

    def touch(v, i):
        if prog.buffers[v.buf].kind != "weight":
            lo, hi = spans.get(v.buf, (i, i))
            spans[v.buf] = (min(lo, i), max(hi, i))
    for v in prog.inputs:
        touch(v, -1)
    for i, st in enumerate(prog.steps):
        for v in st.inputs + st.outputs:
            touch(v, i)
    for v in prog.outputs:
        touch(v, len(prog.steps))
    return spans


def test_memory_plan_reuses_and_never_overlaps_live_buffers(minilm):
    _, cm = minilm
    for gb, gear in zip(cm.gears, cm.manifest["gears"]):
        st = gear["stats"]
        assert st["plan_peak_bytes"] < st["intermediate_bytes"] / 4         # reuse, by a wide margin
        assert gear["workspace_size"] == st["plan_peak_bytes"]
        prog = gb.program
        spans = spans_by_buffer(prog)
        place = {b: (off, n) for off, n, b in ((p.offset, p.nbytes, p.buf) for p in gb.plan.placements.values())}
        assert set(place) == set(spans)
        items = sorted(spans)
        for i, b1 in enumerate(items):
            o1, n1 = place[b1]
            assert o1 % 64 == 0 and o1 + n1 <= gear["workspace_size"]
            for b2 in items[i + 1:]:
                (f1, l1), (f2, l2), (o2, n2) = spans[b1], spans[b2], place[b2]
                if f1 <= l2 and f2 <= l1:                                   # live at a common step
                    assert o1 + n1 <= o2 or o2 + n2 <= o1, f"live buffers {b1} and {b2} overlap"


def test_written_steps_never_clobber_live_data(minilm):
    """Replay the written .om symbolically: every workspace byte is tagged with the buffer whose data
    it holds; a step may read only bytes still tagged with the buffer it means to read."""
    _, cm = minilm
    for gb, gear in zip(cm.gears, cm.manifest["gears"]):
        prog = gb.program
        tag = np.full(gear["workspace_size"], -1, np.int64)

        def rng(view):
            n = int(np.prod(view[2], dtype=np.int64)) * np.dtype(view[3]).itemsize
            return slice(view[1], view[1] + n)
        for v, pv in zip(gear["inputs"], prog.inputs):
            tag[rng(v)] = pv.buf
        assert len(gear["steps"]) == len(prog.steps)
        for i, (ms, ps) in enumerate(zip(gear["steps"], prog.steps)):
            for v, pv in zip(ms["inputs"], ps.inputs):
                if v[0] == "ws":
                    assert (tag[rng(v)] == pv.buf).all(), f"step {i} ({ms['kernel']}) reads clobbered data"
            for v, pv in zip(ms["outputs"], ps.outputs):
                tag[rng(v)] = pv.buf
        for v, pv in zip(gear["outputs"], prog.outputs):
            if v[0] == "ws":
                assert (tag[rng(v)] == pv.buf).all(), "an output was overwritten before the copy-out"


# ----------------------------------------------------------------------------------------- numbers

def test_minilm_matches_onnxruntime_at_every_gear(minilm):
    path, cm = minilm
    for b in (1, 2, 4):
        ids, mask = token_inputs(b, 16, seed=b)
        ref = ort_run(path, {"input_ids": ids, "attention_mask": mask})
        got = HostRun(cm.manifest, cm.weights, b).run([ids, mask])
        np.testing.assert_array_equal(got[0], ref[0])                       # Identity outputs
        np.testing.assert_array_equal(got[1], ref[1])
        assert_close(got[2], ref[2], k=1536, depth=3, what=f"token embeddings, batch {b}")
        assert_close(got[3], ref[3], k=1536, depth=3, what=f"sentence embedding, batch {b}")


# ----------------------------------------------------------------------------------------- .om container

@pytest.fixture(scope="module")
def small_om():
    cm = compile_model(cnn(), make_options("x:-1,3,16,16", "1,3"))
    return cm, cm.to_bytes()


def test_om_roundtrip(small_om):
    cm, blob = small_om
    man, w = read_om(blob)
    assert man["format"] == "vnpu-om" and man["version"] == 1 and man["soc_version"] == "Ascend910B3"
    assert bytes(w) == cm.weights and man["dynamic_batch"] == [1, 3]
    assert [i["name"] for i in man["inputs"]] == ["x", "ascend_mbatch_shape_data"]
    assert man["inputs"][0]["dims"] == [-1, 3, 16, 16] and man["outputs"][0]["dims"] == [-1, 10]
    x = np.random.default_rng(5).standard_normal((3, 3, 16, 16)).astype(np.float32)
    np.testing.assert_array_equal(HostRun(man, w, 3).run([x])[0], HostRun(cm.manifest, cm.weights, 3).run([x])[0])


def atc_header(name=b"resnet50", platform=b"Ascend910B3"):
    """A Huawei ATC ModelFileHeader (256 bytes, magic 0x444F4D49) followed by some partition data."""
    h = bytearray(256)
    struct.pack_into("<III", h, 0, 0x444F4D49, 256, 0x10000000)
    struct.pack_into("<I", h, 76, 1024)
    h[84:84 + len(name)] = name
    h[160:160 + len(platform)] = platform
    return bytes(h) + b"\x07" * 1024


def test_real_atc_om_is_refused_with_the_parse_code():
    with pytest.raises(ModelError) as ei:
        read_om(atc_header())
    e = ei.value
    assert e.code == ACL_ERROR_PARSE_MODEL
    assert "Huawei's ATC" in e.detail and "0x444F4D49" in e.detail and "resnet50" in e.detail
    assert "vnpu atc" in e.detail


@pytest.mark.parametrize("cut", [0, 10, HEADER_SIZE - 1, HEADER_SIZE + 5, -1, -1000])
def test_truncated_om_is_refused(small_om, cut):
    _, blob = small_om
    with pytest.raises(ModelError) as ei:
        read_om(blob[:cut] if cut >= 0 else blob[:len(blob) + cut])
    assert ei.value.code == ACL_ERROR_GE_EXEC_MODEL_DATA_SIZE_INVALID


def test_corrupt_or_foreign_files_are_refused(small_om):
    _, blob = small_om
    for pos in (HEADER_SIZE + 3, len(blob) // 2, len(blob) - 1):           # manifest or weights bytes
        bad = bytearray(blob)
        bad[pos] ^= 0xFF
        with pytest.raises(ModelError) as ei:
            read_om(bytes(bad))
        assert ei.value.code == ACL_ERROR_DESERIALIZE_MODEL and "digest" in ei.value.detail
    with pytest.raises(ModelError) as ei:
        read_om(b"PK\x03\x04" + b"\0" * 200)                               # a zip, say
    assert ei.value.code == ACL_ERROR_GE_EXEC_MODEL_DATA_SIZE_INVALID and "not a vnpu .om" in ei.value.detail
    newer = bytearray(blob)
    struct.pack_into("<H", newer, 8, 3)
    with pytest.raises(ModelError) as ei:
        read_om(bytes(newer))
    assert ei.value.code == ACL_ERROR_PARSE_MODEL and "version 3" in ei.value.detail


def test_manifest_fields_are_validated(small_om):
    cm, _ = small_om
    man = json.loads(json.dumps(cm.manifest))

    def refused(mutate, code=ACL_ERROR_DESERIALIZE_MODEL, match=None):
        m = json.loads(json.dumps(man))
        mutate(m)
        with pytest.raises(ModelError, match=match) as ei:
            read_om(write_om(m, cm.weights))
        assert ei.value.code == code
    refused(lambda m: m["gears"][0]["steps"][0]["outputs"][0].__setitem__(1, 1 << 30), match="outside the region")
    refused(lambda m: m["gears"][0]["steps"][0]["inputs"][1].__setitem__(1, len(cm.weights)), match="outside")
    refused(lambda m: m["gears"][0]["steps"][0]["outputs"][0].__setitem__(3, "complex64"), match="dtype")
    refused(lambda m: m["gears"][1]["steps"][0].__setitem__("attrs", {"pads": [[1]]}), match="attrs")
    refused(lambda m: m.__setitem__("dynamic_batch", [1, 2, 3]), match="one gear per")
    refused(lambda m: m["weights"].__setitem__("size", 5), match="size")
    refused(lambda m: m["gears"][0]["steps"][0].__setitem__("kernel", "warp_drive"), code=ACL_ERROR_PARSE_MODEL,
            match="warp_drive")
    read_om(write_om(man, cm.weights))                                      # the unmodified copy loads


# ----------------------------------------------------------------------------------------- vnpu atc

def run_cli(capsys, *args):
    from runtime.cli import main
    rc = main(["atc", *args])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_atc_cli_failures_print_one_e_code_line(capsys, tmp_path):
    onnx_path = tmp_path / "cnn.onnx"
    onnx_path.write_bytes(cnn().SerializeToString())
    cases = [
        ((), "E10004: Value for --model is empty."),
        (("--model", str(onnx_path)), "E10004: Value for --output is empty."),
        (("--model", str(onnx_path), "--output", str(tmp_path / "m")), "E10007: --framework is required."),
        (("--model", str(onnx_path), "--framework", "3", "--output", str(tmp_path / "m")), "E10001:"),
        (("--model", str(tmp_path / "missing.onnx"), "--framework", "5", "--output", str(tmp_path / "m")),
         "E10001: Value"),
        (("--model", str(onnx_path), "--framework", "5", "--output", str(tmp_path / "no/dir/m"),
          "--input_shape", "x:1,3,16,16"), "does not exist"),
        (("--model", str(onnx_path), "--framework", "5", "--output", str(tmp_path / "m"), "--input_shape",
          "x:1,3,16,16", "--soc_version", "Ascend000"), "E10001: Value Ascend000 for parameter --soc_version"),
        (("--model", str(onnx_path), "--framework", "5", "--output", str(tmp_path / "m"),
          "--input_shape", "x:1,3;16,16"), "E10002"),
        (("--mode", "9"), "E10001: Value 9 for parameter --mode"),
        (("--mode", "6", "--om", str(onnx_path)), "E10003"),
        (("--log", "loud"), "E10010"),
        (("--model", str(onnx_path), "--framework", "5", "--output", str(tmp_path / "m"),
          "--dynamic_image_size", "224,224;448,448"), "E10004: Value for --input_shape is empty."),
        (("--model", str(onnx_path), "--framework", "5", "--output", str(tmp_path / "m"), "--input_shape",
          "x:1,3,-1,-1", "--dynamic_image_size", "16,16;8,8", "--dynamic_batch_size", "1,2"), "E10009: "),
        (("--model", str(onnx_path), "--framework", "5", "--output", str(tmp_path / "m"),
          "--dynamic_dims", "1;2"), "does not support dynamic dims"),
        (("--model", str(onnx_path), "--framework", "5", "--output", str(tmp_path / "m"),
          "--precision_mode", "force_fp16"), "--precision_mode"),
        (("--model", str(onnx_path), "--framework", "5", "--output", str(tmp_path / "m"),
          "--disable_reuse_memory", "2"), "E10006"),
    ]
    for args, want in cases:
        rc, out, err = run_cli(capsys, *args)
        assert rc == 255, args
        assert out.splitlines() == ["ATC start working now, please wait for a moment.",
                                    "ATC run failed, Please check the detail log, Try 'atc --help' for more "
                                    "information"], args
        assert len(err.splitlines()) == 1 and want in err, (args, err)
        assert "Traceback" not in err
    assert not (tmp_path / "m.om").exists()


def test_atc_cli_converts_and_reports(capsys, tmp_path):
    onnx_path = tmp_path / "cnn.onnx"
    onnx_path.write_bytes(cnn().SerializeToString())
    rc, out, err = run_cli(capsys, "--model", str(onnx_path), "--framework=5", "--output", str(tmp_path / "cnn"),
                           "--input_shape", "x:-1,3,16,16", "--dynamic_batch_size", "1,2", "--soc_version",
                           "Ascend310P3", "--log", "info")
    assert rc == 0 and err == ""
    lines = out.splitlines()
    assert lines[0] == "ATC start working now, please wait for a moment."
    assert lines[-1] == "ATC run success, welcome to the next use."
    assert any("launches 14 -> 9 after fusion" in ln for ln in lines)
    man, _ = read_om((tmp_path / "cnn.om").read_bytes())
    assert man["soc_version"] == "Ascend310P3" and man["dynamic_batch"] == [1, 2]
    rc, out, _ = run_cli(capsys, "--mode", "1", "--om", str(tmp_path / "cnn.om"), "--json", str(tmp_path / "m.json"))
    assert rc == 0 and json.loads((tmp_path / "m.json").read_text())["gears"][0]["batch"] == 1
    rc, out, _ = run_cli(capsys, "--mode", "6", "--om", str(tmp_path / "cnn.om"))
    assert rc == 0 and "gears [1, 2]" in out


def test_disable_reuse_memory_gives_every_buffer_its_own_bytes(capsys, tmp_path):
    onnx_path = tmp_path / "cnn.onnx"
    onnx_path.write_bytes(cnn().SerializeToString())
    sizes = {}
    for flag in ("0", "1"):
        rc, _, err = run_cli(capsys, "--model", str(onnx_path), "--framework", "5", "--output", str(tmp_path / flag),
                             "--input_shape", "x:2,3,16,16", "--disable_reuse_memory", flag,
                             "--precision_mode", "must_keep_origin_dtype")
        assert rc == 0, err
        man, _ = read_om((tmp_path / f"{flag}.om").read_bytes())
        sizes[flag] = man["gears"][0]["stats"]
    assert sizes["0"]["plan_peak_bytes"] < sizes["1"]["plan_peak_bytes"] == sizes["1"]["plan_no_reuse_bytes"]


def test_soc_version_selects_the_cost_model():
    fast = compile_model(cnn(), make_options("x:4,3,16,16", None, "Ascend910B3")).report["modeled_us"]
    slow = compile_model(cnn(), make_options("x:4,3,16,16", None, "Ascend310P3")).report["modeled_us"]
    assert slow > fast > 0


def test_atc_subprocess_real_atc_om_and_exit_code(tmp_path):
    """As a user runs it: a separate process, an ATC-built .om given to --mode 6."""
    om_path = tmp_path / "resnet.om"
    om_path.write_bytes(atc_header())
    p = subprocess.run([sys.executable, "-m", "runtime.cli", "atc", "--mode", "6", "--om", str(om_path)],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 255
    assert p.stdout.splitlines()[-1].startswith("ATC run failed")
    assert p.stderr.count("\n") == 1 and "E10003" in p.stderr and "Huawei's ATC" in p.stderr
