"""The DVPP engines as device tasks: JPEG decode (``dvpp_jpegd``), JPEG encode (``dvpp_jpege``), PNG decode
(``dvpp_pngd``) and the VPC (``dvpp_vpc``: resize, crop, crop-and-paste, colour conversion).

Each runs as ONE block on its own engine unit (``KernelDef.unit`` is one of :data:`devices.chip.DVPP_UNITS`):
the cost model prices it by pixels at that engine's rate, not AI Core time, and the profiler records it
as a ``DVPP`` task.  The codecs are Pillow's, run by the device (its process, for a cluster device), on
the bytes of device memory -- the "host side" of the emulated device.

Arguments (the acl layer, :mod:`runtime.acl._media`, checks descriptors and sizes before it launches):
inputs ``(src uint8[n],)``, outputs ``(dst uint8[m], result int32[4])``; ``result`` gets ``[ret_code,
width, height, bytes]`` of what the engine produced (the decoded picture's size, the encoded stream's
length), which the acl layer copies back into the host-side descriptors.  Attributes: ``src`` / ``dst``
pictures as ``(format, width, height, width_stride, height_stride)`` (:class:`.picture.Pic`), and per
kernel ``level`` (JPEGE quality 1..100), ``op`` / ``crop`` / ``paste`` / ``interp`` (VPC).

A stream that cannot be decoded, a picture that does not fit its output, or an encoded stream longer than
its buffer writes a non-zero ``ret_code`` and fails the task with ACL_ERROR_FAILURE, reported by the next
synchronize of the stream.
"""
from __future__ import annotations

import io
from typing import Callable, NoReturn

import numpy as np

from ..chip import Work
from ..errors import ACL_ERROR_FAILURE, KernelError
from ..registry import builtin
from .checks import arity, dtype_in, need
from .picture import (INTERP_BILINEAR, PACKED, PIXEL_FORMAT_YUV_400, YUV420SP, Pic, chroma, read_packed, read_yuv,
                      resize, rgb_to_yuv420, write_packed, write_yuv, yuv420_to_rgb)

#: the ret_code a failed engine task leaves in its result (its own value: CANN documents none per engine)
RET_FAILED = 1


def pic_attr(attrs: dict, key: str) -> Pic:
    v = attrs.get(key)
    return Pic(*(int(x) for x in v))


def engine_task(name: str, check: Callable, work: Callable) -> Callable[[Callable], Callable]:
    """Decorator: ``body(src, dst, result, attrs)`` as the task ``name`` on the engine unit of that name,
    its arguments checked as every engine task's (the module docstring) and by ``check(name, inputs,
    outputs, attrs)``, priced by ``work(name)``; ``result`` is zeroed before the body runs."""
    def deco(body: Callable) -> Callable:
        def full_check(inputs, outputs, attrs):
            arity(name, inputs, outputs, 1, 2)
            dtype_in(name, inputs[0], ("uint8",), "source")
            dtype_in(name, outputs[0], ("uint8",), "destination")
            dtype_in(name, outputs[1], ("int32",), "result")
            need(outputs[1].numel == 4, name, "result must hold 4 int32")
            check(name, inputs, outputs, attrs)

        def task(ctx, inputs, outputs, attrs):
            src, (dst, result) = inputs[0], outputs
            result[:] = 0
            body(src, dst, result, attrs)
        task.__name__, task.__doc__ = body.__name__, body.__doc__
        return builtin(name, unit=name, check=full_check, work=work(name))(task)
    return deco


def _check_pics(name: str, inputs, outputs, attrs) -> None:
    """The ``src`` / ``dst`` pictures are 5 ints and fit their buffers."""
    for key in ("src", "dst"):
        v = attrs.get(key)
        if v is not None:
            need(isinstance(v, (tuple, list)) and len(v) == 5, name, f"attr {key!r} must be 5 ints")
    if "dst" in attrs:
        need(pic_attr(attrs, "dst").buffer_size <= outputs[0].numel, name, "destination buffer too small")
    if "src" in attrs:
        need(pic_attr(attrs, "src").buffer_size <= inputs[0].numel, name, "source buffer too small")


def _pixels(p: Pic) -> int:
    """The pixels an engine task processes: the picture's, or -- for a decoder's output, whose size only
    the stream knows -- its canvas'."""
    if p.pixels:
        return p.pixels
    bpp = PACKED[p.format][0] if p.format in PACKED else 1
    return p.width_stride // bpp * p.height_stride


def _work(unit: str):
    def work(inputs, outputs, attrs):
        pics = [pic_attr(attrs, k) for k in ("src", "dst") if k in attrs]
        px = max((_pixels(p) for p in pics), default=outputs[0].numel)
        return Work(unit=unit, pixels=float(px), bytes=float(inputs[0].nbytes + outputs[0].nbytes))
    return work


def _fail(result: np.ndarray, name: str, msg: str) -> NoReturn:
    result[0] = RET_FAILED
    raise KernelError(f"{name}: {msg}", code=ACL_ERROR_FAILURE)


def _decode(result: np.ndarray, name: str, src: np.ndarray, kind: str):
    """A Pillow image of the ``kind`` stream ``src``, fully decoded (a bad stream fails the task)."""
    from PIL import Image
    try:
        im = Image.open(io.BytesIO(src.tobytes()), formats=[kind])
        if kind == "JPEG":
            im.draft("YCbCr", im.size)     # the decoder's own YCbCr, as the JPEGD engine outputs it
        im.load()
    except (OSError, ValueError, SyntaxError) as e:
        _fail(result, name, f"not a decodable {kind} stream: {e}")
    return im


