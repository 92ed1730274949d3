"""acl.media VDEC / VENC (H.264 / H.265) in pyACL's callback pattern: a ``util.start_thread`` thread loops on
``process_report`` and runs the channels' callbacks.  In-process devices.

References are PyAV used directly in the test (FFmpeg's codecs, as the device uses them, but driven
independently): VDEC's pictures must equal, byte for byte, what PyAV's own decoder makes of the same
packets; VENC's stream must decode (with PyAV) to the pictures sent, within the loss of the encoder at
its default quality, with key frames where the interval and ``force_i_frame`` put them.
"""
from __future__ import annotations

import fractions
import threading

import av
import numpy as np
import pytest

from acl_checks import ok
from conftest import installed, make_local_runtime
from devices.errors import ACL_ERROR_INVALID_PARAM
from runtime import acl

m = acl.media
NV12, NV21 = 1, 2
H265, H264 = 0, 1
W, H = 160, 128
WAIT_S = 20


@pytest.fixture(scope="module")
def rt():
    with installed(make_local_runtime(1)) as r:
        yield r


class Reporter:
    """The callback thread of the public samples: loops on process_report until stopped."""

    def __init__(self, ctx):
        self.stop = threading.Event()

        def loop(_):
            acl.rt.set_context(ctx)
            while not self.stop.is_set():
                acl.rt.process_report(20)
        self.tid = ok(acl.util.start_thread(loop, None))

    def close(self):
        self.stop.set()
        ok(acl.util.stop_thread(self.tid))


@pytest.fixture
def cb(rt):
    acl.finalize()
    ok(acl.init())
    ok(acl.rt.set_device(0))
    r = Reporter(ok(acl.rt.get_context()))
    try:
        yield r
    finally:
        r.close()
        acl.finalize()


