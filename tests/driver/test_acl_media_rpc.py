"""acl.media over the cluster path's wire: the acl runtime on a real gRPC client of a served device (what a
cluster device actor is, without Ray).  The engines' tasks and their attributes cross the wire, their
results come back through the host-side read-back (device-to-host over gRPC), and an engine failure comes
back with its code.  The in-process tier (tests/core/test_acl_media.py) covers the numerics and checks."""
from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from acl_checks import ok
from conftest import installed
from devices.device import Device, DeviceConfig
from devices.errors import ACL_ERROR_FAILURE
from driver import credentials
from driver.client import RemoteDevice
from driver.service import serve
from runtime import acl
from runtime.api import Runtime

pytestmark = pytest.mark.rpc
SECRET = "acl-media-rpc-test-token-0123456789abcdef"
m = acl.media
NV12 = 1


def _put(data: bytes) -> int:
    ptr = ok(m.dvpp_malloc(len(data)))
    ok(acl.rt.memcpy(ptr, len(data), acl.util.bytes_to_ptr(data), len(data), 1))
    return ptr


def _get(ptr: int, n: int) -> np.ndarray:
    out = np.zeros(n, np.uint8)
    ok(acl.rt.memcpy(acl.util.numpy_to_ptr(out), n, ptr, n, 2))
    return out


def _pic(ptr, size, w, h, ws, hs) -> int:
    d = m.dvpp_create_pic_desc()
    for f, v in ((m.dvpp_set_pic_desc_data, ptr), (m.dvpp_set_pic_desc_size, size), (m.dvpp_set_pic_desc_format, NV12),
                 (m.dvpp_set_pic_desc_width, w), (m.dvpp_set_pic_desc_height, h),
                 (m.dvpp_set_pic_desc_width_stride, ws), (m.dvpp_set_pic_desc_height_stride, hs)):
        ok(f(d, v))
    return d


class _Backend:
    """A runtime backend of one gRPC client (what RemoteBackend hands out, without Ray)."""
    name = "remote"

    def __init__(self, client: RemoteDevice):
        self.client = client

    def device_ids(self) -> list[int]:
        return [self.client.id]

    def device(self, physical_id: int):
        return self.client

    def close(self) -> None:
        self.client.close()


@pytest.fixture
def remote():
    dev = Device(DeviceConfig(device_id=5, arena_bytes=16 << 20, cores=2, shm=False))
    srv = serve(dev, host="127.0.0.1", token=SECRET, port=0, lease_grace_s=0.2)
    try:
        client = RemoteDevice(srv.address, credentials.mint(SECRET, "media"), dev.id, timeout_s=10.0)
        client.open_lease()
        with installed(Runtime(_Backend(client), batch_size=4)) as rt:
            yield rt
    finally:
        srv.stop(grace=None)
        dev.close()


def test_decode_encode_and_a_failure_on_a_served_device(remote):
    acl.finalize()
    ok(acl.init())
    try:
        ok(acl.rt.set_device(0))
        stream = ok(acl.rt.create_stream())
        ch = m.dvpp_create_channel_desc()
        ok(m.dvpp_create_channel(ch))
        w, h = 64, 48
        yy, xx = np.mgrid[0:h, 0:w]
        rgb = np.stack([xx * 4, yy * 5, 255 - xx * 2], -1).astype(np.uint8)
        bio = io.BytesIO()
        Image.fromarray(rgb).save(bio, "JPEG", quality=95)
        jpg = bio.getvalue()
        size = 128 * 48 * 3 // 2
        out = ok(m.dvpp_malloc(size))
        d = _pic(out, size, 0, 0, 128, 48)
        ok(m.dvpp_jpeg_decode_async(ch, _put(jpg), len(jpg), d, stream))
        # JPEGE of the decoded picture on the same stream, no synchronize between
        src = _pic(out, size, w, h, 128, 48)
        cfg = m.dvpp_create_jpege_config()
        cap = ok(m.dvpp_jpeg_predict_enc_size(src, cfg))
        enc = ok(m.dvpp_malloc(cap))
        n = np.array([cap], np.uint32)
        ok(m.dvpp_jpeg_encode_async(ch, src, enc, acl.util.numpy_to_ptr(n), cfg, stream))
        ok(acl.rt.synchronize_stream(stream))
        assert (m.dvpp_get_pic_desc_width(d), m.dvpp_get_pic_desc_height(d)) == (w, h)
        y = _get(out, size)[:128 * 48].reshape(48, 128)[:h, :w].astype(np.float64)
        ref = np.asarray(Image.open(io.BytesIO(jpg)).convert("RGB")).astype(np.float64)
        ry = 0.299 * ref[..., 0] + 0.587 * ref[..., 1] + 0.114 * ref[..., 2]
        assert np.abs(y - ry).max() <= 3
        assert 0 < int(n[0]) < cap
        back = np.asarray(Image.open(io.BytesIO(_get(enc, int(n[0])).tobytes())).convert("L")).astype(np.float64)
        assert np.abs(back - y).mean() < 2.0
        # a stream that does not decode: the device's error code comes back at synchronize
        bad = b"\xff\xd8\xff\xe0" + bytes(200)
        ok(m.dvpp_jpeg_decode_async(ch, _put(bad), len(bad), d, stream))
        assert acl.rt.synchronize_stream(stream) == ACL_ERROR_FAILURE
        assert m.dvpp_get_pic_desc_ret_code(d) != 0
        ok(acl.rt.synchronize_stream(stream))
    finally:
        acl.finalize()


