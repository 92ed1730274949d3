"""``acl.mdl``: model run instances (``aclmdlRI*``): graphs captured from a stream ("aclgraph", see
:mod:`runtime.graph`) and replayed as one stream task.  The model-loading half of ``aclmdl*`` (load a
model file, datasets, execute) will live here too.
"""
from __future__ import annotations

import logging

from devices.errors import InvalidParamError

from .args import as_int
from .calls import acl_call
from .state import STATE, stream_record

log = logging.getLogger("vnpu.acl")


# ---------------------------------------------------------------- model run instances (aclmdlRI)
@acl_call()
def ri_capture_begin(stream, mode=0):
    """aclmdlRICaptureBegin: later tasks on ``stream`` are recorded, not run."""
    stream_record(stream).stream.begin_capture(as_int(mode, "mode"))


@acl_call(outs=(0, 0))
def ri_capture_get_info(stream):
    """aclmdlRICaptureGetInfo -> (status, model_ri, ret): status 0 none / 1 active / 2 invalidated;
    model_ri is 0 until the capture ends."""
    return stream_record(stream).stream.capture_status(), 0


@acl_call(outs=(0,))
def ri_capture_end(stream):
    """aclmdlRICaptureEnd -> (model_ri, ret)."""
    g = stream_record(stream).stream.end_capture()
    h = STATE.new_handle()
    STATE.model_ris[h] = g
    return h


@acl_call()
def ri_execute_async(model_ri, stream):
    """aclmdlRIExecuteAsync: queue one replay on ``stream`` (returns at once)."""
    _model_ri(model_ri).execute_async(stream_record(stream).stream)


@acl_call()
def ri_execute(model_ri, timeout):
    """aclmdlRIExecute: replay and wait (``timeout`` ms, -1 forever)."""
    _model_ri(model_ri).execute(as_int(timeout, "timeout"))


@acl_call()
def ri_debug_print(model_ri):
    """aclmdlRIDebugPrint: log the model's tasks (also returned by runtime.graph.Graph.info)."""
    log.info("model RI 0x%x: %s", int(model_ri), _model_ri(model_ri).info())


@acl_call()
def ri_destroy(model_ri):
    """aclmdlRIDestroy (replays already queued still run)."""
    g = _model_ri(model_ri)
    STATE.model_ris.pop(int(model_ri), None)
    g.destroy()


def _model_ri(handle):
    g = STATE.model_ris.get(as_int(handle, "model_ri"))
    if g is None:
        raise InvalidParamError(f"unknown or destroyed model run instance {handle!r}")
    return g


