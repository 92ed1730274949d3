"""acl.media (DVPP): JPEGD / PNGD / JPEGE / VPC against independent references, descriptor checks and codes,
stream ordering, the DVPP engine in the cost model and the profiler.  In-process devices (one runtime for
the module); every picture is made here with Pillow / numpy.

References: a decoded JPEG's YUV420SP is compared with full-range BT.601 (JFIF) computed in numpy from
Pillow's own RGB decode of the same file, chroma as 2x2 means; resizes with Pillow's bilinear upscale and
exact 2x2 means for a 2x downscale; colour conversion with Pillow's YCbCr <-> RGB.  Tolerances follow the
arithmetic: a few levels for decoder rounding (RGB rounded to 8 bits, then converted again), one for a
rounded bilinear weight.
"""
from __future__ import annotations

import csv
import io

import numpy as np
import pytest
from PIL import Image

from acl_checks import ok
from conftest import installed, make_local_runtime
from devices.chip import CHIPS, CostModel, Work
from devices.errors import (ACL_ERROR_FAILURE, ACL_ERROR_INVALID_PARAM,
                            ACL_ERROR_RT_MEMORY_FREE, ACL_ERROR_UNINITIALIZE)
from runtime import acl, profiler

m = acl.media
NV12, NV21, RGB888, BGR888 = 1, 2, 12, 13
H2D, D2H = 1, 2


# ---------------------------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def rt():
    with installed(make_local_runtime(1)) as r:
        yield r


@pytest.fixture
def dv(rt):
    """acl initialized on device 0 with a stream and a created DVPP channel."""
    acl.finalize()
    acl.get_recent_err_msg()
    ok(acl.init())
    ok(acl.rt.set_device(0))
    stream = ok(acl.rt.create_stream())
    ch = m.dvpp_create_channel_desc()
    assert ch
    ok(m.dvpp_create_channel(ch))
    try:
        yield Dvpp(stream, ch)
    finally:
        acl.finalize()


class Dvpp:
    def __init__(self, stream, ch):
        self.stream, self.ch = stream, ch

    def put(self, data: bytes | np.ndarray, size: int | None = None) -> int:
        """DVPP memory holding ``data`` (``size`` bytes allocated, at least the data's)."""
        b = data.tobytes() if isinstance(data, np.ndarray) else data
        ptr = ok(m.dvpp_malloc(size or len(b)))
        ok(acl.rt.memcpy(ptr, len(b), acl.util.bytes_to_ptr(b), len(b), H2D))
        return ptr

    def get(self, ptr: int, n: int) -> np.ndarray:
        out = np.zeros(n, np.uint8)
        ok(acl.rt.memcpy(acl.util.numpy_to_ptr(out), n, ptr, n, D2H))
        return out

    def sync(self):
        return acl.rt.synchronize_stream(self.stream)


def pic(ptr, size, fmt, w, h, ws, hs) -> int:
    d = m.dvpp_create_pic_desc()
    for f, v in ((m.dvpp_set_pic_desc_data, ptr), (m.dvpp_set_pic_desc_size, size), (m.dvpp_set_pic_desc_format, fmt),
                 (m.dvpp_set_pic_desc_width, w), (m.dvpp_set_pic_desc_height, h),
                 (m.dvpp_set_pic_desc_width_stride, ws), (m.dvpp_set_pic_desc_height_stride, hs)):
        ok(f(d, v))
    return d


def align(n, k):
    return -(-n // k) * k


def photo(w: int, h: int, seed: int = 0) -> np.ndarray:
    """A smooth colourful RGB picture with some texture (U and V differ everywhere: a swap shows)."""
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float64)
    noise = np.random.default_rng(seed).normal(0, 6, (h, w, 3))
    rgb = np.stack([40 + 180 * xx / w, 30 + 150 * yy / h, 200 - 120 * (xx + yy) / (w + h)], -1) + noise
    return np.clip(rgb, 0, 255).astype(np.uint8)


def jpeg_bytes(rgb: np.ndarray, quality: int = 92) -> bytes:
    bio = io.BytesIO()
    Image.fromarray(rgb).save(bio, "JPEG", quality=quality)
    return bio.getvalue()