@engine_task("dvpp_jpegd", _check_pics, _work)
def dvpp_jpegd(src, dst, result, attrs):
    """JPEG stream -> YUV420SP (NV12/NV21) or YUV400, the picture at the top-left of the output canvas."""
    out = pic_attr(attrs, "dst")
    im = _decode(result, "dvpp_jpegd", src, "JPEG")
    w, h = im.size
    if w > out.width_stride or h > out.height_stride:
        _fail(result, "dvpp_jpegd", f"a {w}x{h} picture does not fit the {out.width_stride}x{out.height_stride} "
                                    f"output canvas")
    if im.mode == "L":
        y, uv = np.asarray(im), np.full((chroma(h), chroma(w), 2), 128, np.uint8)
    else:
        yb, cb, cr = (im if im.mode == "YCbCr" else im.convert("YCbCr")).split()
        y = np.asarray(yb)
        # 4:2:0 chroma: the mean of each 2x2 block (a partial block at an odd edge: of what it has)
        uv = np.stack([np.asarray(cb.reduce(2)), np.asarray(cr.reduce(2))], axis=-1)
    pic = Pic(out.format, w, h, out.width_stride, out.height_stride)
    if out.format == PIXEL_FORMAT_YUV_400:
        dst[:out.width_stride * out.height_stride].reshape(out.height_stride, out.width_stride)[:h, :w] = y
    else:
        write_yuv(dst, pic, y, uv)
    result[1:] = (w, h, pic.buffer_size)


@engine_task("dvpp_pngd", _check_pics, _work)
def dvpp_pngd(src, dst, result, attrs):
    """PNG stream -> packed RGB888 / RGBA8888 (BGR orders too) at the top-left of the output canvas."""
    out = pic_attr(attrs, "dst")
    im = _decode(result, "dvpp_pngd", src, "PNG")
    w, h = im.size
    bpp, order = PACKED[out.format]
    if w * bpp > out.width_stride or h > out.height_stride:
        _fail(result, "dvpp_pngd", f"a {w}x{h} picture does not fit the output canvas "
                                   f"({out.width_stride} bytes x {out.height_stride} rows)")
    px = np.asarray(im.convert("RGBA" if bpp == 4 else "RGB"))
    if order.startswith("BGR"):
        px = px[..., [2, 1, 0, 3][:bpp]]
    pic = Pic(out.format, w, h, out.width_stride, out.height_stride)
    write_packed(dst, pic, px)
    result[1:] = (w, h, pic.buffer_size)


@engine_task("dvpp_jpege", _check_pics, _work)
def dvpp_jpege(src, dst, result, attrs):
    """YUV420SP picture -> JPEG stream (quality ``level``), written from the start of the output buffer."""
    from PIL import Image
    p = pic_attr(attrs, "src")
    y, uv = read_yuv(src, p)
    up = uv.repeat(2, axis=0).repeat(2, axis=1)[:p.height, :p.width]
    planes = [Image.fromarray(np.ascontiguousarray(a)) for a in (y, up[..., 0], up[..., 1])]
    bio = io.BytesIO()
    Image.merge("YCbCr", planes).save(bio, format="JPEG", quality=int(attrs.get("level", 100)), subsampling=2)
    data = np.frombuffer(bio.getvalue(), dtype=np.uint8)
    if data.size > dst.size:
        _fail(result, "dvpp_jpege", f"the {data.size}-byte JPEG stream does not fit the {dst.size}-byte buffer")
    dst[:data.size] = data
    result[1:] = (p.width, p.height, data.size)


@engine_task("dvpp_vpc", _check_pics, _work)
def dvpp_vpc(src, dst, result, attrs):
    """VPC: ``op`` resize (whole input -> output size), crop (ROI ``crop`` -> output size), paste (ROI
    ``crop`` -> ROI ``paste`` of the output, the rest of the output kept) or convert (YUV420SP <-> packed
    RGB/BGR, same size)."""
    sp, dp = pic_attr(attrs, "src"), pic_attr(attrs, "dst")
    op = attrs.get("op", "resize")
    if op == "convert":
        _convert(src, sp, dst, dp)
        result[1:] = (dp.width, dp.height, dp.buffer_size)
        return
    interp = int(attrs.get("interp", INTERP_BILINEAR))
    y, uv = read_yuv(src, sp)
    l, r, t, b = attrs.get("crop") or (0, sp.width - 1, 0, sp.height - 1)
    y, uv = y[t:b + 1, l:r + 1], uv[t // 2:b // 2 + 1, l // 2:r // 2 + 1]
    x0 = y0 = 0
    ow, oh = dp.width, dp.height
    if op == "paste":
        pl, pr, pt, pb = attrs["paste"]
        x0, y0, ow, oh = pl, pt, pr - pl + 1, pb - pt + 1
    y = resize(y, oh, ow, interp)
    uv = resize(uv, chroma(oh), chroma(ow), interp)
    write_yuv(dst, dp, y, uv, x0, y0)
    result[1:] = (dp.width, dp.height, dp.buffer_size)


def _convert(src, sp: Pic, dst, dp: Pic) -> None:
    if sp.format in YUV420SP and dp.format in YUV420SP:
        y, uv = read_yuv(src, sp)
        write_yuv(dst, dp, y, uv)
        return
    if sp.format in YUV420SP:
        rgb = yuv420_to_rgb(*read_yuv(src, sp))
        bpp, order = PACKED[dp.format]
        px = rgb if order.startswith("RGB") else rgb[..., ::-1]
        if bpp == 4:
            px = np.concatenate([px, np.full(px.shape[:2] + (1,), 255, np.uint8)], axis=-1)
        write_packed(dst, dp, px)
        return
    px = read_packed(src, sp)
    order = PACKED[sp.format][1]
    rgb = px[..., :3] if order.startswith("RGB") else px[..., 2::-1]
    write_yuv(dst, dp, *rgb_to_yuv420(rgb))
