"""The implementation of ``acl.media``'s video codecs (:mod:`runtime.acl.media` lists the API): VDEC
(``vdec_*``, H.264 / H.265 -> YUV420SP) and VENC (``venc_*``, YUV420SP -> H.264 / H.265), on the device's
video engines (:mod:`devices.ops.dvpp_video`, FFmpeg's codecs through PyAV).

pyACL's flow: a channel description names a callback and the thread that runs it (a thread looping on
``acl.rt.process_report``); ``*_create_channel`` opens the channel -- here: a stream of the current context
of its own, with that thread subscribed to it, and a random key for its codec on the device.
``*_send_frame`` checks its descriptors on the host (100000 for a bad one: the same picture checks as
the VPC's, :mod:`runtime.acl._media_ops`) and only orders the device: the engine's task on the channel's
stream, then a host function that fills the descriptors (picture width / height / ``ret_code``; the
output stream's data / size / ``ret_code``), then the callback -- ``callback(input_stream_desc,
output_pic_desc, user_data)`` for VDEC, ``callback(input_pic_desc, output_stream_desc, user_data)`` for
VENC -- run by the subscribed thread in ``process_report``.  A frame that does not decode is reported in
its picture's ``ret_code``, not as a stream error.  ``*_destroy_channel`` closes the codec and waits for
every frame sent and its callback (host-blocking: the callback thread must still be running), then
destroys the channel's stream.

VENC's output: each frame's packets in DVPP memory of the channel (the output stream description's data
and size), valid while the callback runs; freed after it.  VENC's settings take effect at
``venc_create_channel``: picture format NV12 / NV21, width and height (even, 128 .. 4096), key frame
interval, encoder type (0 H.265 main, 1 / 2 / 3 H.264 baseline / main / high).  A frame configuration's
``force_i_frame`` makes that picture a key frame; its ``eos`` flushes the encoder with the picture (or
alone, with input picture 0) and closes the codec (the next frame opens a new one).
"""
from __future__ import annotations

import uuid

from devices.ops.picture import YUV420SP, Pic
from runtime import api

from ._args import invalid
from ._calls import acl_call
from ._media import dvpp_alloc, dvpp_release, pic_record, stream_desc_record
from ._media_desc import Check, CodecDescKind, bounded, callback, flag, integer
from ._media_ops import VPC_ALIGN, checked_pic, dvpp_range, launch_task, pic_tuple
from ._media_state import MEDIA, FrameConfig, StreamDesc, VideoChannelDesc
from ._state import STATE, add_object, current_context, new_stream

ACL_NAMESPACE = "acl.media"

#: acldvppStreamFormat / enType: 0 H.265 main, 1..3 H.264 baseline / main / high
H265_MAIN, H264_BASELINE, H264_MAIN, H264_HIGH = 0, 1, 2, 3
_DECODER = {H265_MAIN: "hevc", H264_BASELINE: "h264", H264_MAIN: "h264", H264_HIGH: "h264"}
_ENCODER = {H265_MAIN: "libx265", H264_BASELINE: "libx264", H264_MAIN: "libx264", H264_HIGH: "libx264"}
#: VENC picture limits (even width and height)
VENC_MIN, VENC_MAX = 128, 4096
#: VENC output buffer: the picture's YUV bytes plus this much (no frame's packets come near it)
VENC_OUT_EXTRA = 64 << 10
#: a close task's scratch (its input and output tensors; the codec's state is what it drops)
_CLOSE_BYTES = 64


# ---------------------------------------------------------------------------------------------- shared
def _kinds(kind: str) -> tuple[CodecDescKind, CodecDescKind]:
    """The channel description and the frame configuration of ``kind``."""
    return (CodecDescKind(kind, "channel_desc", "video", "channel description"),
            CodecDescKind(kind, "frame_config", "frames", "frame configuration"))


#: a new frame configuration's settings
_NEW_FRAME = {"eos": 0, "force_i_frame": 0}


