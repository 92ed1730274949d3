"""``acl.util``: host pointers <-> numpy arrays and bytes, and helper threads for ``process_report``.

Host pointers are real host addresses (read and written with :mod:`ctypes`).  The buffers whose address
``numpy_to_ptr`` / ``bytes_to_ptr`` hand out are registered in the host-pointer table
(:mod:`runtime.hostmem`): kept alive for a while (bounded), then -- numpy arrays -- valid as long as
the caller holds them.  ``ptr_to_numpy`` / ``ptr_to_bytes`` only read registered memory: any other
address raises :class:`~devices.errors.AclError` with code ACL_ERROR_INVALID_PARAM (100000) (they return
values, not a ``ret``), and the text is kept for ``acl.get_recent_err_msg()``.

This module holds the API of ``acl.util`` and nothing else (``dir(acl.util)`` lists exactly it, as pyACL's
does; tests/reference/pyacl_api.txt); the functions live in :mod:`runtime.acl._util`.
"""
from ._util import (  # noqa: F401 - the API of acl.util
    numpy_to_ptr, numpy_contiguous_to_ptr, ptr_to_numpy, bytes_to_ptr, ptr_to_bytes, start_thread, stop_thread,
)
