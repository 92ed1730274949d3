"""The implementation of ``acl.media``'s memory and descriptors (:mod:`runtime.acl.media` lists the API):
DVPP memory, channels, picture / batch picture / stream descriptors, ROI, resize and JPEGE configurations
(their create / destroy / get / set calls made by one template, :mod:`._media_desc`).

Everything here is host-side bookkeeping and host-synchronous; nothing orders the device (the engines'
tasks are in :mod:`runtime.acl._media_ops`).  Create functions and getters are bare values in pyACL
(``desc = acl.media.dvpp_create_pic_desc()``, ``w = acl.media.dvpp_get_pic_desc_width(desc)``): 0 for a
failure or an unknown handle; setters and destroy functions return ``ret``.
"""
from __future__ import annotations

from typing import Callable

from devices.errors import ACL_ERROR_RT_MEMORY_FREE, AclError

from ._args import as_int, invalid
from ._calls import acl_call, acl_value
from ._media_desc import DescKind, address, bounded, flag, integer, u32
from ._media_state import (DVPP_ADDR_ALIGN, DVPP_SIZE_ALIGN, DVPP_SIZE_EXTRA, MEDIA, BatchPicDesc, ChannelDesc,
                           DvppAlloc, JpegeConfig, PicDesc, ResizeConfig, RoiConfig, StreamDesc)
from ._state import STATE, add_object, current_context

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
CHANNELS = DescKind("dvpp", "channel_desc", "channels", "DVPP channel description")
dvpp_create_channel_desc = CHANNELS.create_call(ChannelDesc, "acldvppCreateChannelDesc -> channel description "
                                                "(0 on failure).")
dvpp_destroy_channel_desc = CHANNELS.destroy_call("acldvppDestroyChannelDesc (destroy its channel first).")
dvpp_set_channel_desc_mode = CHANNELS.setter(
    "mode", integer("mode"), doc="acldvppSetChannelDescMode: the engines the channel is for (a bit mask: 1 VPC, "
    "2 JPEGD, 4 JPEGE, 8 PNGD; 0 all).  vnpu records it; every engine works on every channel.")
dvpp_get_channel_desc_channel_id = CHANNELS.getter(
    "channel_id", "acldvppGetChannelDescChannelId -> the channel's id (0 before dvpp_create_channel).")


@acl_call()
def dvpp_create_channel(channel_desc):
    """acldvppCreateChannel: open the channel the engines' calls name (one per description)."""
    ch = CHANNELS.record(channel_desc)
    if ch.created:
        raise invalid(f"channel 0x{ch.handle:x} is already created")
    with STATE.lock:
        ch.channel_id = ch.handle & _U32
        ch.created = True


@acl_call()
def dvpp_destroy_channel(channel_desc):
    """acldvppDestroyChannel: close the channel (its queued tasks still complete on their streams)."""
    ch = CHANNELS.record(channel_desc)
    if not ch.created:
        raise invalid(f"channel 0x{ch.handle:x} was not created")
    ch.created = False


def channel_record(h) -> ChannelDesc:
    """A created channel (100000 for an unknown description or one whose channel is not created)."""
    ch = CHANNELS.record(h)
    if not ch.created:
        raise invalid(f"channel 0x{ch.handle:x} is not created (call acl.media.dvpp_create_channel)")
    return ch


# ---------------------------------------------------------------------------------------------- pictures
PICS = DescKind("dvpp", "pic_desc", "pics", "picture description")
pic_record: Callable[..., PicDesc] = PICS.record
dvpp_create_pic_desc = PICS.create_call(PicDesc, "acldvppCreatePicDesc -> picture description (every field 0).")
dvpp_destroy_pic_desc = PICS.destroy_call()
dvpp_set_pic_desc_data = PICS.setter("data", address("data"), param="data_dev", doc="acldvppSetPicDescData: the "
                                     "picture's DVPP memory (checked when an engine uses it).")
dvpp_set_pic_desc_size = PICS.setter("size", u32("size"))
dvpp_set_pic_desc_format = PICS.setter("format", u32("format"))
dvpp_set_pic_desc_width = PICS.setter("width", u32("width"))
dvpp_set_pic_desc_height = PICS.setter("height", u32("height"))
dvpp_set_pic_desc_width_stride = PICS.setter("width_stride", u32("width stride"), doc="The width stride "
                                             "(alignment is checked by the engine call that uses the description: "
                                             "16 for VPC).")
dvpp_set_pic_desc_height_stride = PICS.setter("height_stride", u32("height stride"))
dvpp_set_pic_desc_ret_code = PICS.setter("ret_code", u32("ret code"))
dvpp_get_pic_desc_data = PICS.getter("data")
dvpp_get_pic_desc_size = PICS.getter("size")
dvpp_get_pic_desc_format = PICS.getter("format")
dvpp_get_pic_desc_width = PICS.getter("width", "The width; after a JPEG / PNG decode has completed, the decoded "
                                      "picture's.")
dvpp_get_pic_desc_height = PICS.getter("height")
dvpp_get_pic_desc_width_stride = PICS.getter("width_stride")
dvpp_get_pic_desc_height_stride = PICS.getter("height_stride")
dvpp_get_pic_desc_ret_code = PICS.getter("ret_code", "The engine's return code for the last task that wrote this "
                                         "picture (0: success), once the task completed (after synchronize).")


