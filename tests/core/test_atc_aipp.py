"""AIPP: ``vnpu atc --insert_op_conf`` (static and dynamic) and ``acl.mdl``'s dynamic-AIPP calls.

References are independent of the kernel: an RGB picture made of 2x2 blocks (so NV12's chroma
subsampling loses nothing) is converted to YCbCr by Pillow; the model with AIPP, fed the NV12 bytes, must
give the Pillow RGB back within the integer conversion's rounding (3 levels), normalised as configured;
the same model without AIPP run by onnxruntime on that tensor gives the model's outputs (float32
tolerance).  A dynamic-AIPP model gets its parameters from ``acl.mdl.create_aipp`` / ``set_aipp_*`` /
``set_input_aipp``; every refusal has ATC's E-code or the ACL code, and the device keeps working.
"""
from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from acl_checks import acl_session, ok
from conftest import installed, make_local_runtime
from onnx_models import assert_close, cnn, ort_run
from runtime import acl
from runtime.atc import compile_model, make_options
from runtime.cli import main

NORMAL_ONLY, H2D, D2H = 2, 1, 2
HW = 16
#: the YCbCr (full range, as JPEG and Pillow) -> RGB matrix x256 of the public samples' aipp.cfg
CSC = """ matrix_r0c0 : 256
 matrix_r0c1 : 0
 matrix_r0c2 : 359
 matrix_r1c0 : 256
 matrix_r1c1 : -88
 matrix_r1c2 : -183
 matrix_r2c0 : 256
 matrix_r2c1 : 454
 matrix_r2c2 : 0
 input_bias_0 : 0
 input_bias_1 : 128
 input_bias_2 : 128
"""
MIN = (123.0, 117.0, 104.0)
VAR = (0.0171, 0.0175, 0.0174)


def blocky_rgb(w: int, h: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, (h // 2, w // 2, 3), dtype=np.uint8).repeat(2, 0).repeat(2, 1)


def nv12(rgb: np.ndarray) -> bytes:
    """NV12 bytes of ``rgb`` through Pillow's YCbCr (chroma of each 2x2 block: its top-left pixel)."""
    ycc = np.asarray(Image.fromarray(rgb).convert("YCbCr"))
    uv = ycc[::2, ::2, 1:]
    return ycc[..., 0].tobytes() + uv.tobytes()


def static_cfg(tmp_path, src_w, src_h, crop=None) -> str:
    text = "aipp_op {\n aipp_mode : static\n input_format : YUV420SP_U8\n csc_switch : true\n"
    text += f" src_image_size_w : {src_w}\n src_image_size_h : {src_h}\n" + CSC
    if crop:
        text += f" crop : true\n load_start_pos_w : {crop[0]}\n load_start_pos_h : {crop[1]}\n"
        text += f" crop_size_w : {HW}\n crop_size_h : {HW}\n"
    for i in range(3):
        text += f" min_chn_{i} : {MIN[i]}\n var_reci_chn_{i} : {VAR[i]}\n"
    text += "}\n"
    p = tmp_path / "aipp.cfg"
    p.write_text(text)
    return str(p)


def normalised(rgb_hwc: np.ndarray) -> np.ndarray:
    chw = np.moveaxis(rgb_hwc.astype(np.float32), 2, 0)
    return (chw - np.array(MIN, np.float32)[:, None, None]) * np.array(VAR, np.float32)[:, None, None]


@pytest.fixture(scope="module")
def model():
    return cnn(seed=5, batch=1, hw=HW)


@pytest.fixture(scope="module")
def rt():
    with installed(make_local_runtime(count=1, arena=64 << 20)) as r:
        yield r


@pytest.fixture
def ctx(rt):
    with acl_session():
        yield


def _device(data: bytes) -> tuple[int, int]:
    ptr, ret = acl.rt.malloc(len(data), NORMAL_ONLY)
    ok(ret)
    ok(acl.rt.memcpy(ptr, len(data), acl.util.bytes_to_ptr(data), len(data), H2D))
    return ptr, len(data)


def execute(model_id, inputs: list[bytes], out_shape) -> np.ndarray:
    """One acl.mdl.execute with these input bytes -> output 0 (float32)."""
    ins, outs = acl.mdl.create_dataset(), acl.mdl.create_dataset()
    for data in inputs:
        ptr, n = _device(data)
        ok(acl.mdl.add_dataset_buffer(ins, acl.create_data_buffer(ptr, n))[1])
    n = int(np.prod(out_shape)) * 4
    optr, ret = acl.rt.malloc(n, NORMAL_ONLY)
    ok(ret)
    ok(acl.mdl.add_dataset_buffer(outs, acl.create_data_buffer(optr, n))[1])
    ok(acl.mdl.execute(model_id, ins, outs))
    host = np.zeros(out_shape, np.float32)
    ok(acl.rt.memcpy(acl.util.numpy_to_ptr(host), n, optr, n, D2H))
    return host


def load(cm, tmp_path, name="m.om") -> int:
    path = tmp_path / name
    cm.save(path)
    mid, ret = acl.mdl.load_from_file(str(path))
    ok(ret)
    return mid


# ---------------------------------------------------------------------------------------------- static
def test_static_aipp_decodes_nv12_crops_and_normalises_as_pillow_and_onnxruntime(ctx, tmp_path, model):
    w, h, crop = 24, 20, (4, 2)
    rgb = blocky_rgb(w, h, seed=1)
    cm = compile_model(model, make_options(insert_op_conf=static_cfg(tmp_path, w, h, crop)))
    assert cm.manifest["inputs"][0] == {"name": "x", "dtype": "uint8", "dims": [1, w * h * 3 // 2], "format": "ND"}
    mid = load(cm, tmp_path)
    desc = acl.mdl.create_desc()
    ok(acl.mdl.get_desc(desc, mid))
    assert acl.mdl.get_input_size_by_index(desc, 0) == w * h * 3 // 2
    assert acl.mdl.get_aipp_type(mid, 0) == (1, -1, 0)                   # ACL_DATA_WITH_STATIC_AIPP
    got = execute(mid, [nv12(rgb)], (1, 10))
    # the AIPP stage alone: a model that returns its input, compiled with the same config
    x_pil = normalised(rgb[crop[1]:crop[1] + HW, crop[0]:crop[0] + HW])[None]
    stage = compile_model(identity_model(), make_options(insert_op_conf=static_cfg(tmp_path, w, h, crop)))
    x_aipp = execute(load(stage, tmp_path, "id.om"), [nv12(rgb)], (1, 3, HW, HW))
    levels = np.abs(x_aipp - x_pil) / np.array(VAR, np.float32)[None, :, None, None]
    # Pillow rounds Y, Cb, Cr to integers (0.5 level each, times up to 1.772 in B), its conversion is fixed
    # point (~0.5 more) and AIPP's >>8 floors (up to 1): at most 3 levels apart, about 1 on average
    assert levels.max() <= 3.01 and levels.mean() < 1.5, (levels.max(), levels.mean())
    assert_close(got, ort_run(model, {"x": x_aipp})[0], k=72, depth=4, what="CNN behind AIPP")


def identity_model():
    from onnx import TensorProto, helper
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, HW, HW])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3, HW, HW])
    return helper.make_model(helper.make_graph([helper.make_node("Relu", ["x"], ["r"]),
                                                helper.make_node("Sub", ["x", "r"], ["n"]),
                                                helper.make_node("Add", ["r", "n"], ["y"])], "id", [x], [y]),
                             opset_imports=[helper.make_opsetid("", 17)])


