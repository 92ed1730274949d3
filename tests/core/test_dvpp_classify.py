"""The public samples' image-classification path, end to end: JPEG -> DVPP (JPEGD, VPC resize) -> a model
compiled with AIPP -> single operators (Cast, ArgMaxV2) -- against the same pipeline done with Pillow,
numpy and onnxruntime.

tests/samples/acl_dvpp_classify_sample.py, written for real NPUs in the style of the samples'
vpc_resnet50_imagenet_classification, runs in a subprocess with ONLY its ``import acl`` line changed, on a
CNN compiled by ``vnpu atc --insert_op_conf`` (the samples' YUV420SP -> RGB config, with ImageNet-style
normalisation) and operators compiled by ``vnpu atc --singleop``.  The reference decodes each JPEG with
Pillow, halves it with ``Image.reduce(2)`` (2x2 means, what VPC's 2x downscale does), keeps 4:2:0 chroma as a YUV420SP picture
does, converts back to RGB with JFIF's float equations and normalises in numpy, and runs the ONNX model with
onnxruntime.  The two differ only by where rounding happens (integer planes and colour conversion on the
device: a few levels a pixel), so the scores agree to a tolerance that follows from that and the labels
are equal.
"""
from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from onnx_models import cnn, ort_run
from runtime.atc import compile_model, make_options
from runtime.atc.singleop import compile_op_list
from test_atc_aipp import CSC, MIN, VAR

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "tests" / "samples" / "acl_dvpp_classify_sample.py"
HW, CLASSES, SRC = 32, 10, 64
AIPP = f"""aipp_op {{
  aipp_mode : static
  related_input_rank : 0
  input_format : YUV420SP_U8
  src_image_size_w : {HW}
  src_image_size_h : {HW}
  csc_switch : true
  rbuv_swap_switch : false
{CSC}""" + "".join(f"  min_chn_{i} : {MIN[i]}\n  var_reci_chn_{i} : {VAR[i]}\n" for i in range(3)) + "}\n"
OPS = f"""[
 {{"op": "Cast", "input_desc": [{{"format": "ND", "shape": [{CLASSES}], "type": "float"}}],
  "output_desc": [{{"format": "ND", "shape": [{CLASSES}], "type": "float16"}}],
  "attr": [{{"name": "truncate", "type": "bool", "value": false}}, {{"name": "dst_type", "type": "int", "value": 1}}]}},
 {{"op": "ArgMaxV2", "input_desc": [{{"format": "ND", "shape": [{CLASSES}], "type": "float16"}},
   {{"format": "ND", "shape": [1], "type": "int32", "is_const": true, "const_value": [0]}}],
  "output_desc": [{{"format": "ND", "shape": [1], "type": "int32"}}]}}
]"""


def smooth_jpeg(seed: int) -> bytes:
    """A photo-like 64x64 picture (a bicubic blow-up of 8x8 random colours), JPEG quality 95."""
    rng = np.random.default_rng(seed)
    small = Image.fromarray(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8))
    buf = io.BytesIO()
    small.resize((SRC, SRC), Image.BICUBIC).save(buf, format="JPEG", quality=95)
    return buf.getvalue()


def reference(jpeg: bytes, model) -> np.ndarray:
    """Pillow decodes and halves (2x2 means), keeps 4:2:0 chroma (each 2x2 block's mean Cb, Cr, as a
    YUV420SP picture does) and numpy converts back with JFIF's float equations; onnxruntime classifies."""
    ycc = np.asarray(Image.open(io.BytesIO(jpeg)).convert("RGB").reduce(2).convert("YCbCr"), np.float32)
    h, w = ycc.shape[:2]
    chroma = ycc[..., 1:].reshape(h // 2, 2, w // 2, 2, 2).mean(axis=(1, 3)).repeat(2, 0).repeat(2, 1) - 128.0
    y, cb, cr = ycc[..., 0], chroma[..., 0], chroma[..., 1]
    rgb = np.clip(np.stack([y + 1.402 * cr, y - 0.344136 * cb - 0.714136 * cr, y + 1.772 * cb], -1), 0, 255)
    x = (np.moveaxis(rgb, 2, 0) - np.array(MIN, np.float32)[:, None, None]) * np.array(VAR, np.float32)[:, None, None]
    return ort_run(model, {"x": x[None]})[0][0]


def test_jpeg_to_label_through_dvpp_aipp_and_single_operators_matches_pillow_and_onnxruntime(tmp_path):
    model = cnn(seed=9, batch=1, hw=HW, classes=CLASSES)
    (tmp_path / "aipp.cfg").write_text(AIPP)
    compile_model(model, make_options(insert_op_conf=str(tmp_path / "aipp.cfg"))).save(tmp_path / "m.om")
    (tmp_path / "ops.json").write_text(OPS)
    compile_op_list(tmp_path / "ops.json", tmp_path / "op_models")
    images = tmp_path / "images"
    images.mkdir()
    jpegs = {f"{i}.jpg": smooth_jpeg(i) for i in range(4)}
    for name, data in jpegs.items():
        (images / name).write_bytes(data)
    text = SAMPLE.read_text()
    assert text.splitlines().count("import acl") == 1 and "runtime" not in text
    script = tmp_path / "sample.py"
    script.write_text(text.replace("\nimport acl\n", "\nfrom runtime import acl\n"))
    env = dict(os.environ, VNPU_DEVICES="1", VNPU_HBM_BYTES=str(64 << 20), OPENBLAS_NUM_THREADS="1",
               PYTHONPATH=str(ROOT))
    env.pop("VNPU_BACKEND", None)
    p = subprocess.run([sys.executable, str(script), f"--model={tmp_path / 'm.om'}",
                        f"--op_models={tmp_path / 'op_models'}", f"--images={images}", f"--width={HW}",
                        f"--height={HW}", f"--classes={CLASSES}", f"--output={tmp_path / 'out.npz'}"],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    with np.load(tmp_path / "out.npz") as f:
        out = {k: f[k] for k in f.files}
    for name, data in jpegs.items():
        ref = reference(data, model)
        got = out[f"{name}/scores"]
        # a few levels a pixel (x var_reci ~0.017) through the CNN's softmax: measured at most 4.5 % of the
        # scores' spread (2-core machine; the computation is deterministic); a swapped channel or a wrong
        # matrix moves them by a large part of it
        assert np.abs(got - ref).max() <= 0.1 * (ref.max() - ref.min()), (name, got, ref)
        assert float(got @ ref) / float(np.linalg.norm(got) * np.linalg.norm(ref)) >= 0.995, name
        assert int(out[f"{name}/label"][0]) == int(np.argmax(ref.astype(np.float16))), name
        assert f"[Sample] {name} label:{int(np.argmax(ref.astype(np.float16)))}" in p.stdout
