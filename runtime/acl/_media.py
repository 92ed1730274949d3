"""The implementation of ``acl.media``'s memory and descriptors (:mod:`runtime.acl.media` lists the API):
DVPP memory, channels, picture / batch picture / stream descriptors, ROI, resize and JPEGE configurations.

Everything here is host-side bookkeeping and host-synchronous; nothing orders the device (the engines'
tasks are in :mod:`runtime.acl._media_ops`).  Create functions and getters are bare values in pyACL
(``desc = acl.media.dvpp_create_pic_desc()``, ``w = acl.media.dvpp_get_pic_desc_width(desc)``): 0 for a
failure or an unknown handle; setters and destroy functions return ``ret``.
"""
from __future__ import annotations

from devices.errors import ACL_ERROR_RT_MEMORY_FREE, AclError

from ._args import as_int, invalid
from ._calls import acl_call, acl_value
from ._media_state import (DVPP_ADDR_ALIGN, DVPP_SIZE_ALIGN, DVPP_SIZE_EXTRA, MEDIA, BatchPicDesc, ChannelDesc,
                           DvppAlloc, JpegeConfig, PicDesc, ResizeConfig, RoiConfig, StreamDesc)
from ._state import STATE, add_object, current_context, drop_object, object_record

ACL_NAMESPACE = "acl.media"        # these are acl.media.* calls (runtime.acl._calls names them so)

#: largest batch of picture descriptors (acldvppCreateBatchPicDesc: batchSize up to 256)
MAX_BATCH = 256
_U32 = 0xFFFFFFFF


# ---------------------------------------------------------------------------------------------- memory
@acl_call(outs=(0,))
def dvpp_malloc(size):
    """acldvppMalloc -> (dev_ptr, ret): DVPP memory of the current device.  As CANN's: ``size`` rounded up
    to 32 bytes plus 32, the address 128-byte aligned; the engines take only such memory.  0 bytes or
    less is 100000, no memory 207001."""
    n = as_int(size, "size")
    if n <= 0:
        raise invalid(f"dvpp_malloc size must be positive, got {n}")
    return dvpp_alloc(current_context().dev, n)


