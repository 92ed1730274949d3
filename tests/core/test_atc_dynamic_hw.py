"""Dynamic image size: ``vnpu atc --dynamic_image_size`` and acl.mdl's ``set_dynamic_hw_size`` /
``get_dynamic_hw`` on the models it makes.

A small CNN (conv, relu, max pool -> a feature map whose H and W follow the gear; global pool, Gemm ->
logits) is compiled with three NON-square gears (a height and width swapped anywhere would show) and run
at each gear through the pyACL calls an application makes: buffers sized once by the description (the
largest gear), the gear chosen by ``set_dynamic_hw_size``, the current output dims read back; every
output agrees with onnxruntime on the same input at that size (float32 tolerance of the reductions).
Each refusal has its ATC E-code (one line, exit 255 from the CLI) or its ACL/GE code, and the device keeps
working after it.  A static AIPP compiled per gear turns each gear's RGB picture bytes into the model
input; tests/samples/acl_dynamic_hw_sample.py (in the style of the public resnet50_imagenet_dynamic_hw
sample) runs it with only its ``import acl`` line changed.
"""
from __future__ import annotations

import os
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from acl_checks import acl_session, ok
from conftest import installed, make_local_runtime
from devices.errors import ACL_ERROR_GE_PARAM_INVALID, AtcError
from onnx_models import assert_close, cnn, hw_cnn, ort_run
from runtime import acl
from runtime.atc import DYNAMIC_INPUT_NAME, compile_model, make_options, read_om
from runtime.atc.hostrun import HostRun
from runtime.cli import main

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "tests" / "samples" / "acl_dynamic_hw_sample.py"
GEARS = ((8, 12), (16, 16), (12, 24))
GEAR_TEXT = ";".join(f"{h},{w}" for h, w in GEARS)
BIG = (12, 24)                                   # the most pixels: the buffers' size
K, DEPTH = 80, 3                                 # longest reduction (the pool of 6x12) and chained reductions
NORMAL_ONLY, H2D, D2H = 2, 1, 2
MEAN, VAR = (124.0, 117.0, 104.0), (0.0171, 0.0175, 0.0174)