def _created(kinds: CodecDescKind, h) -> VideoChannelDesc:
    d = kinds.record(h)
    if not d.created:
        raise invalid(f"{d.kind.upper()} channel 0x{d.handle:x} is not created")
    return d


def _venc_side(what: str) -> Check:
    return bounded(what, lambda n: VENC_MIN <= n <= VENC_MAX and not n % 2,
                   f"VENC picture {what} {{}} must be even, {VENC_MIN} .. {VENC_MAX}")


_ENTYPE = bounded("en_type", lambda v: v in _DECODER, "en_type {} is not 0 (H.265 main) .. 3 (H.264 high)")


def _open(d: VideoChannelDesc, need: tuple[str, ...]) -> None:
    """Create the channel: its stream, the callback thread subscribed to it, the codec's key."""
    if d.created:
        raise invalid(f"{d.kind.upper()} channel 0x{d.handle:x} is already created")
    missing = [k for k in need if k not in d.settings]
    if missing:
        raise invalid(f"{d.kind.upper()} channel description lacks {', '.join(missing)}")
    if not callable(d.settings["callback"]):
        raise invalid("the channel's callback is not callable")
    if d.settings.get("entype", H265_MAIN) not in _DECODER:
        raise invalid(f"encoder type {d.settings['entype']} is not 0 (H.265 main) .. 3 (H.264 high)")
    rec = new_stream(current_context(), 0, 0)
    with STATE.lock:
        rec.subscriber = d.settings["thread_id"]
        STATE.cv.notify_all()
    d.stream, d.key, d.created = rec, uuid.uuid4().hex, True


def _close(d: VideoChannelDesc, kernel: str) -> None:
    """Close the codec, wait for every frame and callback, destroy the channel's stream."""
    rec = d.stream
    dev = rec.ctx.dev
    scratch = dvpp_alloc(dev, _CLOSE_BYTES)
    try:
        launch_task(kernel, d, rec, (scratch, 16), (scratch + 16, 16), {"key": d.key, "op": "close"},
                    lambda r: None)
        rec.stream.synchronize()
    finally:
        d.created = False
        with STATE.lock:
            STATE.streams.pop(rec.handle, None)
            rec.ctx.streams.discard(rec.handle)
            rec.subscriber = None
            STATE.cv.notify_all()
        try:
            rec.stream.destroy()
        finally:
            dvpp_release(scratch)


def _callback(d: VideoChannelDesc, rec, args) -> None:
    """Queue the channel's callback after the frame's task (run by the subscribed thread)."""
    fn = d.settings["callback"]
    first, second, user_data = args
    api.callbacks_for(rec.ctx.dev).launch(rec.stream, lambda ud: fn(first, second, ud), user_data, True)


# ---------------------------------------------------------------------------------------------- VDEC
VDEC, VDEC_FRAME = _kinds("vdec")
vdec_create_channel_desc = VDEC.create_call(
    lambda h: VideoChannelDesc(h, "vdec", {"out_pic_format": 1, "entype": 0, "out_mode": 0, "channel_id": 0}),
    "aclvdecCreateChannelDesc -> VDEC channel description (output NV12, H.265 main until set).")
vdec_destroy_channel_desc = VDEC.destroy_call()
vdec_set_channel_desc_channel_id = VDEC.setter("channel_id", integer("channel id"))
vdec_set_channel_desc_thread_id = VDEC.setter("thread_id", integer("thread id"), doc="The thread "
                                              "(``acl.util.start_thread`` id or thread ident) that runs the "
                                              "callbacks in process_report.")
vdec_set_channel_desc_callback = VDEC.setter("callback", callback("VDEC"))
vdec_set_channel_desc_entype = VDEC.setter("entype", _ENTYPE, param="en_type")
vdec_set_channel_desc_out_pic_format = VDEC.setter(
    "out_pic_format", bounded("out pic format", lambda v: v in YUV420SP,
                              "VDEC outputs YUV420SP NV12 (1) or NV21 (2), not {}"))
vdec_set_channel_desc_out_mode = VDEC.setter(
    "out_mode", bounded("out mode", lambda v: v in (0, 1), "out mode {} is not 0 (default) or 1 (fast)"),
    doc="0 default, 1 fast; vnpu's decoder always hands a picture out with its frame.")