# ---------------------------------------------------------------------------------------------- batches
BATCHES = DescKind("dvpp", "batch_pic_desc", "batches", "batch picture description")


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
    b = BATCHES.record(batch_pic_desc)
    i = as_int(index, "index")
    if not 0 <= i < len(b.pics):
        raise invalid(f"index {i} is outside the batch of {len(b.pics)}")
    return b.pics[i]


@acl_call()
def dvpp_destroy_batch_pic_desc(batch_pic_desc):
    """acldvppDestroyBatchPicDesc: the batch and its picture descriptions."""
    with STATE.lock:
        b = BATCHES.record(batch_pic_desc)
        for h in b.pics:
            MEDIA.pics.pop(h, None)
        del MEDIA.batches[b.handle]


def batch_pics(batch_pic_desc) -> list[PicDesc]:
    """The picture descriptions of a batch (100000 for an unknown batch)."""
    return [PICS.record(h) for h in BATCHES.record(batch_pic_desc).pics]


# ---------------------------------------------------------------------------------------------- ROI / configs
ROIS = DescKind("dvpp", "roi_config", "rois", "ROI configuration")
roi_record: Callable[..., RoiConfig] = ROIS.record
dvpp_destroy_roi_config = ROIS.destroy_call()
_BOX = tuple(u32(k) for k in ("left", "right", "top", "bottom"))


@acl_value(0)
def dvpp_create_roi_config(left, right, top, bottom):
    """acldvppCreateRoiConfig(left, right, top, bottom) -> ROI (inclusive pixel bounds; the engine call
    checks them against its picture: for YUV420SP left and top even, right and bottom odd)."""
    box = tuple(check(v) for check, v in zip(_BOX, (left, right, top, bottom)))
    return add_object(MEDIA.rois, lambda h: RoiConfig(h, *box))


@acl_call()
def dvpp_set_roi_config(roi_config, left, right, top, bottom):
    r = ROIS.record(roi_config)
    r.left, r.right, r.top, r.bottom = (check(v) for check, v in zip(_BOX, (left, right, top, bottom)))


RESIZE = DescKind("dvpp", "resize_config", "resize", "resize configuration")
resize_record: Callable[..., ResizeConfig] = RESIZE.record
dvpp_create_resize_config = RESIZE.create_call(ResizeConfig, "acldvppCreateResizeConfig -> resize configuration "
                                               "(interpolation 0: the default, bilinear).")
dvpp_destroy_resize_config = RESIZE.destroy_call()
dvpp_set_resize_config_interpolation = RESIZE.setter(
    "interpolation", bounded("interpolation", lambda v: v in (0, 1, 2),
                             "interpolation {} is not 0 (default), 1 (bilinear) or 2 (nearest)"),
    doc="0 default (bilinear), 1 bilinear, 2 nearest neighbour; anything else 100000.")
dvpp_get_resize_config_interpolation = RESIZE.getter("interpolation")

JPEGE = DescKind("dvpp", "jpege_config", "jpege", "JPEGE configuration")
jpege_record: Callable[..., JpegeConfig] = JPEGE.record
dvpp_create_jpege_config = JPEGE.create_call(JpegeConfig, "acldvppCreateJpegeConfig -> JPEG encode configuration "
                                             "(level 100).")
dvpp_destroy_jpege_config = JPEGE.destroy_call()
dvpp_set_jpege_config_level = JPEGE.setter(
    "level", bounded("level", lambda v: 0 <= v <= 100, "JPEGE level {} is outside 0..100"),
    doc="The encode quality, 0..100 (0 is taken as 1: the lowest); anything else 100000.")
dvpp_get_jpege_config_level = JPEGE.getter("level")


# ---------------------------------------------------------------------------------------------- streams
STREAMS = DescKind("dvpp", "stream_desc", "streams", "stream description")
stream_desc_record: Callable[..., StreamDesc] = STREAMS.record
dvpp_create_stream_desc = STREAMS.create_call(StreamDesc, "acldvppCreateStreamDesc -> stream description (an "
                                              "encoded stream's memory and attributes).")
dvpp_destroy_stream_desc = STREAMS.destroy_call()
dvpp_set_stream_desc_data = STREAMS.setter("data", address("data"), param="data_dev")
dvpp_set_stream_desc_size = STREAMS.setter("size", u32("size"))
dvpp_set_stream_desc_format = STREAMS.setter("format", u32("format"))
dvpp_set_stream_desc_timestamp = STREAMS.setter(
    "timestamp", bounded("timestamp", lambda t: 0 <= t < 1 << 64, "timestamp {} is not a uint64"))
dvpp_set_stream_desc_ret_code = STREAMS.setter("ret_code", u32("ret code"))
dvpp_set_stream_desc_eos = STREAMS.setter("eos", flag("eos"))
dvpp_get_stream_desc_data = STREAMS.getter("data")
dvpp_get_stream_desc_size = STREAMS.getter("size")
dvpp_get_stream_desc_format = STREAMS.getter("format")
dvpp_get_stream_desc_timestamp = STREAMS.getter("timestamp")
dvpp_get_stream_desc_ret_code = STREAMS.getter("ret_code")
dvpp_get_stream_desc_eos = STREAMS.getter("eos")
