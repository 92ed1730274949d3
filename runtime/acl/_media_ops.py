"""The implementation of ``acl.media``'s engine calls (:mod:`runtime.acl.media` lists the API): JPEGD,
JPEGE, PNGD and the VPC (resize, crop, crop-and-paste, batch crops, colour conversion), and the stream
information calls (``dvpp_jpeg_get_image_info``, ``dvpp_jpeg_predict_dec_size`` ...).

An ``*_async`` call checks its descriptors on the host and returns at once: each picture's format, its
width / height against its strides, the strides' alignment (VPC and JPEGE: width stride a multiple of 16,
height stride of 2; JPEGD output: 64 and 16; packed RGB strides count bytes), its size against the layout
and its memory against DVPP memory of ``acl.media.dvpp_malloc`` on the stream's device -- any of these
wrong is ACL_ERROR_INVALID_PARAM (100000) and nothing is queued.  It then only ORDERS the device: the
engine's task (:mod:`devices.ops.dvpp`) is queued on ``stream`` after the stream's earlier work, followed
by a host function that copies the task's result into the host-side descriptors (a decoded picture's
width and height, ``ret_code``; JPEGE's stream length into the caller's host ``size``).  The outputs are
there once ``acl.rt.synchronize_stream`` (or a later task of the stream) has seen the task complete; an
engine failure (a stream that does not decode, a picture larger than its canvas) is reported by that
synchronize as ACL_ERROR_FAILURE (500001) and leaves ``ret_code`` non-zero.
"""
from __future__ import annotations

import io
import logging

import numpy as np

from devices.arena import is_device_ptr
from devices.kernel import TensorDesc
from devices.ops.picture import (INTERP_BILINEAR, INTERP_DEFAULT, PACKED, PIXEL_FORMAT_RGB_888,
                                 PIXEL_FORMAT_RGBA_8888, PIXEL_FORMAT_YUV_400, YUV420SP, Pic)
from runtime import api

from ._args import as_int, host_range, host_view, invalid
from ._calls import acl_call
from ._media import (batch_pics, channel_record, jpege_record, pic_record, resize_record, roi_record)
from ._media_state import MEDIA, ChannelDesc, PicDesc, VideoChannelDesc, find_dvpp
from ._state import STATE, current_context, stream_record

ACL_NAMESPACE = "acl.media"

log = logging.getLogger("vnpu.acl")

#: VPC picture and ROI limits: 10 x 6 to 8192 x 8192 pixels (CANN VPC restrictions: [10x6, 4096x4096],
#: and up to 8192 x 8192 for resize)
VPC_MIN, VPC_MAX = (10, 6), (8192, 8192)
#: JPEGE input limits (CANN JPEGE restrictions: 32 x 32 to 8192 x 8192)
JPEGE_MIN, JPEGE_MAX = (32, 32), (8192, 8192)
#: stride alignment of VPC and JPEGE pictures (width, height) and of JPEGD's output canvas (CANN: 128 on
#: Ascend 310, 64 on 310P for the width; 16 for the height -- vnpu takes the smaller width rule)
VPC_ALIGN = (16, 2)
JPEGD_ALIGN = (64, 16)
#: the canvas dvpp_jpeg_predict_dec_size / dvpp_png_predict_dec_size size for (CANN's JPEGD rule on 310)
PREDICT_ALIGN = (128, 16)
#: the paste ROI's left edge alignment (CANN VPC crop-and-paste restriction)
PASTE_LEFT_ALIGN = 16