def frames(n: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """``n`` moving NV12 pictures (Y, interleaved UV rows)."""
    yy, xx = np.mgrid[0:H, 0:W]
    out = []
    for i in range(n):
        y = ((xx * 2 + yy + 12 * i) % 220 + 16).astype(np.uint8)
        uv = np.empty((H // 2, W), np.uint8)
        uv[:, 0::2] = (96 + i * 8) % 256
        uv[:, 1::2] = 160 - i * 4
        out.append((y, uv))
    return out


def put(data: bytes | np.ndarray) -> int:
    b = data.tobytes() if isinstance(data, np.ndarray) else data
    p = ok(m.dvpp_malloc(len(b)))
    ok(acl.rt.memcpy(p, len(b), acl.util.bytes_to_ptr(b), len(b), 1))
    return p


def get(ptr: int, n: int) -> np.ndarray:
    out = np.zeros(n, np.uint8)
    ok(acl.rt.memcpy(acl.util.numpy_to_ptr(out), n, ptr, n, 2))
    return out


def pic(ptr, fmt=NV12, w=W, h=H) -> int:
    d = m.dvpp_create_pic_desc()
    for f, v in ((m.dvpp_set_pic_desc_data, ptr), (m.dvpp_set_pic_desc_size, W * H * 3 // 2),
                 (m.dvpp_set_pic_desc_format, fmt), (m.dvpp_set_pic_desc_width, w), (m.dvpp_set_pic_desc_height, h),
                 (m.dvpp_set_pic_desc_width_stride, W), (m.dvpp_set_pic_desc_height_stride, H)):
        ok(f(d, v))
    return d


def pyav_encode(codec: str, pics) -> list[bytes]:
    enc = av.CodecContext.create(codec, "w")
    enc.width, enc.height, enc.pix_fmt = W, H, "yuv420p"
    enc.time_base = fractions.Fraction(1, 25)
    enc.options = {"preset": "ultrafast", "tune": "zerolatency"} | (
        {"x265-params": "log-level=error"} if codec == "libx265" else {})
    out = []
    for i, (y, uv) in enumerate(pics):
        f = av.VideoFrame.from_ndarray(np.concatenate([y, uv]), format="nv12")
        f.pts = i
        out.append(b"".join(bytes(p) for p in enc.encode(f)))
    return out


def pyav_decode(codec: str, packets: list[bytes]) -> list:
    dec = av.CodecContext.create(codec, "r")
    dec.thread_count = 1
    return [f for p in packets if p for f in dec.decode(av.Packet(p))]


# ---------------------------------------------------------------------------------------------- VDEC
@pytest.mark.parametrize("entype,codec,fmt", [(H264, "h264", NV12), (H265, "hevc", NV21)])
def test_vdec_pictures_are_pyav_decodes_of_the_same_packets(cb, entype, codec, fmt):
    packets = pyav_encode("libx264" if codec == "h264" else "libx265", frames(4))
    got: list = []
    done = threading.Event()

    def callback(stream_desc, pic_desc, user_data):
        got.append((user_data, m.dvpp_get_pic_desc_ret_code(pic_desc), m.dvpp_get_pic_desc_width(pic_desc),
                    m.dvpp_get_pic_desc_height(pic_desc), m.dvpp_get_pic_desc_data(pic_desc),
                    threading.get_ident()))
        if len(got) == len(packets):
            done.set()

    ch = m.vdec_create_channel_desc()
    for f, v in ((m.vdec_set_channel_desc_channel_id, 1), (m.vdec_set_channel_desc_thread_id, cb.tid),
                 (m.vdec_set_channel_desc_callback, callback), (m.vdec_set_channel_desc_entype, entype),
                 (m.vdec_set_channel_desc_out_pic_format, fmt)):
        ok(f(ch, v))
    ok(m.vdec_create_channel(ch))
    cfg = m.vdec_create_frame_config()
    for i, p in enumerate(packets):
        sd = m.dvpp_create_stream_desc()
        ok(m.dvpp_set_stream_desc_data(sd, put(p)))
        ok(m.dvpp_set_stream_desc_size(sd, len(p)))
        ok(m.vdec_send_frame(ch, sd, pic(ok(m.dvpp_malloc(W * H * 3 // 2)), fmt, 0, 0), cfg, i))
    assert done.wait(WAIT_S)
    ok(m.vdec_destroy_channel(ch))
    ok(m.vdec_destroy_channel_desc(ch))
    ok(m.vdec_destroy_frame_config(cfg))
    assert [g[0] for g in got] == list(range(len(packets)))         # in order, each with its user data
    assert {g[5] for g in got} == {cb.tid}                           # run by the subscribed thread
    for (_, rc, w, h, data, _), ref in zip(got, pyav_decode(codec, packets)):
        assert (rc, w, h) == (0, W, H)
        nv = ref.to_ndarray(format="nv12")
        buf = get(data, W * H * 3 // 2)
        uv = buf[W * H:].reshape(H // 2, W // 2, 2)
        assert np.array_equal(buf[:W * H].reshape(H, W), nv[:H])
        assert np.array_equal(uv if fmt == NV12 else uv[..., ::-1], nv[H:].reshape(H // 2, W // 2, 2))


def test_vdec_reports_a_bad_frame_in_its_ret_code_and_goes_on(cb):
    good = pyav_encode("libx264", frames(2))
    seen: list = []

    def callback(stream_desc, pic_desc, user_data):
        seen.append((user_data, m.dvpp_get_pic_desc_ret_code(pic_desc)))

    ch = m.vdec_create_channel_desc()
    ok(m.vdec_set_channel_desc_thread_id(ch, cb.tid))
    ok(m.vdec_set_channel_desc_callback(ch, callback))
    ok(m.vdec_set_channel_desc_entype(ch, H264))
    ok(m.vdec_create_channel(ch))
    for i, p in enumerate([good[0], bytes(range(256)) * 3, good[1]]):
        sd = m.dvpp_create_stream_desc()
        ok(m.dvpp_set_stream_desc_data(sd, put(p)))
        ok(m.dvpp_set_stream_desc_size(sd, len(p)))
        ok(m.vdec_send_frame(ch, sd, pic(ok(m.dvpp_malloc(W * H * 3 // 2)), NV12, 0, 0), 0, i))
    ok(m.vdec_destroy_channel(ch))                                   # waits for the three callbacks
    assert [s[0] for s in seen] == [0, 1, 2]
    assert seen[0][1] == 0 and seen[1][1] != 0


# ---------------------------------------------------------------------------------------------- VENC
@pytest.mark.parametrize("entype,codec", [(H264, "h264"), (H265, "hevc")])
def test_venc_stream_decodes_to_the_pictures_sent_with_key_frames_where_asked(cb, entype, codec):
    pics = frames(6)
    out: list = []

    def callback(pic_desc, stream_desc, user_data):
        n = m.dvpp_get_stream_desc_size(stream_desc)
        data = get(m.dvpp_get_stream_desc_data(stream_desc), n).tobytes() if n else b""
        out.append((user_data, m.dvpp_get_stream_desc_ret_code(stream_desc), data))

    ch = m.venc_create_channel_desc()
    for f, v in ((m.venc_set_channel_desc_thread_id, cb.tid), (m.venc_set_channel_desc_callback, callback),
                 (m.venc_set_channel_desc_entype, entype), (m.venc_set_channel_desc_pic_format, NV12),
                 (m.venc_set_channel_desc_key_frame_interval, 4), (m.venc_set_channel_desc_pic_width, W),
                 (m.venc_set_channel_desc_pic_height, H)):
        ok(f(ch, v))
    ok(m.venc_create_channel(ch))
    cfg = m.venc_create_frame_config()
    for i, (y, uv) in enumerate(pics):
        ok(m.venc_set_frame_config_force_i_frame(cfg, 1 if i == 2 else 0))
        assert m.venc_get_frame_config_force_i_frame(cfg) == (1 if i == 2 else 0)
        ok(m.venc_send_frame(ch, pic(put(np.concatenate([y, uv]))), 0, cfg, i))
    ok(m.venc_set_frame_config_eos(cfg, 1))
    assert m.venc_get_frame_config_eos(cfg) == 1
    ok(m.venc_send_frame(ch, 0, 0, cfg, "eos"))
    ok(m.venc_destroy_channel(ch))
    ok(m.venc_destroy_channel_desc(ch))
    assert [o[0] for o in out] == list(range(len(pics))) + ["eos"]
    assert all(o[1] == 0 for o in out) and all(o[2] for o in out[:-1])
    decoded = pyav_decode(codec, [o[2] for o in out])
    assert len(decoded) == len(pics)
    for f, (y, uv) in zip(decoded, pics):
        nv = f.to_ndarray(format="nv12").astype(np.float64)
        assert np.abs(nv[:H] - y).mean() < 3.0 and np.abs(nv[H:] - uv).mean() < 3.0
    keys = [f.key_frame for f in decoded]
    assert keys[0] and keys[2] and not keys[1] and not keys[3]


def test_video_channels_refuse_bad_settings_and_pictures(cb):
    ch = m.vdec_create_channel_desc()
    assert m.vdec_create_channel(ch) == ACL_ERROR_INVALID_PARAM               # no callback, no thread
    assert m.vdec_set_channel_desc_entype(ch, 9) == ACL_ERROR_INVALID_PARAM
    assert m.vdec_set_channel_desc_out_pic_format(ch, 12) == ACL_ERROR_INVALID_PARAM
    assert m.vdec_set_channel_desc_callback(ch, 42) == ACL_ERROR_INVALID_PARAM
    sd = m.dvpp_create_stream_desc()
    assert m.vdec_send_frame(ch, sd, 0, 0, None) == ACL_ERROR_INVALID_PARAM     # not created
    assert m.vdec_get_channel_desc_out_mode(ch) == 0
    ok(m.vdec_set_channel_desc_out_mode(ch, 1))
    assert m.vdec_get_channel_desc_out_mode(ch) == 1
    ve = m.venc_create_channel_desc()
    assert m.venc_set_channel_desc_pic_width(ve, 100) == ACL_ERROR_INVALID_PARAM  # below 128
    assert m.venc_set_channel_desc_pic_height(ve, 129) == ACL_ERROR_INVALID_PARAM  # odd
    assert m.venc_destroy_channel_desc(ch) == ACL_ERROR_INVALID_PARAM            # a VDEC description
    ok(m.venc_set_channel_desc_thread_id(ve, cb.tid))
    ok(m.venc_set_channel_desc_callback(ve, lambda *a: None))
    assert m.venc_create_channel(ve) == ACL_ERROR_INVALID_PARAM                  # no width / height
    ok(m.venc_set_channel_desc_pic_width(ve, W))
    ok(m.venc_set_channel_desc_pic_height(ve, H))
    ok(m.venc_create_channel(ve))
    cfg = m.venc_create_frame_config()
    src = put(np.zeros(W * H * 3 // 2, np.uint8))
    wrong_size = pic(src, NV12, W - 32, H)
    assert m.venc_send_frame(ve, wrong_size, 0, cfg, None) == ACL_ERROR_INVALID_PARAM
    assert m.venc_send_frame(ve, pic(src, NV21), 0, cfg, None) == ACL_ERROR_INVALID_PARAM  # not the format
    assert m.venc_send_frame(ve, 0, 0, cfg, None) == ACL_ERROR_INVALID_PARAM      # no picture, no eos
    assert m.vdec_destroy_frame_config(cfg) == ACL_ERROR_INVALID_PARAM           # a VENC configuration
    ok(m.venc_destroy_channel(ve))
    assert m.venc_destroy_channel(ve) == ACL_ERROR_INVALID_PARAM                 # twice
