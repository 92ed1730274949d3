"""AIPP (AI pre-processing): the image stage ATC compiles in front of a model input (``--insert_op_conf``).

``aipp(image, params) -> out``: ``image`` uint8 ``[N, bytes]`` (each row one picture in the input format,
at most ``bytes`` long), ``params`` float64 ``[1 or N, PARAMS]`` (one row for every picture, or one per
picture; :data:`FIELDS` names its columns) or the same bytes as uint8 ``[N, 8 * PARAMS]`` (a dynamic-AIPP
model input) and ``out`` float32/float16 ``[N, C, H, W]``.  Per picture, in
CANN's order: read the picture (``src_w`` x ``src_h``; YUV420SP is NV12, its chroma upsampled to every
pixel), crop, swap R/B (or U/V), colour-space conversion, padding, then the data-type conversion
``(pixel - mean - min) * var_reci`` per channel into the model's dtype, laid out NCHW.

The conversion is CANN's integer one: YUV->RGB ``out = (M @ (pix - input_bias)) >> 8``, RGB->YUV
``out = ((M @ pix) >> 8) + output_bias``, each clipped to 0..255.  Parameters are read from device memory
when the kernel runs (dynamic AIPP writes them at execution time): a picture that does not fit its row,
a crop outside the picture or a result whose size is not the output's is a KernelError before its
block writes anything.  Blocks split the pictures.
"""
from __future__ import annotations

import numpy as np

from ..errors import KernelError
from ..registry import builtin
from .blocks import block_boxes, pad_box
from .checks import arity, dtype_in, need, shape_is
from .work import vector_work

#: input formats (aclAippInputFormat values) -> channels read per pixel
FORMATS = {1: ("YUV420SP_U8", 3), 2: ("XRGB8888_U8", 3), 3: ("RGB888_U8", 3), 4: ("YUV400_U8", 1)}
FIELDS = ("input_format", "src_image_size_w", "src_image_size_h", "csc_switch", "rbuv_swap_switch",
          *(f"matrix_r{r}c{c}" for r in range(3) for c in range(3)),
          "input_bias_0", "input_bias_1", "input_bias_2", "output_bias_0", "output_bias_1", "output_bias_2",
          "crop", "load_start_pos_w", "load_start_pos_h", "crop_size_w", "crop_size_h",
          "padding", "top_padding_size", "bottom_padding_size", "left_padding_size", "right_padding_size",
          "mean_chn_0", "mean_chn_1", "mean_chn_2", "mean_chn_3", "min_chn_0", "min_chn_1", "min_chn_2",
          "min_chn_3", "var_reci_chn_0", "var_reci_chn_1", "var_reci_chn_2", "var_reci_chn_3")
PARAMS = 48                                      #: columns of a params row (FIELDS, then reserved zeros)
COL = {name: i for i, name in enumerate(FIELDS)}
assert len(FIELDS) <= PARAMS