def dvpp_alloc(dev, n: int) -> int:
    """DVPP memory of ``n`` bytes (> 0) on ``dev``, by CANN's rules (see dvpp_malloc)."""
    n = -(-n // DVPP_SIZE_ALIGN) * DVPP_SIZE_ALIGN + DVPP_SIZE_EXTRA
    base = dev.malloc(n + DVPP_ADDR_ALIGN)
    ptr = -(-base // DVPP_ADDR_ALIGN) * DVPP_ADDR_ALIGN
    with STATE.lock:
        STATE.dev_allocs[base] = dev            # acl.finalize frees it with the rest
        MEDIA.dvpp[ptr] = DvppAlloc(ptr, base, n, dev)
    return ptr


@acl_call()
def dvpp_free(dev_ptr):
    """acldvppFree: release memory of dvpp_malloc (ACL_ERROR_RT_MEMORY_FREE 207002 for any other address,
    freed memory included).  Host-synchronous; work still queued on it is the program's to finish first."""
    p = as_int(dev_ptr, "dev_ptr") if dev_ptr is not None else 0
    if p == 0:
        raise invalid("dvpp_free of NULL")
    dvpp_release(p)


def dvpp_release(p: int) -> None:
    """Free DVPP memory at ``p`` (207002 when it is none)."""
    with STATE.lock:
        a = MEDIA.dvpp.pop(p, None)
        if a is None:
            raise AclError(f"0x{p:x} is not DVPP memory of acl.media.dvpp_malloc (or was freed)",
                           code=ACL_ERROR_RT_MEMORY_FREE)
        STATE.dev_allocs.pop(a.base, None)
    a.dev.free(a.base)


# ---------------------------------------------------------------------------------------------- channels
@acl_value(0)
def dvpp_create_channel_desc():
    """acldvppCreateChannelDesc -> channel description (0 on failure)."""
    return add_object(MEDIA.channels, ChannelDesc)


@acl_call()
def dvpp_destroy_channel_desc(channel_desc):
    """acldvppDestroyChannelDesc (destroy its channel first)."""
    drop_object(MEDIA.channels, channel_desc, "DVPP channel description")


@acl_call()
def dvpp_create_channel(channel_desc):
    """acldvppCreateChannel: open the channel the engines' calls name (one per description)."""
    ch = object_record(MEDIA.channels, channel_desc, "DVPP channel description")
    if ch.created:
        raise invalid(f"channel 0x{ch.handle:x} is already created")
    with STATE.lock:
        ch.channel_id = ch.handle & _U32
        ch.created = True


@acl_call()
def dvpp_destroy_channel(channel_desc):
    """acldvppDestroyChannel: close the channel (its queued tasks still complete on their streams)."""
    ch = object_record(MEDIA.channels, channel_desc, "DVPP channel description")
    if not ch.created:
        raise invalid(f"channel 0x{ch.handle:x} was not created")
    ch.created = False


@acl_call()
def dvpp_set_channel_desc_mode(channel_desc, mode):
    """acldvppSetChannelDescMode: the engines the channel is for (a bit mask: 1 VPC, 2 JPEGD, 4 JPEGE,
    8 PNGD; 0 all).  vnpu records it; every engine works on every channel."""
    object_record(MEDIA.channels, channel_desc, "DVPP channel description").mode = as_int(mode, "mode")


@acl_value(0)
def dvpp_get_channel_desc_channel_id(channel_desc):
    """acldvppGetChannelDescChannelId -> the channel's id (0 before dvpp_create_channel)."""
    return object_record(MEDIA.channels, channel_desc, "DVPP channel description").channel_id


# ---------------------------------------------------------------------------------------------- pictures
@acl_value(0)
def dvpp_create_pic_desc():
    """acldvppCreatePicDesc -> picture description (every field 0)."""
    return add_object(MEDIA.pics, PicDesc)


@acl_call()
def dvpp_destroy_pic_desc(pic_desc):
    drop_object(MEDIA.pics, pic_desc, "picture description")


def _pic(h) -> PicDesc:
    return object_record(MEDIA.pics, h, "picture description")


def _u32(v, what: str) -> int:
    n = as_int(v, what)
    if not 0 <= n <= _U32:
        raise invalid(f"{what} {n} is not a uint32")
    return n


@acl_call()
def dvpp_set_pic_desc_data(pic_desc, data_dev):
    """acldvppSetPicDescData: the picture's DVPP memory (checked when an engine uses it)."""
    _pic(pic_desc).data = 0 if data_dev is None else as_int(data_dev, "data")


@acl_call()
def dvpp_set_pic_desc_size(pic_desc, size):
    _pic(pic_desc).size = _u32(size, "size")


@acl_call()
def dvpp_set_pic_desc_format(pic_desc, format):  # noqa: A002 - pyACL's parameter name
    _pic(pic_desc).format = _u32(format, "format")


@acl_call()
def dvpp_set_pic_desc_width(pic_desc, width):
    _pic(pic_desc).width = _u32(width, "width")


@acl_call()
def dvpp_set_pic_desc_height(pic_desc, height):
    _pic(pic_desc).height = _u32(height, "height")


@acl_call()
def dvpp_set_pic_desc_width_stride(pic_desc, width_stride):
    """The width stride (alignment is checked by the engine call that uses the description: 16 for VPC)."""
    _pic(pic_desc).width_stride = _u32(width_stride, "width stride")


@acl_call()
def dvpp_set_pic_desc_height_stride(pic_desc, height_stride):
    _pic(pic_desc).height_stride = _u32(height_stride, "height stride")


@acl_call()
def dvpp_set_pic_desc_ret_code(pic_desc, ret_code):
    _pic(pic_desc).ret_code = _u32(ret_code, "ret code")


@acl_value(0)
def dvpp_get_pic_desc_data(pic_desc):
    return _pic(pic_desc).data


@acl_value(0)
def dvpp_get_pic_desc_size(pic_desc):
    return _pic(pic_desc).size


@acl_value(0)
def dvpp_get_pic_desc_format(pic_desc):
    return _pic(pic_desc).format


@acl_value(0)
def dvpp_get_pic_desc_width(pic_desc):
    """The width; after a JPEG / PNG decode has completed, the decoded picture's."""
    return _pic(pic_desc).width


@acl_value(0)
def dvpp_get_pic_desc_height(pic_desc):
    return _pic(pic_desc).height


@acl_value(0)
def dvpp_get_pic_desc_width_stride(pic_desc):
    return _pic(pic_desc).width_stride


@acl_value(0)
def dvpp_get_pic_desc_height_stride(pic_desc):
    return _pic(pic_desc).height_stride


@acl_value(0)
def dvpp_get_pic_desc_ret_code(pic_desc):
    """The engine's return code for the last task that wrote this picture (0: success), once the task
    completed (after synchronize)."""
    return _pic(pic_desc).ret_code


# ---------------------------------------------------------------------------------------------- batches
@acl_value(0)
def dvpp_create_batch_pic_desc(batch_size):
    """acldvppCreateBatchPicDesc -> a batch of ``batch_size`` (1..256) picture descriptions."""
    n = as_int(batch_size, "batch size")
    if not 1 <= n <= MAX_BATCH:
        raise invalid(f"batch size {n} is outside 1..{MAX_BATCH}")
    pics = [add_object(MEDIA.pics, PicDesc) for _ in range(n)]
    return add_object(MEDIA.batches, lambda h: BatchPicDesc(h, pics))


@acl_value(0)
def dvpp_get_pic_desc(batch_pic_desc, index):
    """acldvppGetPicDesc -> the picture description at ``index`` of the batch (0 out of range)."""
    b = object_record(MEDIA.batches, batch_pic_desc, "batch picture description")
    i = as_int(index, "index")
    if not 0 <= i < len(b.pics):
        raise invalid(f"index {i} is outside the batch of {len(b.pics)}")
    return b.pics[i]


@acl_call()
def dvpp_destroy_batch_pic_desc(batch_pic_desc):
    """acldvppDestroyBatchPicDesc: the batch and its picture descriptions."""
    with STATE.lock:
        b = object_record(MEDIA.batches, batch_pic_desc, "batch picture description")
        for h in b.pics:
            MEDIA.pics.pop(h, None)
        del MEDIA.batches[b.handle]


def batch_pics(batch_pic_desc) -> list[PicDesc]:
    """The picture descriptions of a batch (100000 for an unknown batch)."""
    b = object_record(MEDIA.batches, batch_pic_desc, "batch picture description")
    return [_pic(h) for h in b.pics]


def pic_record(h) -> PicDesc:
    return _pic(h)


# ---------------------------------------------------------------------------------------------- ROI / configs
@acl_value(0)
def dvpp_create_roi_config(left, right, top, bottom):
    """acldvppCreateRoiConfig(left, right, top, bottom) -> ROI (inclusive pixel bounds; the engine call
    checks them against its picture: for YUV420SP left and top even, right and bottom odd)."""
    box = tuple(_u32(v, k) for v, k in ((left, "left"), (right, "right"), (top, "top"), (bottom, "bottom")))
    return add_object(MEDIA.rois, lambda h: RoiConfig(h, *box))


@acl_call()
def dvpp_set_roi_config(roi_config, left, right, top, bottom):
    r = object_record(MEDIA.rois, roi_config, "ROI configuration")
    r.left, r.right, r.top, r.bottom = (_u32(v, k) for v, k in ((left, "left"), (right, "right"), (top, "top"),
                                                                (bottom, "bottom")))


@acl_call()
def dvpp_destroy_roi_config(roi_config):
    drop_object(MEDIA.rois, roi_config, "ROI configuration")


def roi_record(h) -> RoiConfig:
    return object_record(MEDIA.rois, h, "ROI configuration")


@acl_value(0)
def dvpp_create_resize_config():
    """acldvppCreateResizeConfig -> resize configuration (interpolation 0: the default, bilinear)."""
    return add_object(MEDIA.resize, ResizeConfig)


@acl_call()
def dvpp_destroy_resize_config(resize_config):
    drop_object(MEDIA.resize, resize_config, "resize configuration")


@acl_call()
def dvpp_set_resize_config_interpolation(resize_config, interpolation):
    """0 default (bilinear), 1 bilinear, 2 nearest neighbour; anything else 100000."""
    v = as_int(interpolation, "interpolation")
    if v not in (0, 1, 2):
        raise invalid(f"interpolation {v} is not 0 (default), 1 (bilinear) or 2 (nearest)")
    object_record(MEDIA.resize, resize_config, "resize configuration").interpolation = v


@acl_value(0)
def dvpp_get_resize_config_interpolation(resize_config):
    return object_record(MEDIA.resize, resize_config, "resize configuration").interpolation


def resize_record(h) -> ResizeConfig:
    return object_record(MEDIA.resize, h, "resize configuration")


@acl_value(0)
def dvpp_create_jpege_config():
    """acldvppCreateJpegeConfig -> JPEG encode configuration (level 100)."""
    return add_object(MEDIA.jpege, JpegeConfig)


@acl_call()
def dvpp_destroy_jpege_config(jpege_config):
    drop_object(MEDIA.jpege, jpege_config, "JPEGE configuration")


@acl_call()
def dvpp_set_jpege_config_level(jpege_config, level):
    """The encode quality, 0..100 (0 is taken as 1: the lowest); anything else 100000."""
    v = as_int(level, "level")
    if not 0 <= v <= 100:
        raise invalid(f"JPEGE level {v} is outside 0..100")
    object_record(MEDIA.jpege, jpege_config, "JPEGE configuration").level = v


@acl_value(0)
def dvpp_get_jpege_config_level(jpege_config):
    return object_record(MEDIA.jpege, jpege_config, "JPEGE configuration").level


def jpege_record(h) -> JpegeConfig:
    return object_record(MEDIA.jpege, h, "JPEGE configuration")


def channel_record(h) -> ChannelDesc:
    """A created channel (100000 for an unknown description or one whose channel is not created)."""
    ch = object_record(MEDIA.channels, h, "DVPP channel description")
    if not ch.created:
        raise invalid(f"channel 0x{ch.handle:x} is not created (call acl.media.dvpp_create_channel)")
    return ch


# ---------------------------------------------------------------------------------------------- streams
@acl_value(0)
def dvpp_create_stream_desc():
    """acldvppCreateStreamDesc -> stream description (an encoded stream's memory and attributes)."""
    return add_object(MEDIA.streams, StreamDesc)


@acl_call()
def dvpp_destroy_stream_desc(stream_desc):
    drop_object(MEDIA.streams, stream_desc, "stream description")


def _sd(h) -> StreamDesc:
    return object_record(MEDIA.streams, h, "stream description")


def stream_desc_record(h) -> StreamDesc:
    return _sd(h)


@acl_call()
def dvpp_set_stream_desc_data(stream_desc, data_dev):
    _sd(stream_desc).data = 0 if data_dev is None else as_int(data_dev, "data")


@acl_call()
def dvpp_set_stream_desc_size(stream_desc, size):
    _sd(stream_desc).size = _u32(size, "size")


@acl_call()
def dvpp_set_stream_desc_format(stream_desc, format):  # noqa: A002 - pyACL's parameter name
    _sd(stream_desc).format = _u32(format, "format")


@acl_call()
def dvpp_set_stream_desc_timestamp(stream_desc, timestamp):
    t = as_int(timestamp, "timestamp")
    if not 0 <= t < 1 << 64:
        raise invalid(f"timestamp {t} is not a uint64")
    _sd(stream_desc).timestamp = t


@acl_call()
def dvpp_set_stream_desc_ret_code(stream_desc, ret_code):
    _sd(stream_desc).ret_code = _u32(ret_code, "ret code")


@acl_call()
def dvpp_set_stream_desc_eos(stream_desc, eos):
    v = as_int(eos, "eos")
    if v not in (0, 1):
        raise invalid(f"eos must be 0 or 1, got {v}")
    _sd(stream_desc).eos = v


@acl_value(0)
def dvpp_get_stream_desc_data(stream_desc):
    return _sd(stream_desc).data


@acl_value(0)
def dvpp_get_stream_desc_size(stream_desc):
    return _sd(stream_desc).size


@acl_value(0)
def dvpp_get_stream_desc_format(stream_desc):
    return _sd(stream_desc).format


@acl_value(0)
def dvpp_get_stream_desc_timestamp(stream_desc):
    return _sd(stream_desc).timestamp


@acl_value(0)
def dvpp_get_stream_desc_ret_code(stream_desc):
    return _sd(stream_desc).ret_code


@acl_value(0)
def dvpp_get_stream_desc_eos(stream_desc):
    return _sd(stream_desc).eos