# ---------------------------------------------------------------------------------------------- dynamic
def test_dynamic_aipp_takes_its_parameters_at_execution(ctx, tmp_path):
    cfg = tmp_path / "dyn.cfg"
    cfg.write_text("aipp_op {\n aipp_mode : dynamic\n max_src_image_size : 2000\n}\n")
    cm = compile_model(identity_model(), make_options(insert_op_conf=str(cfg)))
    names = [i["name"] for i in cm.manifest["inputs"]]
    assert names == ["x", "ascend_dynamic_aipp_data"]
    mid = load(cm, tmp_path)
    assert acl.mdl.get_aipp_type(mid, 0) == (2, 1, 0) and acl.mdl.get_aipp_type(mid, 1) == (3, -1, 0)
    rgb = np.random.default_rng(4).integers(0, 256, (18, 20, 3), dtype=np.uint8)
    aipp = acl.mdl.create_aipp(1)
    ok(acl.mdl.set_aipp_input_format(aipp, 3))                              # ACL_RGB888_U8
    ok(acl.mdl.set_aipp_src_image_size(aipp, 20, 18))
    ok(acl.mdl.set_aipp_rbuv_swap_switch(aipp, 1))                         # the picture is BGR
    ok(acl.mdl.set_aipp_crop_params(aipp, 1, 3, 1, HW, HW - 2, 0))
    ok(acl.mdl.set_aipp_padding_params(aipp, 1, 1, 1, 0, 0, 0))
    ok(acl.mdl.set_aipp_dtc_pixel_min(aipp, *MIN, 0.0, 0))
    ok(acl.mdl.set_aipp_pixel_var_reci(aipp, *VAR, 1.0, 0))
    ins = acl.mdl.create_dataset()
    outs = acl.mdl.create_dataset()
    pic = rgb[..., ::-1].tobytes() + bytes(2000 - rgb.nbytes)               # BGR, padded to max_src_image_size
    for data in (pic, bytes(cm.manifest["inputs"][1]["dims"][1])):
        ptr, n = _device(data)
        ok(acl.mdl.add_dataset_buffer(ins, acl.create_data_buffer(ptr, n))[1])
    n = 3 * HW * HW * 4
    optr, ret = acl.rt.malloc(n, NORMAL_ONLY)
    ok(ret)
    ok(acl.mdl.add_dataset_buffer(outs, acl.create_data_buffer(optr, n))[1])
    ok(acl.mdl.set_input_aipp(mid, ins, 1, aipp))
    ok(acl.mdl.execute(mid, ins, outs))
    host = np.zeros((1, 3, HW, HW), np.float32)
    ok(acl.rt.memcpy(acl.util.numpy_to_ptr(host), n, optr, n, D2H))
    ref = np.zeros((HW, HW, 3), np.uint8)
    ref[1:HW - 1] = rgb[1:1 + HW - 2, 3:3 + HW]                              # crop, then 1 row of padding each side
    want = normalised(ref)
    want[:, 0] = want[:, -1] = (0 - np.array(MIN, np.float32)[:, None]) * np.array(VAR, np.float32)[:, None]
    np.testing.assert_allclose(host[0], want, rtol=1e-6, atol=1e-5)
    # refusals: a crop that no longer gives 16x16, scaling, a bad batch index, the wrong input; then it works
    ok(acl.mdl.set_aipp_crop_params(aipp, 1, 3, 1, HW, HW, 0))
    assert acl.mdl.set_input_aipp(mid, ins, 1, aipp) == 145000
    assert acl.mdl.set_aipp_scf_params(aipp, 1, 20, 18, 16, 16, 0) == 200006
    assert acl.mdl.set_aipp_crop_params(aipp, 1, 3, 1, HW, HW, 1) == 100000
    assert acl.mdl.set_input_aipp(mid, ins, 0, aipp) == 100000
    assert acl.mdl.set_aipp_input_format(aipp, 9) == 200006
    ok(acl.mdl.set_aipp_crop_params(aipp, 1, 3, 1, HW, HW - 2, 0))
    ok(acl.mdl.set_input_aipp(mid, ins, 1, aipp))
    ok(acl.mdl.execute(mid, ins, outs))
    ok(acl.mdl.destroy_aipp(aipp))
    assert acl.mdl.destroy_aipp(aipp) == 100000
    # no dynamic image size gears (vnpu atc refuses --dynamic_image_size): every H x W is not a gear
    assert acl.mdl.set_dynamic_hw_size(mid, ins, 0, HW, HW) == 145013
    assert acl.mdl.set_dynamic_hw_size(mid, ins, 7, HW, HW) == 100000
    assert acl.mdl.set_dynamic_hw_size(mid, ins, 0, 0, HW) == 100000