def test_video_channels_keep_their_codec_on_the_served_device(remote):
    """VDEC's per-channel decoder lives in the device's process: P-frames decode against the I-frame sent
    before them over the wire; the pictures equal PyAV's own decode of the same packets."""
    import fractions
    import threading

    import av

    w, h = 128, 96
    enc = av.CodecContext.create("libx264", "w")
    enc.width, enc.height, enc.pix_fmt = w, h, "yuv420p"
    enc.time_base = fractions.Fraction(1, 25)
    enc.options = {"preset": "ultrafast", "tune": "zerolatency"}
    yy, xx = np.mgrid[0:h, 0:w]
    packets = []
    for i in range(3):
        nv = np.concatenate([((xx + yy + 9 * i) % 200 + 20).astype(np.uint8), np.full((h // 2, w), 128, np.uint8)])
        f = av.VideoFrame.from_ndarray(nv, format="nv12")
        f.pts = i
        packets.append(b"".join(bytes(p) for p in enc.encode(f)))
    dec = av.CodecContext.create("h264", "r")
    want = [f.to_ndarray(format="nv12") for p in packets for f in dec.decode(av.Packet(p))]
    acl.finalize()
    ok(acl.init())
    stop = threading.Event()
    try:
        ok(acl.rt.set_device(0))
        ctx = ok(acl.rt.get_context())

        def loop(_):
            acl.rt.set_context(ctx)
            while not stop.is_set():
                acl.rt.process_report(20)
        tid = ok(acl.util.start_thread(loop, None))
        got = []
        ch = m.vdec_create_channel_desc()
        ok(m.vdec_set_channel_desc_thread_id(ch, tid))
        ok(m.vdec_set_channel_desc_callback(ch, lambda sd, pd, ud: got.append((ud, m.dvpp_get_pic_desc_ret_code(pd),
                                                                               m.dvpp_get_pic_desc_data(pd)))))
        ok(m.vdec_set_channel_desc_entype(ch, 1))
        ok(m.vdec_create_channel(ch))
        size = w * h * 3 // 2
        for i, p in enumerate(packets):
            sd = m.dvpp_create_stream_desc()
            ok(m.dvpp_set_stream_desc_data(sd, _put(p)))
            ok(m.dvpp_set_stream_desc_size(sd, len(p)))
            ok(m.vdec_send_frame(ch, sd, _pic(ok(m.dvpp_malloc(size)), size, 0, 0, w, h), 0, i))
        ok(m.vdec_destroy_channel(ch))
        stop.set()
        ok(acl.util.stop_thread(tid))
        assert [g[:2] for g in got] == [(0, 0), (1, 0), (2, 0)]
        for (_, _, data), ref in zip(got, want):
            assert np.array_equal(_get(data, size).reshape(h * 3 // 2, w), ref)
    finally:
        stop.set()
        acl.finalize()