vdec_get_channel_desc_out_mode = VDEC.getter("out_mode")
vdec_create_frame_config = VDEC_FRAME.create_call(lambda h: FrameConfig(h, "vdec", dict(_NEW_FRAME)))
vdec_destroy_frame_config = VDEC_FRAME.destroy_call()


@acl_call()
def vdec_create_channel(channel_desc):
    """aclvdecCreateChannel: needs the callback and its thread set."""
    _open(VDEC.record(channel_desc), ("callback", "thread_id"))


@acl_call()
def vdec_destroy_channel(channel_desc):
    """aclvdecDestroyChannel: waits for every frame sent and its callback (host-blocking)."""
    _close(_created(VDEC, channel_desc), "dvpp_vdec")


@acl_call()
def vdec_send_frame(channel_desc, input_stream_desc, output_pic_desc, config, user_data):
    """aclvdecSendFrame: decode one frame of the stream into ``output_pic_desc`` (YUV420SP of the channel's
    format, width stride a multiple of 16, height stride of 2), then call back.  An input stream
    description with ``eos`` set closes the decoder (no picture, no callback).  Orders the device only."""
    d = _created(VDEC, channel_desc)
    if config not in (None, 0):
        VDEC_FRAME.record(config)
    sd: StreamDesc = stream_desc_record(input_stream_desc)
    rec = d.stream
    dev = rec.ctx.dev
    codec = _DECODER[d.settings["entype"]]
    if sd.eos:
        scratch = dvpp_alloc(dev, _CLOSE_BYTES)
        launch_task("dvpp_vdec", d, rec, (scratch, 16), (scratch + 16, 16), {"key": d.key, "op": "close"},
                    lambda r: None)
        rec.stream.launch_host_func(lambda: dvpp_release(scratch), blocking=True)
        return
    if sd.size <= 0:
        raise invalid("the input stream description's size is 0")
    dvpp_range(sd.data, sd.size, "input stream", dev)
    pd = pic_record(output_pic_desc)
    if pd.format != d.settings["out_pic_format"]:
        raise invalid(f"output picture format {pd.format} is not the channel's {d.settings['out_pic_format']}")
    out = checked_pic(pd, "output picture", YUV420SP, VPC_ALIGN, dev, sized=False)

    def done(r) -> None:
        pd.ret_code = int(r[0])
        sd.ret_code = int(r[0])
        if r[0] == 0:
            pd.width, pd.height = int(r[1]), int(r[2])

    launch_task("dvpp_vdec", d, rec, (sd.data, sd.size), (pd.data, out.buffer_size),
                {"key": d.key, "codec": codec, "dst": pic_tuple(out)}, done)
    _callback(d, rec, (input_stream_desc, output_pic_desc, user_data))


# ---------------------------------------------------------------------------------------------- VENC
VENC, VENC_FRAME = _kinds("venc")
venc_create_channel_desc = VENC.create_call(
    lambda h: VideoChannelDesc(h, "venc", {"pic_format": 1, "entype": 0, "key_frame_interval": 16}),
    "aclvencCreateChannelDesc -> VENC channel description (NV12, H.265 main, key frame interval 16).")
venc_destroy_channel_desc = VENC.destroy_call()
venc_set_channel_desc_thread_id = VENC.setter("thread_id", integer("thread id"))
venc_set_channel_desc_callback = VENC.setter("callback", callback("VENC"))
venc_set_channel_desc_entype = VENC.setter("entype", _ENTYPE, param="en_type")
venc_set_channel_desc_pic_format = VENC.setter(
    "pic_format", bounded("pic format", lambda v: v in YUV420SP, "VENC takes YUV420SP NV12 (1) or NV21 (2), not {}"))