def image(h: int, w: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((1, 3, h, w)).astype(np.float32)


@pytest.fixture(scope="module")
def model():
    return hw_cnn(seed=4)


@pytest.fixture(scope="module")
def compiled(model):
    return compile_model(model, make_options("x:1,3,-1,-1", dynamic_image_size=GEAR_TEXT))


@pytest.fixture(scope="module")
def om_path(compiled, tmp_path_factory):
    return compiled.save(tmp_path_factory.mktemp("hw") / "hw.om")


@pytest.fixture(scope="module")
def rt():
    with installed(make_local_runtime(count=1, arena=64 << 20)) as r:
        yield r


@pytest.fixture
def ctx(rt):
    with acl_session():
        yield


# ---------------------------------------------------------------------------------------------- options
@pytest.mark.parametrize("shape,gears,ecode", [
    ("x:1,3,-1,-1", "16,16", "E10035"),
    ("x:1,3,-1,-1", ";".join(f"{i},{i}" for i in range(1, 102)), "E10036"),
    ("x:1,3,-1,-1", "0,16;8,8", "E10038"),
    ("x:1,3,-1,-1", "8,8;16,16;8,8", "E10039"),
    ("x:1,3,-1,-1", "8,8,8;4,4", "E10020"),          # a gear without exactly two values
    ("x:1,3,-1,-1", "8;4", "E10020"),
    ("x:1,3,-1,-1", "8,;4,4", "E10020"),
    ("x:1,3,-1,-1", "8,x;4,4", "E10003"),            # characters other than digits , ;
    ("x:1,3,-1,-1", "-8,8;4,4", "E10003"),
    ("x:1,3,-1,16", "8,8;4,4", "E10019"),            # only one of H, W dynamic
    ("x:-1,3,-1,-1", "8,8;4,4", "E10019"),           # the batch too
    ("x:1,-1", "8,8;4,4", "E10019"),                 # not 4-D
    ("x:1,3,8,8", "8,8;4,4", "E10019"),              # no -1 at all
    (None, "8,8;4,4", "E10004"),                     # no --input_shape
])
def test_image_size_options_are_refused_with_atc_codes(shape, gears, ecode):
    with pytest.raises(AtcError) as ei:
        make_options(shape, dynamic_image_size=gears)
    assert ei.value.ecode == ecode and ei.value.code == ACL_ERROR_GE_PARAM_INVALID
    assert ei.value.line.startswith(ecode + ": ") and "\n" not in ei.value.line


def test_image_size_options_parse_and_exclude_batch_gears():
    o = make_options("x:1,3,-1,-1", dynamic_image_size=" 8,12; 16,16 ;12,24;")        # trailing ';' as ATC
    assert o.dynamic_hw == GEARS and o.dynamic_batch == () and o.gears == list(GEARS)
    assert make_options("x:1,3,-1,-1", dynamic_image_size=[(8, 12), (16, 16)]).dynamic_hw == ((8, 12), (16, 16))
    with pytest.raises(AtcError) as ei:
        make_options("x:1,3,-1,-1", "1,2", dynamic_image_size="8,8;4,4")
    assert ei.value.ecode == "E10009"
    with pytest.raises(AtcError) as ei:                        # -1 on H and W without gears
        compile_model(hw_cnn(), make_options("x:1,3,-1,-1"))
    assert ei.value.ecode == "E10011"


# ---------------------------------------------------------------------------------------------- the model
def test_manifest_gears_and_file_format(compiled, om_path, model):
    man, _ = read_om(om_path.read_bytes())
    assert man["dynamic_hw"] == [list(g) for g in GEARS] and man["dynamic_batch"] == []
    assert [g["hw"] for g in man["gears"]] == [list(g) for g in GEARS] and all(g["batch"] is None
                                                                              for g in man["gears"])
    assert [(i["name"], i["dims"]) for i in man["inputs"]] == [("x", [1, 3, -1, -1]), (DYNAMIC_INPUT_NAME, [2])]
    assert [o["dims"] for o in man["outputs"]] == [[1, 4, -1, -1], [1, 5]]
    assert [g["inputs"][0][2] for g in man["gears"]] == [[1, 3, h, w] for h, w in GEARS]
    assert struct.unpack_from("<H", om_path.read_bytes(), 8)[0] == 2 == man["version"]   # format 2: image sizes
    static = compile_model(cnn(batch=1)).to_bytes()
    assert struct.unpack_from("<H", static, 8)[0] == 1                                   # others stay format 1


def test_each_gear_matches_onnxruntime_on_the_host(compiled, model):
    for i, (h, w) in enumerate(GEARS):
        x = image(h, w, seed=i)
        got = HostRun(compiled.manifest, compiled.weights, (h, w)).run([x])
        ref = ort_run(model, {"x": x})
        assert got[0].shape == (1, 4, h // 2, w // 2)
        for g, r in zip(got, ref):
            assert_close(g, r, k=K, depth=DEPTH, what=f"{h}x{w}")


def test_every_input_with_dynamic_h_and_w_takes_the_gear():
    """ATC's two-input example: each input with -1 H and W gets the same (h, w)."""
    from onnx import TensorProto, helper
    x, y = (helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, c, "H", "W"]) for n, c in (("x", 3), ("y", 1)))
    out = helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, 3, "H", "W"])
    m = helper.make_model(helper.make_graph([helper.make_node("Mul", ["x", "y"], ["out"])], "two", [x, y], [out]),
                          opset_imports=[helper.make_opsetid("", 13)])
    cm = compile_model(m, make_options("x:1,3,-1,-1;y:1,1,-1,-1", dynamic_image_size="2,6;6,2"))
    assert [i["dims"] for i in cm.manifest["inputs"]] == [[1, 3, -1, -1], [1, 1, -1, -1], [2]]
    for h, w in ((2, 6), (6, 2)):
        a, b = image(h, w, seed=1), image(h, w, seed=2)[:, :1]
        np.testing.assert_array_equal(HostRun(cm.manifest, cm.weights, (h, w)).run([a, b])[0], a * b)