# ---------------------------------------------------------------------------------------------- checks
def _align(n: int, k: int) -> int:
    return -(-n // k) * k


def dvpp_range(ptr: int, nbytes: int, what: str, dev: api.Device) -> None:
    """``[ptr, ptr + nbytes)`` must be DVPP memory of ``dev`` (100000 otherwise)."""
    if not ptr:
        raise invalid(f"{what} address is NULL")
    a = find_dvpp(ptr, nbytes)
    if a is None:
        raise invalid(f"{what} [0x{ptr:x}, +{nbytes}) is not inside DVPP memory of acl.media.dvpp_malloc")
    if a.dev is not dev:
        raise invalid(f"{what} 0x{ptr:x} is DVPP memory of another device than the stream's")


def checked_pic(d: PicDesc, role: str, formats, align, dev: api.Device, lo=VPC_MIN, hi=VPC_MAX,
         sized: bool = True) -> Pic:
    """A checked picture description (see the module docstring); ``sized`` False for an output whose
    width and height the engine fills (JPEGD / PNGD)."""
    if d.format not in formats:
        raise invalid(f"{role}: pixel format {d.format} is not one this engine takes ({sorted(formats)})")
    bpp = PACKED[d.format][0] if d.format in PACKED else 1
    wa, ha = align
    if d.width_stride % wa or d.height_stride % ha or not d.width_stride or not d.height_stride:
        raise invalid(f"{role}: width stride {d.width_stride} must be a positive multiple of {wa} and height "
                      f"stride {d.height_stride} of {ha}")
    if sized:
        if not (lo[0] <= d.width <= hi[0] and lo[1] <= d.height <= hi[1]):
            raise invalid(f"{role}: {d.width}x{d.height} is outside {lo[0]}x{lo[1]} .. {hi[0]}x{hi[1]}")
        if d.width * bpp > d.width_stride or d.height > d.height_stride:
            raise invalid(f"{role}: {d.width}x{d.height} does not fit its strides {d.width_stride}x"
                          f"{d.height_stride}" + (" (packed formats count the width stride in bytes)" if bpp > 1
                                                  else ""))
    p = Pic(d.format, d.width, d.height, d.width_stride, d.height_stride)
    if d.size < p.buffer_size:
        raise invalid(f"{role}: size {d.size} is smaller than the {p.buffer_size} bytes its layout spans")
    dvpp_range(d.data, p.buffer_size, role, dev)
    return p


def _roi(r, role: str, width: int, height: int, yuv: bool = True) -> tuple[int, int, int, int]:
    """An ROI inside a ``width x height`` picture; for YUV420SP left / top even and right / bottom odd."""
    left, right, top, bottom = r.box
    if not (left <= right < width and top <= bottom < height):
        raise invalid(f"{role} ({left}, {right}, {top}, {bottom}) is not inside the {width}x{height} picture")
    if yuv and (left % 2 or top % 2 or right % 2 == 0 or bottom % 2 == 0):
        raise invalid(f"{role} ({left}, {right}, {top}, {bottom}): YUV420SP needs left and top even, right "
                      f"and bottom odd")
    w, h = right - left + 1, bottom - top + 1
    if w < VPC_MIN[0] or h < VPC_MIN[1]:
        raise invalid(f"{role} is {w}x{h}, below the VPC minimum {VPC_MIN[0]}x{VPC_MIN[1]}")
    return left, right, top, bottom


def pic_tuple(p: Pic) -> tuple[int, int, int, int, int]:
    return p.format, p.width, p.height, p.width_stride, p.height_stride


# ---------------------------------------------------------------------------------------------- launch
def launch_task(kernel: str, ch: ChannelDesc | VideoChannelDesc, rec, src: tuple[int, int], dst: tuple[int, int], attrs: dict,
            done) -> None:
    """Queue engine task ``kernel`` on stream record ``rec`` and, after it, a host function that reads
    its result (int32 [ret_code, width, height, bytes]) and calls ``done(result)``."""
    dev = rec.ctx.dev
    res = dev.malloc(16)
    with STATE.lock:
        STATE.dev_allocs[res] = dev
        ch.pending.add(res)
    try:
        rec.stream.launch(kernel, [TensorDesc(src[0], (src[1],), "uint8")],
                          [TensorDesc(dst[0], (dst[1],), "uint8"), TensorDesc(res, (4,), "int32")], attrs, 1)
    except BaseException:
        _release(ch, dev, res)
        raise

    def read_back() -> None:
        try:
            done(dev.memcpy_d2h(res, 16).view(np.int32).copy())
        except Exception:  # noqa: BLE001 - a runtime thread: the task's own error is the stream's
            log.debug("reading a DVPP task's result failed", exc_info=True)
        finally:
            _release(ch, dev, res)

    rec.stream.launch_host_func(read_back, blocking=True)


def _release(ch: ChannelDesc | VideoChannelDesc, dev: api.Device, res: int) -> None:
    with STATE.lock:
        ch.pending.discard(res)
        if STATE.dev_allocs.pop(res, None) is None:
            return                                   # acl.finalize freed it already
    try:
        dev.free(res)
    except Exception:  # noqa: BLE001 - the device may be gone (finalize, lost device)
        log.debug("freeing a DVPP result buffer failed", exc_info=True)


def _set_pic(d: PicDesc, sized: bool = False):
    def done(r) -> None:
        d.ret_code = int(r[0])
        if sized and r[0] == 0:
            d.width, d.height = int(r[1]), int(r[2])
    return done


# ---------------------------------------------------------------------------------------------- JPEG / PNG info
def _stream_bytes(data, size) -> bytes:
    """The bytes of an encoded picture at ``data`` (host memory, or device memory of the current device)."""
    n = as_int(size, "size")
    p = 0 if data is None else as_int(data, "data")
    if p == 0 or n <= 0:
        raise invalid(f"picture data {p:#x} of {n} bytes: NULL or empty")
    if is_device_ptr(p):
        return current_context().dev.memcpy_d2h(p, n).tobytes()
    return host_view(p, n, "data").tobytes()


def _header(data, size, kind: str):
    from PIL import Image, UnidentifiedImageError
    try:
        im = Image.open(io.BytesIO(_stream_bytes(data, size)), formats=[kind])
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as e:
        raise invalid(f"not a {kind} stream: {e}") from None
    return im


@acl_call(outs=(0, 0, 0))
def dvpp_jpeg_get_image_info(data, size):
    """acldvppJpegGetImageInfo -> (width, height, components, ret) from the JPEG header (host memory, or
    device memory of the current device).  Host-synchronous; 100000 for what is not a JPEG stream."""
    im = _header(data, size, "JPEG")
    return im.size[0], im.size[1], len(im.getbands())


@acl_call(outs=(0,))
def dvpp_jpeg_predict_dec_size(data, size, output_pixel_format):
    """acldvppJpegPredictDecSize -> (bytes, ret): the output buffer JPEGD needs for the stream, on a canvas
    of 128 x 16 aligned strides (YUV420SP: 3/2 bytes per canvas pixel; YUV400: 1)."""
    fmt = as_int(output_pixel_format, "output pixel format")
    if fmt not in YUV420SP + (PIXEL_FORMAT_YUV_400,):
        raise invalid(f"JPEGD does not output pixel format {fmt}")
    w, h = _header(data, size, "JPEG").size
    return Pic(fmt, w, h, _align(w, PREDICT_ALIGN[0]), _align(h, PREDICT_ALIGN[1])).buffer_size


@acl_call(outs=(0, 0, 0))
def dvpp_png_get_image_info(data, size):
    """acldvppPngGetImageInfo -> (width, height, components, ret) from the PNG header."""
    im = _header(data, size, "PNG")
    return im.size[0], im.size[1], len(im.getbands())


@acl_call(outs=(0,))
def dvpp_png_predict_dec_size(data, size, output_pixel_format):
    """acldvppPngPredictDecSize -> (bytes, ret) for RGB888 / RGBA8888 output (a width stride of the row's
    bytes aligned to 128, height aligned to 16)."""
    fmt = as_int(output_pixel_format, "output pixel format")
    if fmt not in (PIXEL_FORMAT_RGB_888, PIXEL_FORMAT_RGBA_8888):
        raise invalid(f"PNGD does not output pixel format {fmt}")
    w, h = _header(data, size, "PNG").size
    return _align(w * PACKED[fmt][0], PREDICT_ALIGN[0]) * _align(h, PREDICT_ALIGN[1])


# ---------------------------------------------------------------------------------------------- decoders
def _decode(kernel: str, channel_desc, data, size, output_desc, stream, formats, align) -> None:
    ch = channel_record(channel_desc)
    rec = stream_record(stream)
    dev = rec.ctx.dev
    src, n = (0 if data is None else as_int(data, "data")), as_int(size, "size")
    if n <= 0:
        raise invalid(f"stream size must be positive, got {n}")
    dvpp_range(src, n, "input stream", dev)
    d = pic_record(output_desc)
    out = checked_pic(d, "output picture", formats, align, dev, sized=False)
    launch_task(kernel, ch, rec, (src, n), (d.data, out.buffer_size), {"dst": pic_tuple(out)},
                _set_pic(d, sized=True))


@acl_call()
def dvpp_jpeg_decode_async(channel_desc, data, size, output_desc, stream):
    """acldvppJpegDecodeAsync: decode the JPEG stream at ``data`` (DVPP memory) into ``output_desc``'s
    canvas, YUV420SP NV12 / NV21 or YUV400, picture at the top-left (chroma 4:2:0 by 2x2 means of the
    decoder's YCbCr).  Orders the device only; after synchronize the description's width and height are
    the decoded picture's."""
    _decode("dvpp_jpegd", channel_desc, data, size, output_desc, stream, YUV420SP + (PIXEL_FORMAT_YUV_400,),
            JPEGD_ALIGN)


@acl_call()
def dvpp_png_decode_async(channel_desc, data, size, output_desc, stream):
    """acldvppPngDecodeAsync: decode the PNG stream at ``data`` into packed RGB888 / RGBA8888 (width stride
    in bytes, a multiple of 16; height stride of 2).  Orders the device only."""
    _decode("dvpp_pngd", channel_desc, data, size, output_desc, stream,
            (PIXEL_FORMAT_RGB_888, PIXEL_FORMAT_RGBA_8888), VPC_ALIGN)


# ---------------------------------------------------------------------------------------------- JPEGE
@acl_call(outs=(0,))
def dvpp_jpeg_predict_enc_size(input_desc, config):
    """acldvppJpegPredictEncSize -> (bytes, ret): a bound on the JPEG stream of the picture (3 bytes per
    canvas pixel plus 4 KiB of headers: above what any quality level produces)."""
    jpege_record(config)
    d = pic_record(input_desc)
    if d.format not in YUV420SP:
        raise invalid(f"JPEGE takes YUV420SP input, not pixel format {d.format}")
    return _align(max(d.width_stride, d.width), 16) * _align(max(d.height_stride, d.height), 16) * 3 + 4096


@acl_call()
def dvpp_jpeg_encode_async(channel_desc, input_desc, data, size, config, stream):
    """acldvppJpegEncodeAsync: encode the YUV420SP picture into a JPEG stream at ``data`` (DVPP memory).
    ``size`` is the HOST address of a uint32 holding the buffer's bytes; once the task completed it holds
    the stream's length.  Orders the device only."""
    ch = channel_record(channel_desc)
    level = jpege_record(config).level
    rec = stream_record(stream)
    dev = rec.ctx.dev
    d = pic_record(input_desc)
    p = checked_pic(d, "input picture", YUV420SP, VPC_ALIGN, dev, JPEGE_MIN, JPEGE_MAX)
    cell = host_range(size, 4, "size")
    box = cell.view(as_int(size, "size"), 4).view(np.uint32)
    cap = int(box[0])
    dst = 0 if data is None else as_int(data, "data")
    if cap <= 0:
        raise invalid("the output buffer size (*size) is 0")
    dvpp_range(dst, cap, "output buffer", dev)

    def done(r) -> None:
        if r[0] == 0:
            box[0] = int(r[3])
        _ = cell                                     # the host buffer stays registered until now

    launch_task("dvpp_jpege", ch, rec, (d.data, p.buffer_size), (dst, cap),
                {"src": pic_tuple(p), "level": max(1, level)}, done)


# ---------------------------------------------------------------------------------------------- VPC
def _vpc(rec, sd: PicDesc, dd: PicDesc, src_fmts, dst_fmts) -> tuple[Pic, Pic]:
    dev = rec.ctx.dev
    sp = checked_pic(sd, "input picture", src_fmts, VPC_ALIGN, dev)
    dp = checked_pic(dd, "output picture", dst_fmts, VPC_ALIGN, dev)
    return sp, dp


def _queue_vpc(ch, rec, sd: PicDesc, dd: PicDesc, sp: Pic, dp: Pic, attrs: dict) -> None:
    attrs = dict(attrs, src=pic_tuple(sp), dst=pic_tuple(dp))
    launch_task("dvpp_vpc", ch, rec, (sd.data, sp.buffer_size), (dd.data, dp.buffer_size), attrs, _set_pic(dd))


def _interp(resize_config) -> int:
    if resize_config is None or resize_config == 0:
        return INTERP_BILINEAR
    v = resize_record(resize_config).interpolation
    return INTERP_BILINEAR if v == INTERP_DEFAULT else v


@acl_call()
def dvpp_vpc_resize_async(channel_desc, input_desc, output_desc, resize_config, stream):
    """acldvppVpcResizeAsync: the whole YUV420SP input scaled to the output's width x height (bilinear,
    or nearest with interpolation 2).  Orders the device only."""
    ch, rec = channel_record(channel_desc), stream_record(stream)
    sd, dd = pic_record(input_desc), pic_record(output_desc)
    sp, dp = _vpc(rec, sd, dd, YUV420SP, YUV420SP)
    _queue_vpc(ch, rec, sd, dd, sp, dp, {"op": "resize", "interp": _interp(resize_config)})


@acl_call()
def dvpp_vpc_crop_async(channel_desc, input_desc, output_desc, crop_area, stream):
    """acldvppVpcCropAsync: the crop ROI scaled to the output's width x height.  Orders the device only."""
    ch, rec = channel_record(channel_desc), stream_record(stream)
    sd, dd = pic_record(input_desc), pic_record(output_desc)
    sp, dp = _vpc(rec, sd, dd, YUV420SP, YUV420SP)
    crop = _roi(roi_record(crop_area), "crop area", sp.width, sp.height)
    _queue_vpc(ch, rec, sd, dd, sp, dp, {"op": "crop", "crop": crop})


def _crop_paste(ch, rec, sd, dd, crop_area, paste_area) -> None:
    sp, dp = _vpc(rec, sd, dd, YUV420SP, YUV420SP)
    crop = _roi(roi_record(crop_area), "crop area", sp.width, sp.height)
    paste = _roi(roi_record(paste_area), "paste area", dp.width, dp.height)
    if paste[0] % PASTE_LEFT_ALIGN:
        raise invalid(f"paste area left {paste[0]} must be a multiple of {PASTE_LEFT_ALIGN}")
    _queue_vpc(ch, rec, sd, dd, sp, dp, {"op": "paste", "crop": crop, "paste": paste})


@acl_call()
def dvpp_vpc_crop_and_paste_async(channel_desc, input_desc, output_desc, crop_area, paste_area, stream):
    """acldvppVpcCropAndPasteAsync: the crop ROI scaled into the paste ROI of the output; the rest of the
    output keeps its bytes.  Orders the device only."""
    ch, rec = channel_record(channel_desc), stream_record(stream)
    _crop_paste(ch, rec, pic_record(input_desc), pic_record(output_desc), crop_area, paste_area)


@acl_call()
def dvpp_vpc_convert_color_async(channel_desc, input_desc, output_desc, stream):
    """acldvppVpcConvertColorAsync: YUV420SP (NV12 / NV21) <-> packed RGB888 / BGR888 / RGBA8888 / BGRA8888
    (full-range BT.601), same width and height.  Orders the device only."""
    ch, rec = channel_record(channel_desc), stream_record(stream)
    sd, dd = pic_record(input_desc), pic_record(output_desc)
    fmts = YUV420SP + tuple(PACKED)
    sp, dp = _vpc(rec, sd, dd, fmts, fmts)
    if (sp.width, sp.height) != (dp.width, dp.height):
        raise invalid(f"colour conversion keeps the size: input {sp.width}x{sp.height}, output "
                      f"{dp.width}x{dp.height}")
    if (sp.format in PACKED) == (dp.format in PACKED) and not (sp.format in YUV420SP and dp.format in YUV420SP):
        raise invalid(f"no conversion from pixel format {sp.format} to {dp.format}")
    _queue_vpc(ch, rec, sd, dd, sp, dp, {"op": "convert"})


def _batch(src_batch, roi_nums, dst_batch, crops, pastes=None):
    """The (input, output, crop, paste) of each ROI of a batch call, checked for counts."""
    srcs, dsts = batch_pics(src_batch), batch_pics(dst_batch)
    nums = [as_int(n, "roi num") for n in roi_nums]
    if len(nums) != len(srcs) or any(n < 0 for n in nums):
        raise invalid(f"roi_nums {nums} must give a count for each of the {len(srcs)} input pictures")
    total = sum(nums)
    if not 1 <= total <= 256 or total != len(dsts) or len(crops) != total or (
            pastes is not None and len(pastes) != total):
        raise invalid(f"{total} ROIs need as many output pictures ({len(dsts)}), crop areas ({len(crops)})"
                      + ("" if pastes is None else f" and paste areas ({len(pastes)})") + ", at most 256")
    owners = [s for s, n in zip(srcs, nums) for _ in range(n)]
    return list(zip(owners, dsts, crops, pastes if pastes is not None else [None] * total))


@acl_call(outs=(0,))
def dvpp_vpc_batch_crop_async(channel_desc, src_batch_pic_descs, roi_nums, dst_batch_pic_descs, crop_areas,
                              stream):
    """acldvppVpcBatchCropAsync -> (dst_batch_pic_descs, ret): ``roi_nums[i]`` crops of input ``i``, each
    scaled to its output picture.  All are checked before any is queued.  Orders the device only."""
    ch, rec = channel_record(channel_desc), stream_record(stream)
    jobs = _batch(src_batch_pic_descs, roi_nums, dst_batch_pic_descs, list(crop_areas))
    plans = []
    for sd, dd, crop_area, _ in jobs:
        sp, dp = _vpc(rec, sd, dd, YUV420SP, YUV420SP)
        plans.append((sd, dd, sp, dp, _roi(roi_record(crop_area), "crop area", sp.width, sp.height)))
    for sd, dd, sp, dp, crop in plans:
        _queue_vpc(ch, rec, sd, dd, sp, dp, {"op": "crop", "crop": crop})
    return dst_batch_pic_descs


@acl_call(outs=(0,))
def dvpp_vpc_batch_crop_and_paste_async(channel_desc, src_batch_pic_descs, roi_nums, dst_batch_pic_descs,
                                        crop_areas, paste_areas, stream):
    """acldvppVpcBatchCropAndPasteAsync -> (dst_batch_pic_descs, ret): as dvpp_vpc_batch_crop_async, each
    crop scaled into its paste ROI.  Orders the device only."""
    ch, rec = channel_record(channel_desc), stream_record(stream)
    jobs = _batch(src_batch_pic_descs, roi_nums, dst_batch_pic_descs, list(crop_areas), list(paste_areas))
    for sd, dd, crop_area, paste_area in jobs:           # check every one before queueing any
        sp, dp = _vpc(rec, sd, dd, YUV420SP, YUV420SP)
        _roi(roi_record(crop_area), "crop area", sp.width, sp.height)
        _roi(roi_record(paste_area), "paste area", dp.width, dp.height)
    for sd, dd, crop_area, paste_area in jobs:
        _crop_paste(ch, rec, sd, dd, crop_area, paste_area)
    return dst_batch_pic_descs


def pending_results() -> int:
    """Result buffers of engine tasks not read back yet, over every channel (tests, diagnostics)."""
    with MEDIA.lock:
        return sum(len(ch.pending) for ch in MEDIA.channels.values())