venc_set_channel_desc_pic_width = VENC.setter("pic_width", _venc_side("width"), param="width")
venc_set_channel_desc_pic_height = VENC.setter("pic_height", _venc_side("height"), param="height")
venc_set_channel_desc_key_frame_interval = VENC.setter(
    "key_frame_interval", bounded("key frame interval", lambda v: 1 <= v <= 65536,
                                  "key frame interval {} is outside 1 .. 65536"))
venc_create_frame_config = VENC_FRAME.create_call(lambda h: FrameConfig(h, "venc", dict(_NEW_FRAME)))
venc_destroy_frame_config = VENC_FRAME.destroy_call()
venc_set_frame_config_eos = VENC_FRAME.setter("eos", flag("eos"))
venc_set_frame_config_force_i_frame = VENC_FRAME.setter("force_i_frame", flag("force_i_frame"))
venc_get_frame_config_eos = VENC_FRAME.getter("eos")
venc_get_frame_config_force_i_frame = VENC_FRAME.getter("force_i_frame")


@acl_call()
def venc_create_channel(channel_desc):
    """aclvencCreateChannel: needs the callback, its thread, and the picture's width and height."""
    _open(VENC.record(channel_desc), ("callback", "thread_id", "pic_width", "pic_height"))


@acl_call()
def venc_destroy_channel(channel_desc):
    """aclvencDestroyChannel: waits for every frame sent and its callback (host-blocking)."""
    _close(_created(VENC, channel_desc), "dvpp_venc")


@acl_call()
def venc_send_frame(channel_desc, input_pic_desc, reserve, config, user_data):
    """aclvencSendFrame: encode the picture (the channel's format, width and height; strides 16 / 2), then
    call back with an output stream description of the frame's packets.  With the frame configuration's
    eos the encoder is flushed (``input_pic_desc`` may be 0).  Orders the device only."""
    d = _created(VENC, channel_desc)
    fc = VENC_FRAME.record(config)
    rec = d.stream
    dev = rec.ctx.dev
    w, h = d.settings["pic_width"], d.settings["pic_height"]
    attrs: dict = {"key": d.key, "codec": _ENCODER[d.settings["entype"]], "size": (w, h),
                   "gop": d.settings["key_frame_interval"], "force_i": fc.settings["force_i_frame"],
                   "eos": fc.settings["eos"]}
    own_src = input_pic_desc in (None, 0)
    if own_src:
        if not fc.settings["eos"]:
            raise invalid("input picture is NULL (only an eos frame may have none)")
        src = dvpp_alloc(dev, 16)
        src_n = 16
    else:
        pd = pic_record(input_pic_desc)
        if pd.format != d.settings["pic_format"] or (pd.width, pd.height) != (w, h):
            raise invalid(f"input picture ({pd.format}, {pd.width}x{pd.height}) is not the channel's "
                          f"({d.settings['pic_format']}, {w}x{h})")
        p: Pic = checked_pic(pd, "input picture", YUV420SP, VPC_ALIGN, dev, (VENC_MIN, VENC_MIN),
                             (VENC_MAX, VENC_MAX))
        attrs["src"] = pic_tuple(p)
        src, src_n = pd.data, p.buffer_size
    cap = w * h * 3 // 2 + VENC_OUT_EXTRA
    out = dvpp_alloc(dev, cap)
    sd = StreamDesc(0, data=out)

    def done(r) -> None:
        sd.ret_code, sd.size = int(r[0]), int(r[3]) if r[0] == 0 else 0
        sd.eos = int(fc.settings["eos"])

    try:
        launch_task("dvpp_venc", d, rec, (src, src_n), (out, cap), attrs, done)
    except BaseException:
        dvpp_release(out)
        if own_src:
            dvpp_release(src)
        raise
    out_desc = add_object(MEDIA.streams, lambda hd: _bind(sd, hd))
    _callback(d, rec, (input_pic_desc or 0, out_desc, user_data))

    def release() -> None:
        MEDIA.streams.pop(out_desc, None)
        dvpp_release(out)
        if own_src:
            dvpp_release(src)

    rec.stream.launch_host_func(release, blocking=True)


def _bind(sd: StreamDesc, handle: int) -> StreamDesc:
    sd.handle = handle
    return sd
