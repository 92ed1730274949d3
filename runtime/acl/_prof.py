"""The implementation of ``acl.prof`` (:mod:`runtime.acl.prof` lists the API and says what it does)."""
from __future__ import annotations

import itertools
import logging
import os
import threading
from dataclasses import dataclass

from devices.errors import (ACL_ERROR_INVALID_PARAM, ACL_ERROR_PROF_ALREADY_RUN, ACL_ERROR_PROF_NOT_RUN,
                            ACL_ERROR_REPEAT_INITIALIZE, ACL_ERROR_UNINITIALIZE, AclError)
from runtime import profiler

from ._calls import acl_call, acl_value
from ._constants import (ACL_AICORE_MEMORY_ACCESS, ACL_AICORE_NONE, ACL_PROF_ACL_API, ACL_PROF_API_STATS,
                         ACL_PROF_AICORE_METRICS, ACL_PROF_AICPU, ACL_PROF_GE_API_L0, ACL_PROF_GE_API_L1,
                         ACL_PROF_HCCL_TRACE, ACL_PROF_L2CACHE, ACL_PROF_MSPROFTX, ACL_PROF_OP_ATTR,
                         ACL_PROF_RUNTIME_API, ACL_PROF_STORAGE_LIMIT, ACL_PROF_SYS_HARDWARE_MEM_FREQ,
                         ACL_PROF_TASK_MEMORY, ACL_PROF_TASK_TIME, ACL_PROF_TASK_TIME_L0, ACL_PROF_TASK_TIME_L2,
                         ACL_PROF_TASK_TIME_L3, ACL_PROF_TRAINING_TRACE)
from ._state import STATE

ACL_NAMESPACE = "acl.prof"           # these are acl.prof.* calls (runtime.acl._calls names them so)

_API_BITS = ACL_PROF_ACL_API | ACL_PROF_RUNTIME_API | ACL_PROF_API_STATS | ACL_PROF_GE_API_L0 | ACL_PROF_GE_API_L1
_TASK_BITS = ACL_PROF_TASK_TIME | ACL_PROF_TASK_TIME_L0 | ACL_PROF_TASK_TIME_L2 | ACL_PROF_TASK_TIME_L3
_KNOWN_BITS = (_API_BITS | _TASK_BITS | ACL_PROF_AICORE_METRICS | ACL_PROF_AICPU | ACL_PROF_L2CACHE
               | ACL_PROF_HCCL_TRACE | ACL_PROF_TRAINING_TRACE | ACL_PROF_MSPROFTX | ACL_PROF_TASK_MEMORY
               | ACL_PROF_OP_ATTR)
_CONFIG_TYPES = (ACL_PROF_STORAGE_LIMIT, ACL_PROF_SYS_HARDWARE_MEM_FREQ)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ProfConfig:
    """An aclprofConfig: what :func:`start` profiles."""
    devices: tuple[int, ...]
    aicore_metrics: int
    data_type_config: int


class _ProfState:
    def __init__(self):
        self.lock = threading.Lock()
        self.path: str | None = None
        self.configs: dict[int, ProfConfig] = {}
        self.running: int | None = None          # the started config's handle
        self.settings: dict[int, str] = {}
        self.handles = itertools.count(0x7000)
        self.last_dir: str | None = None          # the PROF_* folder the last stop wrote


_PROF = _ProfState()


def _uninit(what: str) -> AclError:
    return AclError(f"{what}: acl.prof.init has not been called", code=ACL_ERROR_UNINITIALIZE)


@acl_call()
def init(profiler_result_path):
    """aclprofInit: profiles go under ``profiler_result_path`` (made if missing)."""
    if not isinstance(profiler_result_path, str) or not profiler_result_path:
        raise AclError("profiler_result_path must be a non-empty path", code=ACL_ERROR_INVALID_PARAM)
    with _PROF.lock:
        if _PROF.path is not None:
            raise AclError("acl.prof.init was already called (finalize first)", code=ACL_ERROR_REPEAT_INITIALIZE)
        try:
            os.makedirs(profiler_result_path, exist_ok=True)
        except OSError as e:
            raise AclError(f"cannot create {profiler_result_path!r}: {e.strerror or e}",
                           code=ACL_ERROR_INVALID_PARAM) from None
        if not os.access(profiler_result_path, os.W_OK):
            raise AclError(f"{profiler_result_path!r} is not writable", code=ACL_ERROR_INVALID_PARAM)
        _PROF.path = profiler_result_path


@acl_value(0)
def create_config(device_list, aicore_metrics, aicore_events, data_type_config):
    """aclprofCreateConfig -> a config handle, 0 on failure (the reason in acl.get_recent_err_msg())."""
    if _PROF.path is None:
        raise _uninit("acl.prof.create_config")
    rt = STATE.rt
    count = rt.device_count() if rt is not None else 0
    devs = tuple(int(d) for d in device_list)
    bad = [d for d in devs if not 0 <= d < count]
    if bad:
        raise AclError(f"device ids {bad} out of range [0, {count})", code=ACL_ERROR_INVALID_PARAM)
    if not (0 <= int(aicore_metrics) <= ACL_AICORE_MEMORY_ACCESS or int(aicore_metrics) == ACL_AICORE_NONE):
        raise AclError(f"unknown aicore_metrics {aicore_metrics}", code=ACL_ERROR_INVALID_PARAM)
    if aicore_events not in (0, None):
        raise AclError("aicore_events must be 0", code=ACL_ERROR_INVALID_PARAM)
    dtc = int(data_type_config)
    if dtc <= 0 or dtc & ~_KNOWN_BITS:
        raise AclError(f"data_type_config 0x{dtc:x} has no or unknown ACL_PROF_* bits", code=ACL_ERROR_INVALID_PARAM)
    cfg = ProfConfig(devs, int(aicore_metrics), dtc)
    with _PROF.lock:
        h = next(_PROF.handles)
        _PROF.configs[h] = cfg
    return h


