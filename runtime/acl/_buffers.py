"""``acl.create_data_buffer`` and friends: aclDataBuffer, the (address, size) pair that model datasets
hold, and ``acl.data_type_size``.

As in CANN (``data_buffer.cpp``) a data buffer owns nothing: creating one checks nothing (``data=0,
size=0`` is the empty buffer the runtime fills for outputs of unknown size), destroying it frees no
memory, and the address is only checked when a model uses it.  Getters of an unknown or destroyed buffer
return C's failure value (0); the calls that return an aclError return 100000 for it.
"""
from __future__ import annotations

from ._args import as_int
from ._calls import acl_call, acl_value
from ._constants import (ACL_BF16, ACL_BOOL, ACL_COMPLEX32, ACL_COMPLEX128, ACL_DT_UNDEFINED, ACL_FLOAT,
                         ACL_FLOAT8_E4M3FN, ACL_FLOAT8_E5M2, ACL_FLOAT8_E8M0, ACL_FLOAT16, ACL_HIFLOAT8, ACL_INT4,
                         ACL_INT8, ACL_INT16, ACL_INT32, ACL_STRING, ACL_UINT1, ACL_UINT8, ACL_UINT16, ACL_UINT32)
from ._state import STATE, DataBufferRecord, add_object, drop_object, object_record

ACL_NAMESPACE = "acl"               # these are acl.* calls (runtime.acl._calls names them so)

#: aclDataTypeSize (data_buffer.cpp): bytes per element; any other value answers 8, as its default branch
_TYPE_SIZE = {ACL_STRING: 0, ACL_DT_UNDEFINED: 0, ACL_UINT1: 1, ACL_INT4: 1,
              ACL_BOOL: 1, ACL_INT8: 1, ACL_UINT8: 1, ACL_HIFLOAT8: 1, ACL_FLOAT8_E5M2: 1, ACL_FLOAT8_E4M3FN: 1,
              ACL_FLOAT8_E8M0: 1, ACL_FLOAT16: 2, ACL_INT16: 2, ACL_UINT16: 2, ACL_BF16: 2,
              ACL_FLOAT: 4, ACL_INT32: 4, ACL_UINT32: 4, ACL_COMPLEX32: 4, ACL_COMPLEX128: 16}
_DEFAULT_TYPE_SIZE = 8
_UINT32_MASK = 0xFFFFFFFF


@acl_value(0, init=False)
def create_data_buffer(data, size):
    """aclCreateDataBuffer -> data buffer handle (0 on failure).  ``data`` is a device (or host) address,
    ``size`` its bytes; nothing is checked until a model uses it.  Host-only."""
    ptr, size = _addr(data), as_int(size, "size")
    if size < 0:
        raise ValueError(f"negative data buffer size {size}")
    return add_object(STATE.data_buffers, lambda h: DataBufferRecord(h, ptr, size))


@acl_call(init=False)
def destroy_data_buffer(data_buffer):
    """aclDestroyDataBuffer: forget the buffer (its memory is not freed; datasets that hold it refuse to
    run afterwards, see acl.mdl.execute)."""
    drop_object(STATE.data_buffers, data_buffer, "data buffer")


@acl_call(init=False)
def update_data_buffer(data_buffer, data, size):
    """aclUpdateDataBuffer: point the buffer at other memory."""
    ptr, size = _addr(data), as_int(size, "size")
    if size < 0:
        raise ValueError(f"negative data buffer size {size}")
    rec = object_record(STATE.data_buffers, data_buffer, "data buffer")
    rec.ptr, rec.size = ptr, size


@acl_value(0, init=False)
def get_data_buffer_addr(data_buffer):
    """aclGetDataBufferAddr -> the address (0 for an unknown buffer)."""
    return object_record(STATE.data_buffers, data_buffer, "data buffer").ptr


@acl_value(0, init=False)
def get_data_buffer_size(data_buffer):
    """aclGetDataBufferSize (deprecated: a uint32, so sizes of 4 GiB and more wrap) -> bytes."""
    return object_record(STATE.data_buffers, data_buffer, "data buffer").size & _UINT32_MASK


@acl_value(0, init=False)
def get_data_buffer_size_v2(data_buffer):
    """aclGetDataBufferSizeV2 -> bytes (0 for an unknown buffer)."""
    return object_record(STATE.data_buffers, data_buffer, "data buffer").size


@acl_value(0, init=False)
def data_type_size(data_type):
    """aclDataTypeSize -> bytes per element of an aclDataType (0 for ACL_STRING / ACL_DT_UNDEFINED, 1 for
    the packed sub-byte types, 8 for a value CANN does not list)."""
    return _TYPE_SIZE.get(as_int(data_type, "data type"), _DEFAULT_TYPE_SIZE)


def _addr(data) -> int:
    """An address argument: an int, or None / 0 for NULL."""
    return 0 if data is None else as_int(data, "data address")
