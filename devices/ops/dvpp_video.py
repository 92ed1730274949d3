"""The DVPP video engines as device tasks: VDEC (``dvpp_vdec``: H.264 / H.265 -> YUV420SP) and VENC
(``dvpp_venc``: YUV420SP -> H.264 / H.265), on FFmpeg's codecs through PyAV (its wheels carry FFmpeg's
h264 / hevc decoders and libx264 / libx265).

A video channel is stateful (reference frames), so each channel's codec lives in the device's process,
keyed by the channel's random ``key`` attribute (the acl layer draws it, :mod:`runtime.acl._media_video`);
a task with ``op="close"`` drops it, and at most :data:`MAX_CHANNELS` stay open (the least recently used
goes first).  The tasks of one channel are ordered by its stream.  Decoding is one frame in, at most one
picture out (a low-latency decoder, one thread): a frame that yields no picture, or a stream that does not
decode, is reported in the picture's ``ret_code`` (the task itself succeeds, as VDEC reports per frame);
pictures a frame yields beyond the first wait for the next frame's output.  Encoding is one picture in,
the packets it yields out (``tune=zerolatency``: one per picture), ``force_i`` making it a key frame;
``eos`` flushes the encoder.

Arguments as :mod:`.dvpp`'s: inputs ``(src uint8[n],)``, outputs ``(dst uint8[m], result int32[4])``,
result ``[ret_code, width, height, bytes]``.
"""
from __future__ import annotations

import collections
import fractions
import threading
from typing import Callable

import numpy as np

from ..chip import Work
from .checks import need
from .dvpp import engine_task, pic_attr
from .picture import Pic, read_yuv, write_yuv

#: open codecs kept per device process
MAX_CHANNELS = 256
#: ret_code of a frame that produced no picture / did not decode / a picture that does not fit its canvas
RET_NO_PICTURE, RET_BAD_STREAM, RET_TOO_LARGE = 2, 3, 4

_lock = threading.Lock()
_codecs: "collections.OrderedDict[str, _Channel]" = collections.OrderedDict()


class _Channel:
    def __init__(self, ctx):
        self.ctx = ctx
        self.waiting: collections.deque = collections.deque()     # decoded pictures not handed out yet
        self.pts = 0


def _channel(key: str, make) -> _Channel:
    with _lock:
        ch = _codecs.get(key)
        if ch is None:
            ch = _codecs[key] = _Channel(make())
            while len(_codecs) > MAX_CHANNELS:
                _codecs.popitem(last=False)
        _codecs.move_to_end(key)
        return ch


def _close(key: str) -> None:
    with _lock:
        _codecs.pop(key, None)


def open_channels() -> int:
    """Codecs open in this process (tests, diagnostics)."""
    with _lock:
        return len(_codecs)


def _check_key(name: str, inputs, outputs, attrs) -> None:
    need(isinstance(attrs.get("key"), str) and attrs["key"], name, "attr 'key' (the channel) is required")


def _work(unit: str):
    def work(inputs, outputs, attrs):
        p = attrs.get("src") or attrs.get("dst")
        px = 0 if p is None else int(p[3]) * int(p[4])
        return Work(unit=unit, pixels=float(px), bytes=float(inputs[0].nbytes + outputs[0].nbytes))
    return work


def codec_task(name: str) -> Callable[[Callable], Callable]:
    """Decorator: :func:`.dvpp.engine_task` for a codec of a channel (attr ``key``): a task with
    ``op="close"`` drops the channel's codec; any other runs ``body(src, dst, result, attrs)``."""
    def deco(body: Callable) -> Callable:
        def run(src, dst, result, attrs):
            if attrs.get("op") == "close":
                _close(attrs["key"])
                return
            body(src, dst, result, attrs)
        run.__name__, run.__doc__ = body.__name__, body.__doc__
        return engine_task(name, _check_key, _work)(run)
    return deco


def _decoder(codec: str):
    import av
    ctx = av.CodecContext.create(codec, "r")
    ctx.thread_count = 1                      # no frame threading: a frame's picture comes with it
    return ctx


@codec_task("dvpp_vdec")
def dvpp_vdec(src, dst, result, attrs):
    """One frame of an H.264 / H.265 elementary stream -> a YUV420SP picture on the output canvas."""
    import av
    ch = _channel(attrs["key"], lambda: _decoder(str(attrs.get("codec", "h264"))))
    try:
        for frame in ch.ctx.decode(av.Packet(src.tobytes())):
            ch.waiting.append(frame.to_ndarray(format="nv12"))
    except (av.error.FFmpegError, ValueError):   # a frame that does not decode: this picture's ret_code
        result[0] = RET_BAD_STREAM
        ch.waiting.clear()
        return
    if not ch.waiting:
        result[0] = RET_NO_PICTURE
        return
    nv = ch.waiting.popleft()
    h, w = nv.shape[0] * 2 // 3, nv.shape[1]
    out = pic_attr(attrs, "dst")
    pic = Pic(out.format, w, h, out.width_stride, out.height_stride)
    if w > out.width_stride or h > out.height_stride or pic.buffer_size > dst.size:
        result[0] = RET_TOO_LARGE
        return
    write_yuv(dst, pic, nv[:h], nv[h:].reshape(h // 2, w // 2, 2))
    result[1:] = (w, h, pic.buffer_size)


def _encoder(codec: str, w: int, h: int, gop: int):
    import av
    ctx = av.CodecContext.create(codec, "w")
    ctx.width, ctx.height, ctx.pix_fmt = w, h, "yuv420p"
    ctx.time_base = fractions.Fraction(1, 25)
    ctx.gop_size = max(1, gop)
    opts = {"preset": "ultrafast", "tune": "zerolatency"}
    if codec == "libx265":
        opts["x265-params"] = "log-level=error"
    ctx.options = opts
    return ctx


@codec_task("dvpp_venc")
def dvpp_venc(src, dst, result, attrs):
    """A YUV420SP picture -> the encoded packets it yields (``eos``: the encoder's remaining ones)."""
    import av
    key = attrs["key"]
    w, h = int(attrs["size"][0]), int(attrs["size"][1])
    ch = _channel(key, lambda: _encoder(str(attrs.get("codec", "libx264")), w, h, int(attrs.get("gop", 16))))
    frame = None
    if "src" in attrs:
        p = pic_attr(attrs, "src")
        y, uv = read_yuv(src, p)
        nv = np.concatenate([y, uv.reshape(uv.shape[0], uv.shape[1] * 2)])
        frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(nv), format="nv12")
        frame.pts = ch.pts
        ch.pts += 1
        if attrs.get("force_i"):
            frame.pict_type = av.video.frame.PictureType.I
    try:
        data = b"".join(bytes(pk) for pk in ch.ctx.encode(frame))
        if attrs.get("eos") and frame is not None:
            data += b"".join(bytes(pk) for pk in ch.ctx.encode(None))
    except (av.error.FFmpegError, ValueError):
        result[0] = RET_BAD_STREAM
        return
    if attrs.get("eos"):
        _close(key)
    if len(data) > dst.size:
        result[0] = RET_TOO_LARGE
        return
    dst[:len(data)] = np.frombuffer(data, np.uint8)
    result[1:] = (w, h, len(data))