@acl_call()
def set_config(config_type, config_str):
    """aclprofSetConfig (before start): ACL_PROF_STORAGE_LIMIT ("<n>MB") etc. are kept, not enforced."""
    if _PROF.path is None:
        raise _uninit("acl.prof.set_config")
    if config_type not in _CONFIG_TYPES or not isinstance(config_str, str):
        raise AclError(f"unknown config type {config_type!r}", code=ACL_ERROR_INVALID_PARAM)
    with _PROF.lock:
        if _PROF.running is not None:
            raise AclError("set_config after start", code=ACL_ERROR_PROF_ALREADY_RUN)
        _PROF.settings[int(config_type)] = config_str


def _config(config) -> ProfConfig:
    cfg = _PROF.configs.get(config) if isinstance(config, int) else None
    if cfg is None:
        raise AclError(f"unknown profiling config {config!r}", code=ACL_ERROR_INVALID_PARAM)
    return cfg


@acl_call()
def start(config):
    """aclprofStart: record this process's API calls and its tasks on the config's devices."""
    if _PROF.path is None:
        raise _uninit("acl.prof.start")
    cfg = _config(config)
    with _PROF.lock:
        if _PROF.running is not None or profiler.active() is not None:
            raise AclError("a profile is already running", code=ACL_ERROR_PROF_ALREADY_RUN)
        _PROF.running = config
    try:
        profiler.start(record_api=bool(cfg.data_type_config & _API_BITS),
                       record_tasks=bool(cfg.data_type_config & _TASK_BITS), devices=set(cfg.devices))
    except RuntimeError as e:
        with _PROF.lock:
            _PROF.running = None
        raise AclError(str(e), code=ACL_ERROR_PROF_ALREADY_RUN) from None


@acl_call()
def stop(config):
    """aclprofStop: stop and write the PROF_* folder under the init path."""
    if _PROF.path is None:
        raise _uninit("acl.prof.stop")
    _config(config)
    with _PROF.lock:
        if _PROF.running != config:
            raise AclError("this config is not running", code=ACL_ERROR_PROF_NOT_RUN)
        _PROF.running = None
        path = _PROF.path
    _write(profiler.stop(), path)


def _write(raw, path: str) -> None:
    prof_dir = profiler.new_prof_dir(path)
    profiler.write_raw(prof_dir, raw)
    profiler.export(prof_dir, [raw])
    _PROF.last_dir = prof_dir


@acl_call()
def destroy_config(config):
    """aclprofDestroyConfig (a running config cannot be destroyed: stop it first)."""
    with _PROF.lock:
        if config not in _PROF.configs or not isinstance(config, int):
            raise AclError(f"unknown profiling config {config!r}", code=ACL_ERROR_INVALID_PARAM)
        if _PROF.running == config:
            raise AclError("the config is running (stop it first)", code=ACL_ERROR_PROF_ALREADY_RUN)
        del _PROF.configs[config]


@acl_call()
def finalize():
    """aclprofFinalize: a profile still running is stopped and written first."""
    with _PROF.lock:
        if _PROF.path is None:
            raise _uninit("acl.prof.finalize")
        running, path = _PROF.running, _PROF.path
        _PROF.running = None
        _PROF.path = None
        _PROF.settings.clear()
    if running is not None:
        _write(profiler.stop(), path)


def teardown() -> None:
    """What ``acl.finalize`` does to profiling (aclFinalize calls MsprofFinalize): a profile still running
    is stopped and written under the init path, and the session is gone -- init path, configs, settings --
    so that after the next ``acl.init`` an ``acl.prof`` call needs ``acl.prof.init`` again (100001 before
    it) and ``acl.prof.init`` succeeds.  Not a pyACL call (``acl.finalize`` calls it before it releases
    the devices); a profile that cannot be written is logged, not raised, as CANN logs a failed
    MsprofFinalize and finalizes all the same.  Host-blocking: one round trip per profiled device."""
    with _PROF.lock:
        running, path = _PROF.running, _PROF.path
        _PROF.running = None
        _PROF.path = None
        _PROF.settings.clear()
        _PROF.configs.clear()
    if running is None or path is None:
        return
    try:
        _write(profiler.stop(), path)
    except (OSError, RuntimeError, AclError):
        log.error("acl.finalize: the running profile could not be written under %s", path, exc_info=True)


def last_output() -> str | None:
    """The PROF_* folder the last ``stop`` (or ``finalize``) wrote (vnpu's addition, for scripts)."""
    return _PROF.last_dir