# ---------------------------------------------------------------------------------------------- acl.mdl
def _malloc(n: int) -> int:
    ptr, ret = acl.rt.malloc(n, NORMAL_ONLY)
    ok(ret)
    return ptr


def _dataset(bufs: list[tuple[int, int]]) -> int:
    ds = acl.mdl.create_dataset()
    for ptr, n in bufs:
        ok(acl.mdl.add_dataset_buffer(ds, acl.create_data_buffer(ptr, n))[1])
    return ds


class IO:
    """The model's buffers, each of the size the description gives (the largest gear), in two datasets."""

    def __init__(self, desc):
        self.desc = desc
        self.ins = [(_malloc(n), n) for n in (acl.mdl.get_input_size_by_index(desc, i)
                                              for i in range(acl.mdl.get_num_inputs(desc)))]
        self.outs = [(_malloc(n), n) for n in (acl.mdl.get_output_size_by_index(desc, i)
                                               for i in range(acl.mdl.get_num_outputs(desc)))]
        self.in_ds, self.out_ds = _dataset(self.ins), _dataset(self.outs)

    def put(self, x: np.ndarray) -> None:
        data = x.tobytes()
        ok(acl.rt.memcpy(self.ins[0][0], self.ins[0][1], acl.util.bytes_to_ptr(data), len(data), H2D))

    def outputs(self) -> list[np.ndarray]:
        res = []
        for i, (ptr, _) in enumerate(self.outs):
            shape = tuple(ok(acl.mdl.get_cur_output_dims(self.desc, i))["dims"])
            host = np.zeros(shape, np.float32)
            ok(acl.rt.memcpy(acl.util.numpy_to_ptr(host), host.nbytes, ptr, host.nbytes, D2H))
            res.append(host)
        return res