def image_bytes(fmt: int, w: int, h: int) -> int:
    """Bytes of one ``w`` x ``h`` picture in aclAippInputFormat ``fmt``."""
    return {1: w * h * 3 // 2, 2: w * h * 4, 3: w * h * 3, 4: w * h}[fmt]


def _check(inputs, outputs, attrs):
    nm = "aipp"
    arity(nm, inputs, outputs, 2)
    img, par = inputs
    out = outputs[0]
    dtype_in(nm, img, ("uint8",), "image")
    dtype_in(nm, par, ("float64", "uint8"), "params")
    dtype_in(nm, out, ("float32", "float16"), "output")
    need(len(img.shape) == 2 and len(out.shape) == 4 and len(par.shape) == 2, nm,
         "image is [N, bytes], params [1 or N, PARAMS], output [N, C, H, W]")
    width = PARAMS * (8 if par.dtype == "uint8" else 1)
    need(par.shape[1] == width and par.shape[0] in (1, img.shape[0]), nm,
         f"params must be [1 or {img.shape[0]}, {width}] {par.dtype}, got {list(par.shape)}")
    need(out.shape[1] in (1, 3), nm, f"the output has 1 or 3 channels, got {out.shape[1]}")
    shape_is(nm, out, (img.shape[0],) + tuple(out.shape[1:]))


def _picture(row: np.ndarray, p: np.ndarray, n: int) -> tuple[np.ndarray, bool]:
    """Picture ``n`` as int32 HWC (and whether it is YUV) at its source size."""
    fmt, w, h = int(p[COL["input_format"]]), int(p[COL["src_image_size_w"]]), int(p[COL["src_image_size_h"]])
    if fmt not in FORMATS or w <= 0 or h <= 0 or (fmt == 1 and (w % 2 or h % 2)):
        raise KernelError(f"aipp: picture {n}: input format {fmt} at {w}x{h} is not one AIPP reads")
    need_b = image_bytes(fmt, w, h)
    if need_b > row.size:
        raise KernelError(f"aipp: picture {n}: {FORMATS[fmt][0]} {w}x{h} needs {need_b} B, its input row has "
                          f"{row.size} B")
    b = row[:need_b].astype(np.int32)
    if fmt == 1:
        y = b[:w * h].reshape(h, w)
        uv = b[w * h:].reshape(h // 2, w // 2, 2).repeat(2, axis=0).repeat(2, axis=1)
        return np.dstack([y, uv[..., 0], uv[..., 1]]), True
    if fmt == 2:
        return b.reshape(h, w, 4)[..., 1:], False
    if fmt == 3:
        return b.reshape(h, w, 3), False
    return b.reshape(h, w, 1), True


def _one(row: np.ndarray, p: np.ndarray, n: int, out_chw: tuple) -> np.ndarray:
    pic, yuv = _picture(row, p, n)
    if p[COL["crop"]]:
        x0, y0 = int(p[COL["load_start_pos_w"]]), int(p[COL["load_start_pos_h"]])
        cw, ch = int(p[COL["crop_size_w"]]), int(p[COL["crop_size_h"]])
        if x0 < 0 or y0 < 0 or cw <= 0 or ch <= 0 or x0 + cw > pic.shape[1] or y0 + ch > pic.shape[0]:
            raise KernelError(f"aipp: picture {n}: crop {cw}x{ch} at ({x0}, {y0}) is outside its "
                              f"{pic.shape[1]}x{pic.shape[0]}")
        pic = pic[y0:y0 + ch, x0:x0 + cw]
    if p[COL["rbuv_swap_switch"]] and pic.shape[2] == 3:
        pic = pic[..., [0, 2, 1]] if yuv else pic[..., ::-1]
    if p[COL["csc_switch"]] and pic.shape[2] == 3:
        m = p[COL["matrix_r0c0"]:COL["matrix_r2c2"] + 1].astype(np.int64).reshape(3, 3)
        if yuv:
            bias = p[COL["input_bias_0"]:COL["input_bias_2"] + 1].astype(np.int64)
            pic = np.clip(((pic - bias) @ m.T) >> 8, 0, 255)
        else:
            bias = p[COL["output_bias_0"]:COL["output_bias_2"] + 1].astype(np.int64)
            pic = np.clip(((pic.astype(np.int64) @ m.T) >> 8) + bias, 0, 255)
    if p[COL["padding"]]:
        t, bt, lf, rt = (int(p[COL[k]]) for k in ("top_padding_size", "bottom_padding_size", "left_padding_size",
                                                  "right_padding_size"))
        pic = np.pad(pic, ((t, bt), (lf, rt), (0, 0)))
    c, h, w = out_chw
    if pic.shape != (h, w, c):
        raise KernelError(f"aipp: picture {n}: after crop and padding it is {pic.shape[1]}x{pic.shape[0]} with "
                          f"{pic.shape[2]} channels; the model input is {w}x{h} with {c}")
    mean = p[COL["mean_chn_0"]:COL["mean_chn_0"] + c]
    mn = p[COL["min_chn_0"]:COL["min_chn_0"] + c]
    var = p[COL["var_reci_chn_0"]:COL["var_reci_chn_0"] + c]
    chw = np.moveaxis(pic, 2, 0).astype(np.float32)
    return (chw - (mean + mn).astype(np.float32)[:, None, None]) * var.astype(np.float32)[:, None, None]


@builtin("aipp", unit="vector", check=_check, work=vector_work(8),
         parallel_dim=lambda inputs, outputs, attrs: outputs[0].shape[0])
def _aipp_run(ctx, inputs, outputs, attrs):
    """AIPP of each picture of image [N, bytes] with params [1|N, 48] into out [N, C, H, W]"""
    img, par = inputs
    if par.dtype == np.uint8:
        par = np.ascontiguousarray(par).view("<f8")
    out = outputs[0]
    for box in block_boxes(ctx, (out.shape[0],)):
        idx = range(*pad_box(box, 1)[0].indices(out.shape[0]))
        done = [_one(img[n], par[n if par.shape[0] > 1 else 0], n, out.shape[1:]) for n in idx]
        for n, r in zip(idx, done):
            out[n] = r
