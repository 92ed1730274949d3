"""The host-side objects of ``acl.media``: DVPP memory, channel / picture / stream descriptors, ROI, resize
and JPEGE configurations, batch picture descriptors and the VDEC / VENC descriptors, by handle.

As the model layer's objects (:mod:`runtime.acl._state`), they are plain ints to the program; an unknown or
destroyed one is the acl layer's 100000 (a dangling pointer in C).  Handles come from the acl state's one
counter, so they are never reused.  :func:`teardown` forgets them all at ``acl.finalize`` (the DVPP memory
itself is in ``STATE.dev_allocs`` and goes with the acl state's teardown).
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from runtime import api

from ._state import STATE

#: acldvppMalloc: the size is rounded up to 32 bytes plus 32, the start address aligned to 128 bytes
#: (CANN "acl.media.dvpp_malloc" restrictions)
DVPP_SIZE_ALIGN = 32
DVPP_SIZE_EXTRA = 32
DVPP_ADDR_ALIGN = 128


@dataclass(eq=False)
class DvppAlloc:
    """One acl.media.dvpp_malloc: the address handed out (128-aligned), the device allocation under it
    and the bytes the program may use from the address."""
    ptr: int
    base: int
    size: int
    dev: api.Device


@dataclass(eq=False)
class PicDesc:
    handle: int
    data: int = 0
    size: int = 0
    format: int = 0
    width: int = 0
    height: int = 0
    width_stride: int = 0
    height_stride: int = 0
    ret_code: int = 0


@dataclass(eq=False)
class BatchPicDesc:
    handle: int
    pics: list = field(default_factory=list)      #: the PicDesc handles it holds, in order


@dataclass(eq=False)
class StreamDesc:
    """acldvppStreamDesc: an encoded stream (VDEC input, VENC output)."""
    handle: int
    data: int = 0
    size: int = 0
    format: int = 0
    timestamp: int = 0
    ret_code: int = 0
    eos: int = 0


@dataclass(eq=False)
class ChannelDesc:
    handle: int
    mode: int = 0
    channel_id: int = 0
    created: bool = False
    pending: set = field(default_factory=set)     #: result buffers of tasks not yet read back


@dataclass(eq=False)
class RoiConfig:
    handle: int
    left: int
    right: int
    top: int
    bottom: int

    @property
    def box(self) -> tuple[int, int, int, int]:
        return self.left, self.right, self.top, self.bottom


@dataclass(eq=False)
class ResizeConfig:
    handle: int
    interpolation: int = 0


@dataclass(eq=False)
class JpegeConfig:
    handle: int
    level: int = 100


@dataclass(eq=False)
class VideoChannelDesc:
    """aclvdecChannelDesc / aclvencChannelDesc: settings by name, and once created the channel's own
    stream (its callbacks' thread subscribed to it) and the key of its codec on the device (see
    runtime.acl._media_video)."""
    handle: int
    kind: str                                     #: "vdec" | "venc"
    settings: dict = field(default_factory=dict)
    created: bool = False
    key: str = ""
    stream: Any = None                            #: the channel's StreamRecord
    pending: set = field(default_factory=set)     #: result buffers of tasks not yet read back


@dataclass(eq=False)
class FrameConfig:
    handle: int
    kind: str
    settings: dict = field(default_factory=dict)


class MediaTables:
    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.clear()

    def clear(self) -> None:
        self.dvpp: dict[int, DvppAlloc] = {}
        self.pics: dict[int, PicDesc] = {}
        self.batches: dict[int, BatchPicDesc] = {}
        self.streams: dict[int, StreamDesc] = {}
        self.channels: dict[int, ChannelDesc] = {}
        self.rois: dict[int, RoiConfig] = {}
        self.resize: dict[int, ResizeConfig] = {}
        self.jpege: dict[int, JpegeConfig] = {}
        self.video: dict[int, VideoChannelDesc] = {}
        self.frames: dict[int, FrameConfig] = {}


#: the one set of media tables
MEDIA = MediaTables()


def new_handle() -> int:
    return STATE.new_handle()


def find_dvpp(ptr: int, nbytes: int) -> DvppAlloc | None:
    """The DVPP allocation holding ``[ptr, ptr + nbytes)``, or None."""
    with MEDIA.lock:
        for a in MEDIA.dvpp.values():
            if a.ptr <= ptr and ptr + nbytes <= a.ptr + a.size:
                return a
    return None


def teardown() -> Any:
    """Forget every media object (acl.finalize); the DVPP memory is freed with the acl state's allocations."""
    with MEDIA.lock:
        MEDIA.clear()