def run_gear(mid, io: IO, model, h: int, w: int, seed: int) -> None:
    x = image(h, w, seed)
    io.put(x)
    ok(acl.mdl.set_dynamic_hw_size(mid, io.in_ds, 1, h, w))
    ok(acl.mdl.execute(mid, io.in_ds, io.out_ds))
    got, ref = io.outputs(), ort_run(model, {"x": x})
    assert [g.shape for g in got] == [(1, 4, h // 2, w // 2), (1, 5)]
    for g, r in zip(got, ref):
        assert_close(g, r, k=K, depth=DEPTH, what=f"{h}x{w}")


@pytest.fixture
def loaded(ctx, om_path):
    mid = ok(acl.mdl.load_from_file(str(om_path)))
    desc = acl.mdl.create_desc()
    ok(acl.mdl.get_desc(desc, mid))
    return mid, desc, IO(desc)


def test_description_and_every_gear_through_acl(loaded, model):
    mid, desc, io = loaded
    assert ok(acl.mdl.get_dynamic_hw(desc, -1)) == {"hwCount": 3, "hw": [list(g) for g in GEARS]}
    assert ok(acl.mdl.get_dynamic_batch(desc)) == {"batchCount": 0, "batch": []}
    assert ok(acl.mdl.get_input_index_by_name(desc, DYNAMIC_INPUT_NAME)) == 1
    assert ok(acl.mdl.get_input_dims(desc, 0))["dims"] == [1, 3, -1, -1]
    assert ok(acl.mdl.get_input_dims(desc, 1))["dims"] == [2]
    assert [acl.mdl.get_input_size_by_index(desc, i) for i in range(2)] == [3 * BIG[0] * BIG[1] * 4, 16]
    assert ok(acl.mdl.get_output_dims(desc, 0))["dims"] == [1, 4, BIG[0] // 2, BIG[1] // 2]
    assert acl.mdl.get_output_size_by_index(desc, 0) == 4 * (BIG[0] // 2) * (BIG[1] // 2) * 4
    for seed, (h, w) in enumerate([(16, 16), (8, 12), (12, 24), (8, 12)]):        # back and forth
        run_gear(mid, io, model, h, w, seed)
    ok(acl.mdl.set_dynamic_hw_size(mid, io.in_ds, 1, 16, 16))                 # the current dims follow the set
    assert ok(acl.mdl.get_cur_output_dims(desc, 0))["dims"] == [1, 4, 8, 8]
    ok(acl.mdl.unload(mid))


def test_refusals_have_their_codes_and_the_device_keeps_working(loaded, model, tmp_path):
    mid, desc, io = loaded
    short = _dataset([io.ins[0], (_malloc(4), 4)])                            # a 4-byte gear buffer
    null = _dataset([io.ins[0], (0, 16)])
    host_ptr, ret = acl.rt.malloc_host(16)
    ok(ret)
    on_host = _dataset([io.ins[0], (host_ptr, 16)])
    batch_om = tmp_path / "batch.om"
    compile_model(cnn(), make_options("x:-1,3,16,16", "1,2")).save(batch_om)
    batch_id = ok(acl.mdl.load_from_file(str(batch_om)))
    batch_desc = acl.mdl.create_desc()
    ok(acl.mdl.get_desc(batch_desc, batch_id))
    batch_ins = _dataset([(_malloc(2 * 3 * 16 * 16 * 4), 2 * 3 * 16 * 16 * 4), (_malloc(8), 8)])
    cases = {
        "not a gear": (lambda: acl.mdl.set_dynamic_hw_size(mid, io.in_ds, 1, 10, 10),
                       acl.ACL_ERROR_GE_DYNAMIC_BATCH_SIZE_INVALID),
        "height and width swapped": (lambda: acl.mdl.set_dynamic_hw_size(mid, io.in_ds, 1, 12, 8),
                                     acl.ACL_ERROR_GE_DYNAMIC_BATCH_SIZE_INVALID),
        "height 0": (lambda: acl.mdl.set_dynamic_hw_size(mid, io.in_ds, 1, 0, 12), acl.ACL_ERROR_INVALID_PARAM),
        "index out of range": (lambda: acl.mdl.set_dynamic_hw_size(mid, io.in_ds, 2, 8, 12),
                               acl.ACL_ERROR_INVALID_PARAM),
        "index of the image input": (lambda: acl.mdl.set_dynamic_hw_size(mid, io.in_ds, 0, 8, 12),
                                     acl.ACL_ERROR_INVALID_PARAM),
        "null gear buffer": (lambda: acl.mdl.set_dynamic_hw_size(mid, null, 1, 8, 12), acl.ACL_ERROR_INVALID_PARAM),
        "gear buffer in host memory": (lambda: acl.mdl.set_dynamic_hw_size(mid, on_host, 1, 8, 12),
                                       acl.ACL_ERROR_GE_DYNAMIC_INPUT_ADDR_INVALID),
        "4-byte gear buffer": (lambda: acl.mdl.set_dynamic_hw_size(mid, short, 1, 8, 12),
                               acl.ACL_ERROR_GE_DYNAMIC_INPUT_LENGTH_INVALID),
        "a batch on an image-size model": (lambda: acl.mdl.set_dynamic_batch_size(mid, io.in_ds, 1, 1),
                                           acl.ACL_ERROR_GE_DYNAMIC_BATCH_SIZE_INVALID),
        "an image size on a batch model": (lambda: acl.mdl.set_dynamic_hw_size(batch_id, batch_ins, 1, 16, 16),
                                           acl.ACL_ERROR_GE_DYNAMIC_BATCH_SIZE_INVALID),
        "unknown model": (lambda: acl.mdl.set_dynamic_hw_size(987654, io.in_ds, 1, 8, 12),
                          acl.ACL_ERROR_GE_EXEC_MODEL_ID_INVALID),
    }
    for what, (call, code) in cases.items():
        assert call() == code, (what, acl.get_recent_err_msg())
        run_gear(mid, io, model, 8, 12, seed=5)                                 # nothing changed, it still runs
    assert ok(acl.mdl.get_dynamic_hw(batch_desc, -1)) == {"hwCount": 0, "hw": []}
    # a gear buffer holding no gear, an input buffer smaller than the gear or larger than the largest
    raw = np.array([10, 10], "<u8").tobytes()
    ok(acl.rt.memcpy(io.ins[1][0], 16, acl.util.bytes_to_ptr(raw), 16, H2D))
    assert acl.mdl.execute(mid, io.in_ds, io.out_ds) == acl.ACL_ERROR_GE_DYNAMIC_BATCH_SIZE_INVALID
    ok(acl.mdl.set_dynamic_hw_size(mid, io.in_ds, 1, 12, 24))
    small = _dataset([(io.ins[0][0], 3 * 8 * 12 * 4), io.ins[1]])
    assert acl.mdl.execute(mid, small, io.out_ds) == acl.ACL_ERROR_GE_PARAM_INVALID
    big = _dataset([(_malloc(io.ins[0][1] + 64), io.ins[0][1] + 64), io.ins[1]])
    assert acl.mdl.execute(mid, big, io.out_ds) == acl.ACL_ERROR_GE_PARAM_INVALID
    run_gear(mid, io, model, 16, 16, seed=6)
    # 32-bit values in an 8..15-byte gear buffer, as GE writes them there
    buf8 = _malloc(8)
    ds8 = _dataset([io.ins[0], (buf8, 8)])
    x = image(12, 24, seed=7)
    io.put(x)
    ok(acl.mdl.set_dynamic_hw_size(mid, ds8, 1, 12, 24))
    raw = np.zeros(8, np.uint8)
    ok(acl.rt.memcpy(acl.util.numpy_to_ptr(raw), 8, buf8, 8, D2H))
    assert raw.view("<u4").tolist() == [12, 24]
    ok(acl.mdl.execute(mid, ds8, io.out_ds))
    assert_close(io.outputs()[1], ort_run(model, {"x": x})[1], k=K, depth=DEPTH)
    ok(acl.rt.free_host(host_ptr))
    ok(acl.mdl.unload(batch_id))
    ok(acl.mdl.unload(mid))


# ---------------------------------------------------------------------------------------------- AIPP
def aipp_cfg(tmp_path, extra: str = "", mode: str = "static") -> str:
    body = f"aipp_op {{\n aipp_mode : {mode}\n"
    if mode == "static":
        body += " input_format : RGB888_U8\n src_image_size_w : 0\n src_image_size_h : 0\n"
        body += "".join(f" mean_chn_{i} : {MEAN[i]:g}\n var_reci_chn_{i} : {VAR[i]}\n" for i in range(3))
    else:
        body += " max_src_image_size : 2000\n"
    p = tmp_path / "aipp.cfg"
    p.write_text(body + extra + "}\n")
    return str(p)


def normalised(rgb_hwc: np.ndarray) -> np.ndarray:
    chw = np.moveaxis(rgb_hwc.astype(np.float32), 2, 0)
    return ((chw - np.array(MEAN, np.float32)[:, None, None]) * np.array(VAR, np.float32)[:, None, None])[None]


@pytest.mark.parametrize("extra,mode,ecode,words", [
    ("", "dynamic", "E10055", "dynamic AIPP"),
    (" src_image_size_w : 12\n", "static", "E10001", "src_image_size_w"),
    (" crop : true\n crop_size_w : 4\n crop_size_h : 4\n", "static", "E10001", "crop and padding"),
])
def test_aipp_with_image_sizes_is_static_aipp_of_the_gears_size(tmp_path, extra, mode, ecode, words):
    """CANN: src_image_size 0 and no crop or padding; vnpu has no dynamic AIPP with image-size gears."""
    with pytest.raises(AtcError) as ei:
        compile_model(hw_cnn(), make_options("x:1,3,-1,-1", insert_op_conf=aipp_cfg(tmp_path, extra, mode),
                                             dynamic_image_size=GEAR_TEXT))
    assert ei.value.ecode == ecode and words in ei.value.line


def test_sample_program_runs_an_aipp_model_at_every_gear(tmp_path, model):
    """vnpu atc from the command line (the sample's flags, a stand-in model), then the sample program with
    only its import line changed; each gear's outputs equal the picture normalised by numpy and run by
    onnxruntime."""
    onnx_path = tmp_path / "hw.onnx"
    onnx_path.write_bytes(model.SerializeToString())
    out = tmp_path / "hw_aipp"
    assert main(["atc", f"--model={onnx_path}", "--framework=5", f"--output={out}", "--soc_version=Ascend910B3",
                 "--input_shape=x:1,3,-1,-1", f"--dynamic_image_size={GEAR_TEXT}",
                 f"--insert_op_conf={aipp_cfg(tmp_path)}"]) == 0
    man, _ = read_om(Path(f"{out}.om").read_bytes())
    assert man["inputs"][0]["dtype"] == "uint8" and man["inputs"][0]["dims"] == [1, -1]
    rng = np.random.default_rng(9)
    pictures = {f"{h}x{w}": rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for h, w in GEARS}
    sizes = ["16x16", "8x12", "12x24", "8x12"]
    text = SAMPLE.read_text()
    patched = text.replace("\nimport acl\n", "\nfrom runtime import acl\n")
    assert [(a, b) for a, b in zip(text.splitlines(), patched.splitlines()) if a != b] == \
        [("import acl", "from runtime import acl")] and "runtime" not in text
    script = tmp_path / "acl_dynamic_hw_sample.py"
    script.write_text(patched)
    np.savez(tmp_path / "in.npz", **pictures)
    env = dict(os.environ, VNPU_DEVICES="1", VNPU_HBM_BYTES=str(256 << 20), OPENBLAS_NUM_THREADS="1",
               PYTHONPATH=str(ROOT))
    env.pop("VNPU_BACKEND", None)
    p = subprocess.run([sys.executable, str(script), f"--model={out}.om", f"--inputs={tmp_path / 'in.npz'}",
                        f"--sizes={','.join(sizes)}", f"--output={tmp_path / 'out.npz'}"], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "Resources released successfully." in p.stdout
    with np.load(tmp_path / "out.npz") as f:
        got = {k: f[k] for k in f.files}
    for size in sizes:
        h, w = (int(v) for v in size.split("x"))
        ref = ort_run(model, {"x": normalised(pictures[size])})
        assert got[f"{size}/0"].shape == (1, 4, h // 2, w // 2)
        for i, r in enumerate(ref):
            assert_close(got[f"{size}/{i}"], r, k=K, depth=DEPTH, what=size)


# ---------------------------------------------------------------------------------------------- vnpu atc
def test_atc_cli_refusals_are_one_line(tmp_path, capsys, model):
    onnx_path = tmp_path / "hw.onnx"
    onnx_path.write_bytes(model.SerializeToString())
    base = ["atc", f"--model={onnx_path}", "--framework=5", f"--output={tmp_path / 'm'}"]
    cases = [
        (["--input_shape=x:1,3,-1,-1", "--dynamic_image_size=16,16,16;8,8"], "E10020: Value 16,16,16;8,8"),
        (["--input_shape=x:1,3,-1,8", "--dynamic_image_size=16,16;8,8"], "E10019: "),
        (["--input_shape=x:1,3,-1,-1", "--dynamic_image_size=16,16;8,8", "--dynamic_batch_size=1,2"], "E10009: "),
        (["--input_shape=x:1,3,-1,-1", "--dynamic_image_size=16,16;8,8", "--dynamic_dims=1;2"], "E10009: "),
        (["--input_shape=x:1,3,-1,-1", "--dynamic_image_size=16,16;8,8", "--input_format=ND"],
         "E10003: Value ND for parameter --input_format"),
        (["--input_shape=x:1,3,-1,-1"], "E10011: "),
    ]
    for args, want in cases:
        assert main(base + args) == 255, args
        out = capsys.readouterr()
        assert out.err.count("\n") == 1 and out.err.startswith(want) and "Traceback" not in out.err, (args, out.err)
    assert not (tmp_path / "m.om").exists()
    assert main(base + ["--input_shape=x:1,3,-1,-1", f"--dynamic_image_size={GEAR_TEXT}"]) == 0
    capsys.readouterr()
    assert main(["atc", "--mode=6", f"--om={tmp_path / 'm.om'}"]) == 0
    assert "gears image sizes 8x12, 16x16, 12x24" in capsys.readouterr().out
