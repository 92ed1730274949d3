"""``acl.app_log(log_level, message)``: aclAppLog, an application's own log lines in CANN's log.

Levels are aclLogLevel: ACL_DEBUG 0, ACL_INFO 1, ACL_WARNING 2, ACL_ERROR 3.  Where CANN writes plog
files, vnpu hands every line to the Python logger ``vnpu.acl.app`` (at the matching logging level, with
the acl level in the record's ``acl_level``), so an application's logging configuration decides where
it goes.  As in CANN, ``ASCEND_SLOG_PRINT_TO_STDOUT=1`` (or ``ASCEND_LOG_PRINT_TO_STDOUT=1``) also prints
it to stdout in plog's line format when its level reaches ``ASCEND_GLOBAL_LOG_LEVEL`` (0-3; default 3,
ERROR only; 4 prints nothing)::

    [ERROR] APP(4242,python3):2025-01-31-10:14:35.646.123 [sample.py:30 main] model load failed

Returns None (a C void function); a level outside 0-3 logs nothing and leaves its text for
``acl.get_recent_err_msg()``.  Needs no ``acl.init()``.
"""
from __future__ import annotations

import datetime
import logging
import os
import sys

from ._calls import record_error
from ._constants import ACL_DEBUG, ACL_ERROR, ACL_INFO, ACL_WARNING

ACL_NAMESPACE = "acl"

log = logging.getLogger("vnpu.acl.app")

#: aclLogLevel -> (plog level name, logging level)
LEVELS = {ACL_DEBUG: ("DEBUG", logging.DEBUG), ACL_INFO: ("INFO", logging.INFO),
          ACL_WARNING: ("WARNING", logging.WARNING), ACL_ERROR: ("ERROR", logging.ERROR)}
#: ASCEND_GLOBAL_LOG_LEVEL when unset (ERROR), and its "print nothing" value
DEFAULT_PRINT_LEVEL = ACL_ERROR
LEVEL_NULL = 4
_STDOUT_VARS = ("ASCEND_SLOG_PRINT_TO_STDOUT", "ASCEND_LOG_PRINT_TO_STDOUT")


def app_log(log_level, message) -> None:
    """aclAppLog: log ``message`` (any object, logged as ``str``) at ``log_level`` (see the module doc)."""
    if isinstance(log_level, bool) or not isinstance(log_level, int) or log_level not in LEVELS:
        record_error("acl.app_log", f"unknown aclLogLevel {log_level!r} (ACL_DEBUG 0 .. ACL_ERROR 3)")
        return None
    name, level = LEVELS[log_level]
    text = str(message)
    log.log(level, "%s", text, extra={"acl_level": log_level})
    if any(os.environ.get(v) == "1" for v in _STDOUT_VARS) and log_level >= _print_level():
        print(plog_line(name, text), flush=True)
    return None


def plog_line(level_name: str, text: str) -> str:
    """One line in plog's format: ``[LEVEL] APP(pid,program):timestamp text``."""
    now = datetime.datetime.now()
    stamp = now.strftime("%Y-%m-%d-%H:%M:%S") + f".{now.microsecond // 1000:03d}.{now.microsecond % 1000:03d}"
    prog = os.path.basename(sys.executable) or "python"
    return f"[{level_name}] APP({os.getpid()},{prog}):{stamp} {text}"


def _print_level() -> int:
    raw = os.environ.get("ASCEND_GLOBAL_LOG_LEVEL", "")
    try:
        value = int(raw)
    except ValueError:
        return DEFAULT_PRINT_LEVEL
    return value if ACL_DEBUG <= value <= LEVEL_NULL else DEFAULT_PRINT_LEVEL