def bt601(rgb: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Full-range BT.601 (JFIF) Y and 4:2:0 (U, V) by 2x2 means, float (the reference)."""
    f = rgb.astype(np.float64)
    r, g, b = f[..., 0], f[..., 1], f[..., 2]
    y = 0.299 * r + 0.587 * g + 0.114 * b
    u = 128 + (b - y) / 1.772
    v = 128 + (r - y) / 1.402

    def pool(a):
        return a.reshape(a.shape[0] // 2, 2, a.shape[1] // 2, 2).mean(axis=(1, 3))
    return y, np.stack([pool(u), pool(v)], -1)


def planes(buf: np.ndarray, w, h, ws, hs, fmt=NV12):
    y = buf[:ws * hs].reshape(hs, ws)[:h, :w].astype(np.float64)
    uv = buf[ws * hs:ws * hs * 3 // 2].reshape(hs // 2, ws // 2, 2)[:h // 2, :w // 2].astype(np.float64)
    return y, (uv if fmt == NV12 else uv[..., ::-1])


def nv12(y: np.ndarray, uv: np.ndarray, ws: int, hs: int) -> np.ndarray:
    """A YUV420SP buffer (strides ws x hs) holding Y / UV at the top-left."""
    buf = np.zeros(ws * hs * 3 // 2, np.uint8)
    h, w = y.shape
    buf[:ws * hs].reshape(hs, ws)[:h, :w] = y
    buf[ws * hs:].reshape(hs // 2, ws // 2, 2)[:h // 2, :w // 2] = uv
    return buf


# ---------------------------------------------------------------------------------------------- JPEGD
@pytest.mark.parametrize("fmt", [NV12, NV21])
def test_jpeg_decode_is_bt601_of_the_decoded_picture(dv, fmt):
    w, h = 150, 94
    rgb = photo(w, h)
    jpg = jpeg_bytes(rgb)
    hp = acl.util.bytes_to_ptr(jpg)
    assert ok(m.dvpp_jpeg_get_image_info(hp, len(jpg))) == (w, h, 3)
    size = ok(m.dvpp_jpeg_predict_dec_size(hp, len(jpg), fmt))
    assert size == align(w, 128) * align(h, 16) * 3 // 2
    src, out = dv.put(jpg), ok(m.dvpp_malloc(size))
    ws, hs = align(w, 128), align(h, 16)
    d = pic(out, size, fmt, 0, 0, ws, hs)                  # width / height: filled by the decode
    ok(m.dvpp_jpeg_decode_async(dv.ch, src, len(jpg), d, dv.stream))
    ok(dv.sync())
    assert (m.dvpp_get_pic_desc_width(d), m.dvpp_get_pic_desc_height(d), m.dvpp_get_pic_desc_ret_code(d)) == (w, h, 0)
    y, uv = planes(dv.get(out, size), w, h, ws, hs, fmt)
    ry, ruv = bt601(np.asarray(Image.open(io.BytesIO(jpg)).convert("RGB")))
    assert np.abs(y - ry).max() <= 3 and np.abs(y - ry).mean() < 1.0
    assert np.abs(uv - ruv).max() <= 4 and np.abs(uv - ruv).mean() < 1.5
    assert np.abs(uv[..., 0] - ruv[..., 1]).mean() > 10       # U and V really differ: a swap would show


def test_decode_then_resize_on_one_stream_needs_one_synchronize(dv):
    """Async calls are ordered on their stream: the resize reads what the decode wrote, no sync between."""
    w, h = 64, 48
    rgb = photo(w, h, seed=3)
    jpg = jpeg_bytes(rgb, 95)
    src = dv.put(jpg)
    dsz = 128 * 48 * 3 // 2
    dec = ok(m.dvpp_malloc(dsz))
    d = pic(dec, dsz, NV12, w, h, 128, 48)
    rsz = 128 * 96 * 3 // 2
    res = ok(m.dvpp_malloc(rsz))
    r = pic(res, rsz, NV12, 128, 96, 128, 96)
    s = pic(dec, dsz, NV12, w, h, 128, 48)
    ok(m.dvpp_jpeg_decode_async(dv.ch, src, len(jpg), d, dv.stream))
    ok(m.dvpp_vpc_resize_async(dv.ch, s, r, m.dvpp_create_resize_config(), dv.stream))
    ok(dv.sync())
    y_dec, _ = planes(dv.get(dec, dsz), w, h, 128, 48)
    y_res, _ = planes(dv.get(res, rsz), 128, 96, 128, 96)
    ref = np.asarray(Image.fromarray(y_dec.astype(np.uint8)).resize((128, 96), Image.BILINEAR)).astype(np.float64)
    assert np.abs(y_res - ref).max() <= 1
    assert y_res.std() > 20                                   # a real picture, not a blank canvas


def test_a_stream_that_does_not_decode_fails_at_synchronize_and_the_device_goes_on(dv):
    bad = b"\xff\xd8\xff\xe0" + bytes(range(256)) * 4
    src = dv.put(bad)
    size = 128 * 64 * 3 // 2
    out = ok(m.dvpp_malloc(size))
    d = pic(out, size, NV12, 0, 0, 128, 64)
    ok(m.dvpp_jpeg_decode_async(dv.ch, src, len(bad), d, dv.stream))     # queued: the check is the engine's
    assert dv.sync() == ACL_ERROR_FAILURE
    assert "dvpp_jpegd" in acl.get_recent_err_msg()
    assert m.dvpp_get_pic_desc_ret_code(d) != 0
    # a picture larger than its canvas fails the same way; then a good decode on the same stream works
    big = jpeg_bytes(photo(200, 40))
    src2 = dv.put(big)
    ok(m.dvpp_jpeg_decode_async(dv.ch, src2, len(big), d, dv.stream))
    assert dv.sync() == ACL_ERROR_FAILURE
    good = jpeg_bytes(photo(100, 50))
    src3 = dv.put(good)
    ok(m.dvpp_jpeg_decode_async(dv.ch, src3, len(good), d, dv.stream))
    ok(dv.sync())
    assert (m.dvpp_get_pic_desc_width(d), m.dvpp_get_pic_desc_ret_code(d)) == (100, 0)


# ---------------------------------------------------------------------------------------------- VPC
def test_resize_2x_down_is_the_2x2_mean_and_up_is_pillow_bilinear(dv):
    w, h = 96, 64
    rgb = photo(w, h, seed=5)
    ry, ruv = bt601(rgb)
    y8, uv8 = np.rint(ry).astype(np.uint8), np.rint(ruv).astype(np.uint8)
    src = dv.put(nv12(y8, uv8, w, h))
    s = pic(src, w * h * 3 // 2, NV12, w, h, w, h)
    # down 2x: bilinear with half-pixel centres samples exactly between 4 pixels
    dsz = 48 * 32 * 3 // 2
    dst = ok(m.dvpp_malloc(dsz))
    ok(m.dvpp_vpc_resize_async(dv.ch, s, pic(dst, dsz, NV21, 48, 32, 48, 32), m.dvpp_create_resize_config(),
                               dv.stream))
    ok(dv.sync())
    y, uv = planes(dv.get(dst, dsz), 48, 32, 48, 32, NV21)
    mean = y8.astype(np.float64).reshape(32, 2, 48, 2).mean(axis=(1, 3))
    assert np.abs(y - mean).max() <= 1
    cmean = uv8.astype(np.float64).reshape(16, 2, 24, 2, 2).mean(axis=(1, 3))
    assert np.abs(uv - cmean).max() <= 1
    # up 5/3: Pillow's bilinear (triangle filter, support 1 when enlarging) on each plane
    uw, uh = 160, 106
    usz = 160 * 106 * 3 // 2
    up = ok(m.dvpp_malloc(usz))
    ok(m.dvpp_vpc_resize_async(dv.ch, s, pic(up, usz, NV12, uw, uh, 160, 106), 0, dv.stream))
    ok(dv.sync())
    y, uv = planes(dv.get(up, usz), uw, uh, 160, 106)
    ref = np.asarray(Image.fromarray(y8).resize((uw, uh), Image.BILINEAR))
    assert np.abs(y - ref).max() <= 1
    for c in range(2):
        cref = np.asarray(Image.fromarray(uv8[..., c]).resize((uw // 2, uh // 2), Image.BILINEAR))
        assert np.abs(uv[..., c] - cref).max() <= 1


def test_crop_and_crop_and_paste_move_exactly_the_roi(dv):
    w, h = 96, 64
    rng = np.random.default_rng(7)
    y8 = rng.integers(0, 256, (h, w), dtype=np.uint8)
    uv8 = rng.integers(0, 256, (h // 2, w // 2, 2), dtype=np.uint8)
    src = dv.put(nv12(y8, uv8, w, h))
    s = pic(src, w * h * 3 // 2, NV12, w, h, w, h)
    left, right, top, bottom = 10, 41, 6, 29                   # a 32 x 24 ROI
    roi = m.dvpp_create_roi_config(left, right, top, bottom)
    csz = 32 * 24 * 3 // 2
    cut = ok(m.dvpp_malloc(csz))
    ok(m.dvpp_vpc_crop_async(dv.ch, s, pic(cut, csz, NV12, 32, 24, 32, 24), roi, dv.stream))
    # crop-and-paste into a canvas of 7s at (16, 8): the rest of the canvas keeps its bytes
    psz = 64 * 48 * 3 // 2
    canvas = dv.put(np.full(psz, 7, np.uint8))
    paste = m.dvpp_create_roi_config(16, 47, 8, 31)
    ok(m.dvpp_vpc_crop_and_paste_async(dv.ch, s, pic(canvas, psz, NV12, 64, 48, 64, 48), roi, paste, dv.stream))
    ok(dv.sync())
    y, uv = planes(dv.get(cut, csz), 32, 24, 32, 24)
    assert np.array_equal(y, y8[top:bottom + 1, left:right + 1])
    assert np.array_equal(uv, uv8[top // 2:bottom // 2 + 1, left // 2:right // 2 + 1])
    y, uv = planes(dv.get(canvas, psz), 64, 48, 64, 48)
    want = np.full((48, 64), 7.0)
    want[8:32, 16:48] = y8[top:bottom + 1, left:right + 1]
    assert np.array_equal(y, want)
    cwant = np.full((24, 32, 2), 7.0)
    cwant[4:16, 8:24] = uv8[top // 2:bottom // 2 + 1, left // 2:right // 2 + 1]
    assert np.array_equal(uv, cwant)


def test_batch_crop_fills_each_output_from_its_roi(dv):
    w, h = 64, 32
    y8 = (np.arange(w * h) % 253).astype(np.uint8).reshape(h, w)
    uv8 = np.full((h // 2, w // 2, 2), 128, np.uint8)
    src = dv.put(nv12(y8, uv8, w, h))
    ins = m.dvpp_create_batch_pic_desc(1)
    d = m.dvpp_get_pic_desc(ins, 0)
    for f, v in ((m.dvpp_set_pic_desc_data, src), (m.dvpp_set_pic_desc_size, w * h * 3 // 2),
                 (m.dvpp_set_pic_desc_format, NV12), (m.dvpp_set_pic_desc_width, w), (m.dvpp_set_pic_desc_height, h),
                 (m.dvpp_set_pic_desc_width_stride, w), (m.dvpp_set_pic_desc_height_stride, h)):
        ok(f(d, v))
    outs = m.dvpp_create_batch_pic_desc(2)
    bufs = []
    for i in range(2):
        b = ok(m.dvpp_malloc(16 * 16 * 3 // 2))
        bufs.append(b)
        o = m.dvpp_get_pic_desc(outs, i)
        for f, v in ((m.dvpp_set_pic_desc_data, b), (m.dvpp_set_pic_desc_size, 16 * 16 * 3 // 2),
                     (m.dvpp_set_pic_desc_format, NV12), (m.dvpp_set_pic_desc_width, 16),
                     (m.dvpp_set_pic_desc_height, 16), (m.dvpp_set_pic_desc_width_stride, 16),
                     (m.dvpp_set_pic_desc_height_stride, 16)):
            ok(f(o, v))
    rois = [m.dvpp_create_roi_config(0, 15, 0, 15), m.dvpp_create_roi_config(32, 47, 16, 31)]
    assert ok(m.dvpp_vpc_batch_crop_async(dv.ch, ins, [2], outs, rois, dv.stream)) == outs
    ok(dv.sync())
    assert np.array_equal(planes(dv.get(bufs[0], 384), 16, 16, 16, 16)[0], y8[:16, :16])
    assert np.array_equal(planes(dv.get(bufs[1], 384), 16, 16, 16, 16)[0], y8[16:32, 32:48])
    assert m.dvpp_vpc_batch_crop_async(dv.ch, ins, [3], outs, rois, dv.stream)[-1] == ACL_ERROR_INVALID_PARAM


@pytest.mark.parametrize("packed", [RGB888, BGR888])
def test_convert_color_both_ways_agrees_with_pillow_ycbcr(dv, packed):
    w, h = 48, 32
    rgb = photo(w, h, seed=9)
    # RGB -> NV12: Pillow's full-resolution YCbCr, chroma as 2x2 means
    ws = w * 3
    px = rgb if packed == RGB888 else rgb[..., ::-1]
    src = dv.put(np.ascontiguousarray(px))
    nsz = w * h * 3 // 2
    dst = ok(m.dvpp_malloc(nsz))
    ok(m.dvpp_vpc_convert_color_async(dv.ch, pic(src, ws * h, packed, w, h, ws, h), pic(dst, nsz, NV12, w, h, w, h),
                                      dv.stream))
    # NV12 (Pillow's) -> RGB: compared with Pillow's YCbCr -> RGB of the same planes
    ycc = np.asarray(Image.fromarray(rgb).convert("YCbCr")).astype(np.float64)
    y8 = np.rint(ycc[..., 0]).astype(np.uint8)
    uv8 = np.rint(ycc[..., 1:].reshape(h // 2, 2, w // 2, 2, 2).mean(axis=(1, 3))).astype(np.uint8)
    src2 = dv.put(nv12(y8, uv8, w, h))
    back = ok(m.dvpp_malloc(ws * h))
    ok(m.dvpp_vpc_convert_color_async(dv.ch, pic(src2, nsz, NV12, w, h, w, h), pic(back, ws * h, packed, w, h, ws, h),
                                      dv.stream))
    ok(dv.sync())
    y, uv = planes(dv.get(dst, nsz), w, h, w, h)
    # Pillow rounds each pixel's YCbCr (fixed point, +-0.5 and a little), vnpu rounds the 2x2 mean once
    assert np.abs(y - ycc[..., 0]).max() <= 1
    assert np.abs(uv - ycc[..., 1:].reshape(h // 2, 2, w // 2, 2, 2).mean(axis=(1, 3))).max() <= 1.5
    got = dv.get(back, ws * h).reshape(h, w, 3).astype(np.int64)
    if packed == BGR888:
        got = got[..., ::-1]
    up = np.repeat(np.repeat(uv8, 2, 0), 2, 1)
    ref = np.asarray(Image.merge("YCbCr", [Image.fromarray(a) for a in (y8, up[..., 0], up[..., 1])])
                     .convert("RGB")).astype(np.int64)
    assert np.abs(got - ref).max() <= 2


# ---------------------------------------------------------------------------------------------- JPEGE / PNGD
def test_jpeg_encode_writes_a_jpeg_and_its_length_to_the_host(dv):
    w, h = 80, 48
    ry, ruv = bt601(photo(w, h, seed=11))
    y8, uv8 = np.rint(ry).astype(np.uint8), np.rint(ruv).astype(np.uint8)
    src = dv.put(nv12(y8, uv8, w, h))
    d = pic(src, w * h * 3 // 2, NV12, w, h, w, h)
    cfg = m.dvpp_create_jpege_config()
    ok(m.dvpp_set_jpege_config_level(cfg, 95))
    assert m.dvpp_get_jpege_config_level(cfg) == 95
    cap = ok(m.dvpp_jpeg_predict_enc_size(d, cfg))
    out = ok(m.dvpp_malloc(cap))
    size = np.array([cap], np.uint32)
    ok(m.dvpp_jpeg_encode_async(dv.ch, d, out, acl.util.numpy_to_ptr(size), cfg, dv.stream))
    ok(dv.sync())
    n = int(size[0])
    assert 0 < n < cap
    data = dv.get(out, n).tobytes()
    assert data[:2] == b"\xff\xd8" and data[-2:] == b"\xff\xd9"
    back = np.asarray(Image.open(io.BytesIO(data)).convert("YCbCr")).astype(np.float64)
    assert back.shape == (h, w, 3)
    assert np.abs(back[..., 0] - y8).mean() < 2.0                # quality 95: close to the source


def test_png_decode_is_lossless(dv):
    w, h = 37, 21
    rgb = np.random.default_rng(13).integers(0, 256, (h, w, 3), dtype=np.uint8)
    bio = io.BytesIO()
    Image.fromarray(rgb).save(bio, "PNG")
    png = bio.getvalue()
    hp = acl.util.bytes_to_ptr(png)
    assert ok(m.dvpp_png_get_image_info(hp, len(png))) == (w, h, 3)
    size = ok(m.dvpp_png_predict_dec_size(hp, len(png), RGB888))
    ws, hs = align(w * 3, 128), align(h, 16)
    assert size == ws * hs
    src, out = dv.put(png), ok(m.dvpp_malloc(size))
    d = pic(out, size, RGB888, 0, 0, ws, hs)
    ok(m.dvpp_png_decode_async(dv.ch, src, len(png), d, dv.stream))
    ok(dv.sync())
    assert (m.dvpp_get_pic_desc_width(d), m.dvpp_get_pic_desc_height(d)) == (w, h)
    got = dv.get(out, size).reshape(hs, ws)[:h, :w * 3].reshape(h, w, 3)
    assert np.array_equal(got, rgb)


# ---------------------------------------------------------------------------------------------- checks, codes
def test_dvpp_memory_is_128_aligned_and_its_own(dv):
    ptrs = [ok(m.dvpp_malloc(n)) for n in (1, 33, 100, 4097)]
    assert all(p % 128 == 0 for p in ptrs)
    assert m.dvpp_malloc(0)[-1] == ACL_ERROR_INVALID_PARAM
    ok(m.dvpp_free(ptrs[0]))
    assert m.dvpp_free(ptrs[0]) == ACL_ERROR_RT_MEMORY_FREE            # twice
    plain = ok(acl.rt.malloc(4096, 0))
    assert m.dvpp_free(plain) == ACL_ERROR_RT_MEMORY_FREE              # not DVPP memory
    # an engine refuses ordinary device memory, and a range past the end of the DVPP allocation
    jpg = jpeg_bytes(photo(32, 32))
    d = pic(ok(m.dvpp_malloc(128 * 32 * 3 // 2)), 128 * 32 * 3 // 2, NV12, 0, 0, 128, 32)
    assert m.dvpp_jpeg_decode_async(dv.ch, plain, len(jpg), d, dv.stream) == ACL_ERROR_INVALID_PARAM
    small = dv.put(jpg)
    assert m.dvpp_jpeg_decode_async(dv.ch, small, len(jpg) + 4096, d, dv.stream) == ACL_ERROR_INVALID_PARAM
    ok(acl.rt.free(plain))


def test_bad_descriptors_are_refused_before_anything_is_queued(dv):
    w, h = 64, 32
    src = dv.put(np.zeros(w * h * 3 // 2, np.uint8))
    good = pic(src, w * h * 3 // 2, NV12, w, h, w, h)
    out = ok(m.dvpp_malloc(64 * 64 * 3 // 2))
    cfg = m.dvpp_create_resize_config()
    cases = {
        "width stride not a multiple of 16": pic(out, 64 * 64 * 3 // 2, NV12, 40, 32, 40, 32),
        "height stride odd": pic(out, 64 * 64 * 3 // 2, NV12, 32, 31, 32, 31),
        "width over its stride": pic(out, 64 * 64 * 3 // 2, NV12, 48, 32, 32, 32),
        "size below the layout": pic(out, 100, NV12, 32, 32, 32, 32),
        "below the VPC minimum": pic(out, 64 * 64 * 3 // 2, NV12, 8, 4, 16, 4),
        "unknown format": pic(out, 64 * 64 * 3 // 2, 99, 32, 32, 32, 32),
    }
    for why, bad in cases.items():
        assert m.dvpp_vpc_resize_async(dv.ch, good, bad, cfg, dv.stream) == ACL_ERROR_INVALID_PARAM, why
        assert acl.get_recent_err_msg().startswith("acl.media.dvpp_vpc_resize_async:"), why
    assert m.dvpp_vpc_resize_async(dv.ch, 0xDEAD, good, cfg, dv.stream) == ACL_ERROR_INVALID_PARAM
    roi_bad = {"left odd": (1, 16, 0, 15), "right even": (0, 16, 0, 15), "outside": (32, 79, 0, 15)}
    for why, box in roi_bad.items():
        r = m.dvpp_create_roi_config(*box)
        ok_out = pic(out, 64 * 64 * 3 // 2, NV12, 32, 32, 32, 32)
        assert m.dvpp_vpc_crop_async(dv.ch, good, ok_out, r, dv.stream) == ACL_ERROR_INVALID_PARAM, why
    paste = m.dvpp_create_roi_config(8, 23, 0, 15)                   # left not a multiple of 16
    assert m.dvpp_vpc_crop_and_paste_async(dv.ch, good, pic(out, 64 * 64 * 3 // 2, NV12, 32, 32, 32, 32),
                                           m.dvpp_create_roi_config(0, 15, 0, 15), paste, dv.stream) \
        == ACL_ERROR_INVALID_PARAM
    jd = pic(out, 64 * 64 * 3 // 2, NV12, 0, 0, 32, 32)              # JPEGD canvas: width stride 64, height 16
    assert m.dvpp_jpeg_decode_async(dv.ch, src, 100, jd, dv.stream) == ACL_ERROR_INVALID_PARAM
    # a channel that was not created, a destroyed description, a bad interpolation
    ch2 = m.dvpp_create_channel_desc()
    assert m.dvpp_vpc_resize_async(ch2, good, good, cfg, dv.stream) == ACL_ERROR_INVALID_PARAM
    ok(m.dvpp_destroy_pic_desc(good))
    assert m.dvpp_get_pic_desc_width(good) == 0 and m.dvpp_destroy_pic_desc(good) == ACL_ERROR_INVALID_PARAM
    assert m.dvpp_set_resize_config_interpolation(cfg, 7) == ACL_ERROR_INVALID_PARAM
    assert m.dvpp_set_jpege_config_level(m.dvpp_create_jpege_config(), 101) == ACL_ERROR_INVALID_PARAM
    assert m.dvpp_jpeg_get_image_info(acl.util.bytes_to_ptr(b"not a jpeg at all"), 17)[-1] == ACL_ERROR_INVALID_PARAM
    # nothing was queued by any of it: the stream is idle and the device still works
    ok(dv.sync())
    test_crop_and_crop_and_paste_move_exactly_the_roi(dv)


def test_calls_before_init_are_refused(rt):
    acl.finalize()
    assert m.dvpp_malloc(64)[-1] == ACL_ERROR_UNINITIALIZE
    assert m.dvpp_create_pic_desc() == 0 and m.vdec_create_channel_desc() == 0
    assert "acl.init" in acl.get_recent_err_msg()


# ---------------------------------------------------------------------------------------------- cost, profile
def test_dvpp_tasks_are_priced_by_the_dvpp_engine_and_profiled_as_dvpp(dv, tmp_path):
    w, h = 320, 240
    jpg = jpeg_bytes(photo(w, h))
    src = dv.put(jpg)
    size = align(w, 128) * align(h, 16) * 3 // 2
    out = ok(m.dvpp_malloc(size))
    d = pic(out, size, NV12, 0, 0, align(w, 128), align(h, 16))
    with profiler.profile(str(tmp_path)) as p:
        ok(m.dvpp_jpeg_decode_async(dv.ch, src, len(jpg), d, dv.stream))
        ok(dv.sync())
    with open(p.result.op_summary, newline="", encoding="utf-8") as f:
        rows = [r for r in csv.DictReader(f) if r["OP Type"] == "dvpp_jpegd"]
    assert len(rows) == 1 and rows[0]["Task Type"] == "DVPP"
    chip = acl.get_soc_name()
    want = CostModel(CHIPS[chip]).dvpp(Work(unit="dvpp_jpegd", pixels=align(w, 128) * align(h, 16)))
    assert float(rows[0]["Modeled Duration(us)"]) == pytest.approx(want * 1e6, rel=1e-3)
    # the engine's rate, not the AI Cores': a 1080p frame takes 1/128 s on one JPEGD channel
    frame = CostModel(CHIPS[chip]).dvpp(Work(unit="dvpp_jpegd", pixels=1920 * 1080))
    assert frame == pytest.approx(1 / 128 + CHIPS[chip].launch_cost_s)