# ---------------------------------------------------------------------------------------------- atc refusals
@pytest.mark.parametrize("body, ecode", [
    (" aipp_mode : static\n input_format : YUV420SP_U8\n src_image_size_w : 16\n src_image_size_h : 16\n"
     " colour : 3\n", "E10001"),                                                   # unknown key
    (" aipp_mode : static\n input_format : NV12\n", "E10001"),                      # unknown format
    (" aipp_mode : static\n input_format : RGB888_U8\n src_image_size_w : 20\n src_image_size_h : 16\n",
     "E10001"),                                                                    # 20 wide, no crop
    (" aipp_mode : static\n input_format : YUV420SP_U8\n src_image_size_w : 15\n src_image_size_h : 16\n"
     " crop : true\n load_start_pos_w : 0\n", "E10001"),                            # odd YUV420SP width
    (" aipp_mode : static\n input_format : RGB888_U8\n resize : true\n", "E10055"),  # scaling
    (" aipp_mode : dynamic\n", "E10001"),                                          # no max_src_image_size
])
def test_atc_refuses_a_bad_aipp_config_with_one_line(tmp_path, capsys, body, ecode):
    from onnx import save
    src = tmp_path / "m.onnx"
    save(identity_model(), str(src))
    cfg = tmp_path / "aipp.cfg"
    cfg.write_text("aipp_op {\n" + body + "}\n")
    rc = main(["atc", f"--model={src}", "--framework=5", f"--output={tmp_path / 'out'}",
               f"--insert_op_conf={cfg}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 255 and len(err) == 1 and err[0].startswith(ecode + ":"), err
    assert not (tmp_path / "out.om").exists()


def test_atc_cli_compiles_the_samples_static_config(tmp_path, capsys):
    from onnx import save
    src = tmp_path / "m.onnx"
    save(identity_model(), str(src))
    rc = main(["atc", f"--model={src}", "--framework=5", f"--output={tmp_path / 'out'}",
               f"--insert_op_conf={static_cfg(tmp_path, HW, HW)}", "--soc_version=Ascend910B3"])
    assert rc == 0, capsys.readouterr()
    assert (tmp_path / "out.om").is_file()
