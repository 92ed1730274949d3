"""acl.op: single-operator execution from models compiled by ``vnpu atc --singleop``.

- ``vnpu atc --singleop`` (the real CLI, a subprocess) compiles tests/samples/acl_op_list.json -- ATC's
  op-list format, as the public samples ship it -- into one .om per operator, named as ATC names them;
- tests/samples/acl_op_sample.py, a program in the style of the public samples' single-operator ones,
  runs in a subprocess with ONLY its ``import acl`` line changed: Add, Cast + ArgMaxV2 with a constant
  input, BatchMatMul with attributes through a handle; its results equal numpy's;
- in-process (a local runtime): more operators against numpy, matching by descriptions / constants /
  attributes (an attribute at its default matches one not given), every refusal with its ACL code --
  each followed by a correct execution (the device keeps working) -- and ATC's refusals of bad op lists
  (exit 255, one E-code line).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from acl_checks import acl_session, ok
from conftest import installed, make_local_runtime
from onnx_models import assert_close
from runtime import acl
from runtime.atc.singleop import compile_op_list

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "tests" / "samples" / "acl_op_sample.py"
OP_LIST = ROOT / "tests" / "samples" / "acl_op_list.json"
ND, F32, F16, I32 = 2, 0, 1, 3
NORMAL_ONLY, H2D, D2H = 2, 1, 2


def atc(*args, cwd=ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "runtime.cli", "atc", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=300)


@pytest.fixture(scope="module")
def op_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("ops") / "op_models"
    p = atc(f"--singleop={OP_LIST}", f"--output={out}", "--soc_version=Ascend910B3")
    assert p.returncode == 0, p.stdout + p.stderr
    return out


@pytest.fixture(scope="module")
def more_ops(tmp_path_factory) -> Path:
    """Operators the sample does not use, compiled in-process."""
    ops = [
        _entry("SoftmaxV2", [("float", [3, 5])], [("float", [3, 5])], [("axes", "list_int", [-1])]),
        _entry("ReduceSum", [("float", [4, 6]), ("int32", [1], [1])], [("float", [4, 1])],
               [("keep_dims", "bool", True)]),
        _entry("Slice", [("float", [6, 8]), ("int32", [2], [1, 2]), ("int32", [2], [3, -1])], [("float", [3, 6])]),
        _entry("ConcatD", [("float", [2, 3]), ("float", [2, 5])], [("float", [2, 8])], [("concat_dim", "int", 1)]),
        _entry("MatMulV2", [("float", [5, 7]), ("float", [4, 7]), ("float", [4])], [("float", [5, 4])],
               [("transpose_x2", "bool", True)]),
        _entry("Relu", [("float", [10])], [("float", [10])]),
        _entry("BatchMatMul", [("float", [2, 4, 8]), ("float", [2, 8, 16])], [("float", [2, 4, 16])]),
    ]
    d = tmp_path_factory.mktemp("more") / "ops"
    (d.parent / "more.json").write_text(json.dumps(ops))
    compile_op_list(d.parent / "more.json", d / "nested" / "deeper")       # found two levels down
    return d


def _entry(op, ins, outs, attrs=()):
    def desc(t):
        d = {"format": "ND", "type": t[0], "shape": t[1]}
        if len(t) > 2:
            d.update(is_const=True, const_value=t[2])
        return d
    return {"op": op, "input_desc": [desc(t) for t in ins], "output_desc": [desc(t) for t in outs],
            "attr": [{"name": n, "type": ty, "value": v} for n, ty, v in attrs]}


@pytest.fixture(scope="module")
def rt():
    with installed(make_local_runtime(count=1, arena=64 << 20)) as r:
        yield r


@pytest.fixture
def ctx(rt, op_dir, more_ops):
    with acl_session():
        ok(acl.op.set_model_dir(str(op_dir)))
        ok(acl.op.set_model_dir(str(more_ops)))
        stream, ret = acl.rt.create_stream()
        ok(ret)
        yield stream


# ---------------------------------------------------------------------------------------------- helpers
class Io:
    """Descriptions and device buffers of one call, freed at the end of the test (acl.finalize)."""
    DT = {np.dtype(np.float32): F32, np.dtype(np.float16): F16, np.dtype(np.int32): I32}

    def desc(self, dtype, shape):
        return acl.create_tensor_desc(self.DT[np.dtype(dtype)], list(shape), ND)

    def buf(self, arr=None, dtype=None, shape=None):
        a = np.ascontiguousarray(arr) if arr is not None else np.zeros(shape, dtype)
        ptr, ret = acl.rt.malloc(max(a.nbytes, 1), NORMAL_ONLY)
        ok(ret)
        if arr is not None:
            data = a.tobytes()
            ok(acl.rt.memcpy(ptr, a.nbytes, acl.util.bytes_to_ptr(data), a.nbytes, H2D))
        return acl.create_data_buffer(ptr, a.nbytes)

    def read(self, buf, dtype, shape):
        n = acl.get_data_buffer_size_v2(buf)
        host = np.zeros(shape, dtype)
        ok(acl.rt.memcpy(acl.util.numpy_to_ptr(host), n, acl.get_data_buffer_addr(buf), n, D2H))
        return host


def run_op(stream, op, arrays, out_dtype, out_shape, attrs=None, consts=None):
    """execute_v2 of ``op`` on ``arrays`` (``consts``: index -> array set with set_tensor_const and passed
    as a null buffer) -> (ret, output)."""
    io = Io()
    consts = consts or {}
    descs, bufs = [], []
    for i, a in enumerate(arrays):
        d = io.desc(a.dtype, a.shape)
        if i in consts:
            data = np.ascontiguousarray(a).tobytes()
            ok(acl.set_tensor_const(d, acl.util.bytes_to_ptr(data), len(data)))
            bufs.append(acl.create_data_buffer(0, 0))
        else:
            bufs.append(io.buf(a))
        descs.append(d)
    dy = io.desc(out_dtype, out_shape)
    y = io.buf(dtype=out_dtype, shape=out_shape)
    attr = acl.op.create_attr()
    for name, (kind, v) in (attrs or {}).items():
        ok(getattr(acl.op, f"set_attr_{kind}")(attr, name, v))
    ret = acl.op.execute_v2(op, descs, bufs, [dy], [y], attr, stream)
    acl.op.destroy_attr(attr)
    if ret != 0:
        return ret, None
    ok(acl.rt.synchronize_stream(stream))
    return ret, io.read(y, out_dtype, out_shape)


def add_works(stream) -> None:
    """A correct execution after a refusal: the device and the loaded models keep working."""
    rng = np.random.default_rng(5)
    a, b = (rng.integers(-1000, 1000, (8, 16)).astype(np.int32) for _ in range(2))
    ret, y = run_op(stream, "Add", [a, b], np.int32, (8, 16))
    assert ret == 0
    np.testing.assert_array_equal(y, a + b)


# ---------------------------------------------------------------------------------------------- atc + sample
def test_atc_names_each_operator_model_as_atc_does(op_dir):
    names = sorted(p.name for p in op_dir.iterdir())
    assert names == ["0_Add_3_2_8_16_3_2_8_16_3_2_8_16.om", "1_Cast_0_2_1000_1_2_1000.om",
                     "2_ArgMaxV2_1_2_1000_3_2_1_3_2_1.om", "3_BatchMatMul_0_2_2_4_8_0_2_2_16_8_0_2_2_4_16.om"]


def test_sample_program_runs_single_operators_with_only_its_import_changed(tmp_path, op_dir):
    text = SAMPLE.read_text()
    assert text.splitlines().count("import acl") == 1 and "runtime" not in text
    patched = text.replace("\nimport acl\n", "\nfrom runtime import acl\n")
    script = tmp_path / "acl_op_sample.py"
    script.write_text(patched)
    rng = np.random.default_rng(7)
    feeds = {"a": rng.integers(0, 100, (8, 16)).astype(np.int32), "b": rng.integers(0, 100, (8, 16)).astype(np.int32),
             "scores": rng.standard_normal(1000).astype(np.float32),
             "x1": rng.standard_normal((2, 4, 8)).astype(np.float32),
             "x2": rng.standard_normal((2, 16, 8)).astype(np.float32),
             "x1_2": rng.standard_normal((2, 4, 8)).astype(np.float32),
             "x2_2": rng.standard_normal((2, 16, 8)).astype(np.float32)}
    np.savez(tmp_path / "in.npz", **feeds)
    env = dict(os.environ, VNPU_DEVICES="1", VNPU_HBM_BYTES=str(64 << 20), OPENBLAS_NUM_THREADS="1",
               PYTHONPATH=str(ROOT))
    env.pop("VNPU_BACKEND", None)
    p = subprocess.run([sys.executable, str(script), f"--model-dir={op_dir}", f"--inputs={tmp_path / 'in.npz'}",
                        f"--output={tmp_path / 'out.npz'}"], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    with np.load(tmp_path / "out.npz") as f:
        out = {k: f[k] for k in f.files}
    np.testing.assert_array_equal(out["add"], feeds["a"] + feeds["b"])
    half = feeds["scores"].astype(np.float16)
    np.testing.assert_array_equal(out["half"], half)
    assert out["label"].tolist() == [int(np.argmax(half))]
    assert f"label of classification result is:{int(np.argmax(half))}" in p.stdout
    for i, (x1, x2) in enumerate(((feeds["x1"], feeds["x2"]), (feeds["x1_2"], feeds["x2_2"]))):
        assert_close(out["bmm"][i], x1 @ np.swapaxes(x2, 1, 2), k=8, what=f"BatchMatMul adj_x2, run {i}")


# ---------------------------------------------------------------------------------------------- in-process
def test_more_operators_match_numpy(ctx):
    rng = np.random.default_rng(11)
    x = rng.standard_normal((3, 5)).astype(np.float32)
    ret, y = run_op(ctx, "SoftmaxV2", [x], np.float32, (3, 5), attrs={"axes": ("list_int", [-1])})
    e = np.exp(x - x.max(-1, keepdims=True))
    np.testing.assert_allclose(y, e / e.sum(-1, keepdims=True), rtol=1e-6, atol=1e-7)
    x = rng.standard_normal((4, 6)).astype(np.float32)
    ret, y = run_op(ctx, "ReduceSum", [x, np.array([1], np.int32)], np.float32, (4, 1),
                    attrs={"keep_dims": ("bool", True)}, consts={1: True})
    assert_close(y, x.sum(1, keepdims=True), k=6)
    x = rng.standard_normal((6, 8)).astype(np.float32)
    ret, y = run_op(ctx, "Slice", [x, np.array([1, 2], np.int32), np.array([3, -1], np.int32)], np.float32, (3, 6),
                    consts={1: True, 2: True})
    np.testing.assert_array_equal(y, x[1:4, 2:])
    a, b = rng.standard_normal((2, 3)).astype(np.float32), rng.standard_normal((2, 5)).astype(np.float32)
    ret, y = run_op(ctx, "ConcatD", [a, b], np.float32, (2, 8), attrs={"concat_dim": ("int", 1)})
    np.testing.assert_array_equal(y, np.concatenate([a, b], 1))
    a, w, bias = (rng.standard_normal(s).astype(np.float32) for s in ((5, 7), (4, 7), (4,)))
    ret, y = run_op(ctx, "MatMulV2", [a, w, bias], np.float32, (5, 4), attrs={"transpose_x2": ("bool", True)})
    assert_close(y, a @ w.T + bias, k=7)
    x = rng.standard_normal(10).astype(np.float32)
    ret, y = run_op(ctx, "Relu", [x], np.float32, (10,))
    np.testing.assert_array_equal(y, np.maximum(x, 0))


def test_an_attribute_at_its_default_matches_a_model_compiled_without_it(ctx):
    rng = np.random.default_rng(3)
    a, b = rng.standard_normal((2, 4, 8)).astype(np.float32), rng.standard_normal((2, 8, 16)).astype(np.float32)
    for attrs in ({}, {"adj_x1": ("bool", False), "adj_x2": ("bool", False)}):
        ret, y = run_op(ctx, "BatchMatMul", [a, b], np.float32, (2, 4, 16), attrs=attrs)
        assert ret == 0
        assert_close(y, a @ b, k=8)
    # adj_x2=True picks the other compiled model (x2 given as [2, 16, 8])
    b2 = rng.standard_normal((2, 16, 8)).astype(np.float32)
    ret, y = run_op(ctx, "BatchMatMul", [a, b2], np.float32, (2, 4, 16), attrs={"adj_x2": ("bool", True)})
    assert_close(y, a @ np.swapaxes(b2, 1, 2), k=8)


@pytest.mark.parametrize("case, code", [
    ("unknown type", 100024), ("input shape", 100021), ("input dtype", 100021), ("output shape", 100022),
    ("attribute", 100023), ("const value", 100021), ("const missing", 100021)])
def test_a_call_no_model_matches_is_refused_with_its_code(ctx, case, code):
    rng = np.random.default_rng(1)
    a, b = rng.integers(0, 9, (8, 16)).astype(np.int32), rng.integers(0, 9, (8, 16)).astype(np.int32)
    h16 = rng.standard_normal(1000).astype(np.float16)
    call = {
        "unknown type": lambda: run_op(ctx, "Mish", [a], np.int32, (8, 16)),
        "input shape": lambda: run_op(ctx, "Add", [a[:4], b[:4]], np.int32, (4, 16)),
        "input dtype": lambda: run_op(ctx, "Add", [a.astype(np.float32), b.astype(np.float32)], np.float32, (8, 16)),
        "output shape": lambda: run_op(ctx, "Add", [a, b], np.int32, (16, 8)),
        "attribute": lambda: run_op(ctx, "BatchMatMul", [a.astype(np.float32).reshape(2, 4, 16)[..., :8],
                                                         b.astype(np.float32).reshape(2, 8, 8).repeat(2, -1)],
                                    np.float32, (2, 4, 16), attrs={"adj_x1": ("bool", True)}),
        "const value": lambda: run_op(ctx, "ArgMaxV2", [h16, np.array([1], np.int32)], np.int32, (1,),
                                      consts={1: True}),
        "const missing": lambda: run_op(ctx, "ArgMaxV2", [h16, np.array([0], np.int32)], np.int32, (1,)),
    }[case]
    ret, _ = call()
    assert ret == code, acl.get_recent_err_msg()
    assert acl.get_recent_err_msg().startswith("acl.op.execute_v2:")
    add_works(ctx)


def test_bad_arguments_and_files_get_their_codes_and_lose_nothing(ctx, tmp_path):
    assert acl.op.set_model_dir(str(tmp_path / "missing")) == 100003
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "0_Add.om").write_bytes(b"not a model at all")
    assert acl.op.set_model_dir(str(bad)) != 0
    assert acl.op.set_model_dir(None) == 100000
    attr = acl.op.create_attr()
    assert acl.op.set_attr_bool(attr, "", True) == 100000
    assert acl.op.set_attr_int(attr, "n", "three") == 100000
    assert acl.op.set_attr_list_int(attr, "axes", 3) == 100000
    assert acl.op.set_attr_bool(attr + 999, "x", True) == 100000             # unknown attribute set
    d = acl.create_tensor_desc(I32, [2], ND)
    four = bytes(4)
    assert acl.set_tensor_const(d, acl.util.bytes_to_ptr(four), 4) == 100000  # 2 x int32 is 8 bytes
    io = Io()
    a = np.ones((8, 16), np.int32)
    da, dy = io.desc(np.int32, (8, 16)), io.desc(np.int32, (8, 16))
    y = io.buf(dtype=np.int32, shape=(8, 16))
    assert acl.op.execute_v2("Add", [da, da], [io.buf(a)], [dy], [y], attr, ctx) == 100000   # one buffer short
    small = acl.create_data_buffer(acl.get_data_buffer_addr(y), 16)
    assert acl.op.execute_v2("Add", [da, da], [io.buf(a), io.buf(a)], [dy], [small], attr, ctx) != 0
    assert acl.op.execute_with_handle(12345, [], [], ctx) == 100000
    handle, ret = acl.op.create_handle("Add", [da, da], [dy], 0)             # a null attr: no attributes
    ok(ret)
    ok(acl.op.execute_with_handle(handle, [io.buf(a), io.buf(a + 1)], [y], ctx))
    ok(acl.rt.synchronize_stream(ctx))
    np.testing.assert_array_equal(io.read(y, np.int32, (8, 16)), 2 * a + 1)
    acl.op.destroy_handle(handle)
    assert acl.op.execute_with_handle(handle, [io.buf(a), io.buf(a)], [y], ctx) == 100000
    acl.op.destroy_attr(attr)
    add_works(ctx)


def test_cast_handle_and_finalize_forgets_the_models(ctx):
    io = Io()
    x = np.linspace(-3, 3, 1000, dtype=np.float32)
    d32, d16 = io.desc(np.float32, (1000,)), io.desc(np.float16, (1000,))
    handle, ret = acl.op.create_handle_for_cast(d32, d16, 0)
    ok(ret)
    y = io.buf(dtype=np.float16, shape=(1000,))
    ok(acl.op.execute_with_handle(handle, [io.buf(x)], [y], ctx))
    ok(acl.rt.synchronize_stream(ctx))
    np.testing.assert_array_equal(io.read(y, np.float16, (1000,)), x.astype(np.float16))
    di = io.desc(np.int32, (1000,))
    assert acl.op.create_handle_for_cast(d32, di, 0)[1] == 100022           # no Cast with an int32 output
    ok(acl.finalize())
    ok(acl.init())
    ok(acl.rt.set_device(0))
    d32, d16 = io.desc(np.float32, (1000,)), io.desc(np.float16, (1000,))
    assert acl.op.create_handle_for_cast(d32, d16, 0)[1] == 100024           # set_model_dir again after init


@pytest.mark.parametrize("entry, ecode", [
    ('[{"op": "Mish", "input_desc": [], "output_desc": []}]', "E10055"),
    ('[{"op": "Add", "input_desc": [{"format": "ND", "shape": [2], "type": "int32"}, '
     '{"format": "ND", "shape": [2], "type": "int32"}], "output_desc": [{"format": "ND", "shape": [3], '
     '"type": "int32"}]}]', "E10001"),
    ('[{"op": "Add", "input_desc": [{"format": "ND", "shape": [2], "type": "complex"}]}]', "E10001"),
    ("{not json", "E10001"),
    ('[{"op": "ArgMaxV2", "input_desc": [{"format": "ND", "shape": [4], "type": "float"}, '
     '{"format": "ND", "shape": [1], "type": "int32"}], "output_desc": [{"format": "ND", "shape": [1], '
     '"type": "int32"}]}]', "E10001"),
])
def test_atc_refuses_a_bad_op_list_with_one_line(tmp_path, capsys, entry, ecode):
    from runtime.cli import main
    f = tmp_path / "ops.json"
    f.write_text(entry)
    assert main(["atc", f"--singleop={f}", f"--output={tmp_path / 'out'}"]) == 255
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(ecode + ":"), err
    assert "Traceback" not in err and not (tmp_path / "out").exists()
