"""``acl.rt``: devices, contexts, memory, streams, events, host callbacks and kernel launch (the
``aclrt*`` functions, snake_case).  Every function follows the calling convention of
:mod:`runtime.acl._calls`: ``(outputs..., ret)``, errors returned as CANN codes.

Memory copies go through :class:`runtime.api.Device`'s pointer-level methods (host-synchronous, queued
work sent first, streams not waited for) and streams' ordered forms; see :mod:`runtime.acl` for the
behaviour choices (ordering of ``memcpy_async`` directions, clocks).

This module holds the API of ``acl.rt`` and nothing else (``dir(acl.rt)`` lists exactly it, as pyACL's
does; tests/reference/pyacl_api.txt); the functions live in :mod:`runtime.acl._rt`.
"""
from ._rt import (  # noqa: F401 - the API of acl.rt
    get_device_count, set_device, reset_device, reset_device_force, get_device, get_run_mode,
    query_device_status, synchronize_device, synchronize_device_with_timeout, device_get_stream_priority_range,
    create_context, destroy_context, set_context, get_context, ctx_get_current_default_stream, malloc,
    malloc_cached, malloc_align32, free, malloc_host, free_host, memcpy, memcpy_async, memset, memset_async,
    get_mem_info, create_stream, create_stream_with_config, destroy_stream, destroy_stream_force,
    synchronize_stream, synchronize_stream_with_timeout, stream_query, stream_wait_event, get_stream_priority,
    stream_get_priority, stream_get_flags, create_event, create_event_with_flag, create_event_ex_with_flag,
    destroy_event, record_event, reset_event, query_event_status, query_event, synchronize_event,
    synchronize_event_with_timeout, event_elapsed_time, subscribe_report, unsubscribe_report, launch_callback,
    process_report, launch_host_func, binary_get_function, launch_kernel, register_kernel,
)
