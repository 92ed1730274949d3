"""``acl.prof``: pyACL's profiling calls (aclprof*, acl_prof.h) over :mod:`runtime.profiler`.

Order (reference pyacl_models_prof.md 5.1): ``acl.prof.init(path)`` after ``acl.init`` -> ``config =
acl.prof.create_config(device_list, aicore_metrics, 0, data_type_config)`` -> ``acl.prof.start(config)``
-> the work -> ``acl.prof.stop(config)`` -> ``acl.prof.destroy_config(config)`` -> ``acl.prof.finalize()``.
``stop`` writes a ``PROF_*`` folder under the init path in msprof's layout (:mod:`runtime.profiler.export`).

What a config selects: the devices (user ids; only their tasks are recorded, and only this process's),
host API records when ``ACL_PROF_ACL_API`` or ``ACL_PROF_RUNTIME_API`` is set, device task records when
any ``ACL_PROF_TASK_TIME*`` bit is set.  AI Core PMU metrics are not emulated (the metric is accepted and
recorded in the config only).

Codes: a call before ``acl.init`` or ``start``/``stop``/``finalize``/``create_config`` before
``prof.init`` -> ACL_ERROR_UNINITIALIZE (100001); ``prof.init`` twice -> ACL_ERROR_REPEAT_INITIALIZE
(100002); an empty or unwritable path, an unknown config handle (also a second ``destroy_config``) ->
ACL_ERROR_INVALID_PARAM (100000); ``create_config`` with a bad device id, metric, non-zero
``aicore_events`` or no known data type bit -> 0 (the C NULL); ``start`` while a profile runs ->
ACL_ERROR_PROF_ALREADY_RUN (100042); ``stop`` of a config that is not running -> ACL_ERROR_PROF_NOT_RUN
(100043).  All calls are host-synchronous (``start``/``stop`` make one round trip per device).

``acl.finalize`` (and ``acl.finalize_reference`` reaching 0) ends the profiling session as aclFinalize does
(it calls MsprofFinalize): a running profile is stopped and written, and the init path and configs are
forgotten (:func:`runtime.acl._prof.teardown`) -- after it, any ``acl.prof`` call is 100001 (acl
uninitialized), and after a new ``acl.init`` ``acl.prof.init`` is needed again and succeeds.

This module holds the API of ``acl.prof`` and nothing else (``dir(acl.prof)`` lists exactly it, as pyACL's
does; tests/reference/pyacl_api.txt); the functions live in :mod:`runtime.acl._prof`.
"""
from ._prof import (  # noqa: F401 - the API of acl.prof
    init, create_config, set_config, start, stop, destroy_config, finalize, last_output,
)
