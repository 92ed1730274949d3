"""The dynamic-AIPP calls of ``acl.mdl`` (``aclmdlCreateAIPP`` ... ``aclmdlSetInputAIPP``,
``aclmdlGetAippType``): parameter sets built on the host and written into a dynamic-AIPP model's
``ascend_dynamic_aipp_data`` input before an execution (see :mod:`runtime.atc.aipp`).

A parameter set holds one row per picture of a batch (:data:`devices.ops.aipp.FIELDS`); the calls
without ``batch_index`` set every row.  Values are checked when the set is applied to a model
(``set_input_aipp``): a picture whose crop and padding do not give the model input's size is 145000.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from devices.errors import ACL_ERROR_FEATURE_UNSUPPORTED, AclError
from devices.ops.aipp import COL, FORMATS, PARAMS

from ._args import as_int, invalid
from ._calls import acl_call, acl_value
from ._state import STATE, add_object, drop_object, model_record, object_record

ACL_NAMESPACE = "acl.mdl"           # these are acl.mdl.* calls (runtime.acl._calls names them so)

#: aclmdlGetAippType's aclmdlInputAippType
ACL_DATA_WITHOUT_AIPP, ACL_DATA_WITH_STATIC_AIPP, ACL_DATA_WITH_DYNAMIC_AIPP, ACL_DYNAMIC_AIPP_NODE = 0, 1, 2, 3
_TYPES = {"none": ACL_DATA_WITHOUT_AIPP, "static": ACL_DATA_WITH_STATIC_AIPP, "dynamic": ACL_DATA_WITH_DYNAMIC_AIPP,
          "params": ACL_DYNAMIC_AIPP_NODE}
#: the largest batch a parameter set takes (ACL_MAX_BATCH_NUM)
MAX_BATCH = 128


@dataclass(eq=False)
class AippSet:
    handle: int
    rows: np.ndarray                    #: float64 [batch, PARAMS]


@acl_value(0, init=False)
def create_aipp(batch_size):
    """aclmdlCreateAIPP(batch_size) -> a parameter set for ``batch_size`` pictures (0 on failure)."""
    n = as_int(batch_size, "batch size")
    if not 1 <= n <= MAX_BATCH:
        raise invalid(f"batch size must be 1..{MAX_BATCH}, got {n}")
    rows = np.zeros((n, PARAMS), np.float64)
    rows[:, COL["var_reci_chn_0"]:COL["var_reci_chn_3"] + 1] = 1.0
    return add_object(STATE.aipp_sets, lambda h: AippSet(h, rows))


@acl_call(init=False)
def destroy_aipp(aipp_parms_set):
    drop_object(STATE.aipp_sets, aipp_parms_set, "AIPP parameter set")


def _rows(aipp, batch_index=None) -> np.ndarray:
    s = object_record(STATE.aipp_sets, aipp, "AIPP parameter set")
    if batch_index is None:
        return s.rows
    i = as_int(batch_index, "batch index")
    if not 0 <= i < len(s.rows):
        raise invalid(f"batch index {i} is out of range: the set has {len(s.rows)} pictures")
    return s.rows[i:i + 1]


def _put(rows: np.ndarray, first: str, values) -> None:
    for k, v in enumerate(values):
        if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)):
            raise invalid(f"AIPP value {v!r} is not a number")
        rows[:, COL[first] + k] = float(v)


def _switch(v) -> int:
    s = as_int(v, "switch")
    if s not in (0, 1):
        raise invalid(f"a switch is 0 or 1, got {s}")
    return s


@acl_call(init=False)
def set_aipp_input_format(aipp_parms_set, input_format):
    """aclmdlSetAIPPInputFormat: ACL_YUV420SP_U8 1, ACL_XRGB8888_U8 2, ACL_RGB888_U8 3, ACL_YUV400_U8 4."""
    f = as_int(input_format, "input format")
    if f not in FORMATS:
        raise AclError(f"AIPP input format {f} is not one vnpu reads ({', '.join(f'{k} {v[0]}' for k, v in FORMATS.items())})",
                       code=ACL_ERROR_FEATURE_UNSUPPORTED)
    _put(_rows(aipp_parms_set), "input_format", [f])


@acl_call(init=False)
def set_aipp_src_image_size(aipp_parms_set, src_image_size_w, src_image_size_h):
    w, h = as_int(src_image_size_w, "width"), as_int(src_image_size_h, "height")
    if w <= 0 or h <= 0:
        raise invalid(f"source picture size must be positive, got {w}x{h}")
    _put(_rows(aipp_parms_set), "src_image_size_w", [w, h])


@acl_call(init=False)
def set_aipp_csc_params(aipp_parms_set, csc_switch, csc_matrix_r0_c0, csc_matrix_r0_c1, csc_matrix_r0_c2,
                        csc_matrix_r1_c0, csc_matrix_r1_c1, csc_matrix_r1_c2, csc_matrix_r2_c0, csc_matrix_r2_c1,
                        csc_matrix_r2_c2, csc_output_bias_r0, csc_output_bias_r1, csc_output_bias_r2,
                        csc_input_bias_r0, csc_input_bias_r1, csc_input_bias_r2):
    """aclmdlSetAIPPCscParams: the switch, the 3x3 matrix (x256), output then input biases."""
    rows = _rows(aipp_parms_set)
    _put(rows, "csc_switch", [_switch(csc_switch)])
    _put(rows, "matrix_r0c0", [csc_matrix_r0_c0, csc_matrix_r0_c1, csc_matrix_r0_c2, csc_matrix_r1_c0,
                               csc_matrix_r1_c1, csc_matrix_r1_c2, csc_matrix_r2_c0, csc_matrix_r2_c1,
                               csc_matrix_r2_c2])
    _put(rows, "output_bias_0", [csc_output_bias_r0, csc_output_bias_r1, csc_output_bias_r2])
    _put(rows, "input_bias_0", [csc_input_bias_r0, csc_input_bias_r1, csc_input_bias_r2])


@acl_call(init=False)
def set_aipp_rbuv_swap_switch(aipp_parms_set, rbuv_swap_switch):
    _put(_rows(aipp_parms_set), "rbuv_swap_switch", [_switch(rbuv_swap_switch)])


@acl_call(init=False)
def set_aipp_ax_swap_switch(aipp_parms_set, ax_swap_switch):
    """Only 0: vnpu's XRGB8888 reads the X byte first."""
    _rows(aipp_parms_set)
    if _switch(ax_swap_switch):
        raise AclError("vnpu's AIPP has no AX swap", code=ACL_ERROR_FEATURE_UNSUPPORTED)


@acl_call(init=False)
def set_aipp_scf_params(aipp_parms_set, scf_switch, scf_input_size_w, scf_input_size_h, scf_output_size_w,
                        scf_output_size_h, batch_index):
    """Only scf_switch 0: vnpu's AIPP does not scale (resize with DVPP's VPC first)."""
    _rows(aipp_parms_set, batch_index)
    if _switch(scf_switch):
        raise AclError("vnpu's AIPP does not scale pictures (scf); resize them with acl.media VPC",
                       code=ACL_ERROR_FEATURE_UNSUPPORTED)


@acl_call(init=False)
def set_aipp_crop_params(aipp_parms_set, crop_switch, crop_start_pos_w, crop_start_pos_h, crop_size_w, crop_size_h,
                         batch_index):
    rows = _rows(aipp_parms_set, batch_index)
    _put(rows, "crop", [_switch(crop_switch), crop_start_pos_w, crop_start_pos_h, crop_size_w, crop_size_h])


@acl_call(init=False)
def set_aipp_padding_params(aipp_parms_set, padding_switch, padding_size_top, padding_size_bottom,
                            padding_size_left, padding_size_right, batch_index):
    rows = _rows(aipp_parms_set, batch_index)
    _put(rows, "padding", [_switch(padding_switch), padding_size_top, padding_size_bottom, padding_size_left,
                           padding_size_right])


@acl_call(init=False)
def set_aipp_dtc_pixel_mean(aipp_parms_set, dtc_pixel_mean_chn0, dtc_pixel_mean_chn1, dtc_pixel_mean_chn2,
                            dtc_pixel_mean_chn3, batch_index):
    _put(_rows(aipp_parms_set, batch_index), "mean_chn_0",
         [dtc_pixel_mean_chn0, dtc_pixel_mean_chn1, dtc_pixel_mean_chn2, dtc_pixel_mean_chn3])


@acl_call(init=False)
def set_aipp_dtc_pixel_min(aipp_parms_set, dtc_pixel_min_chn0, dtc_pixel_min_chn1, dtc_pixel_min_chn2,
                           dtc_pixel_min_chn3, batch_index):
    _put(_rows(aipp_parms_set, batch_index), "min_chn_0",
         [dtc_pixel_min_chn0, dtc_pixel_min_chn1, dtc_pixel_min_chn2, dtc_pixel_min_chn3])


@acl_call(init=False)
def set_aipp_pixel_var_reci(aipp_parms_set, dtc_pixel_var_reci_chn0, dtc_pixel_var_reci_chn1,
                            dtc_pixel_var_reci_chn2, dtc_pixel_var_reci_chn3, batch_index):
    _put(_rows(aipp_parms_set, batch_index), "var_reci_chn_0",
         [dtc_pixel_var_reci_chn0, dtc_pixel_var_reci_chn1, dtc_pixel_var_reci_chn2, dtc_pixel_var_reci_chn3])


@acl_call()
def set_input_aipp(model_id, dataset, index, aipp_parms_set):
    """aclmdlSetInputAIPP: write the set into the dataset's buffer ``index`` (the model's
    ascend_dynamic_aipp_data input); host-synchronous."""
    from ._mdl import dataset_buffer
    rec = model_record(model_id)
    rows = _rows(aipp_parms_set)
    i = as_int(index, "index")
    rec.model.set_input_aipp(dataset_buffer(dataset, i), i, rows.copy())


@acl_call(outs=(ACL_DATA_WITHOUT_AIPP, -1))
def get_aipp_type(model_id, index):
    """aclmdlGetAippType -> (type, dynamic_attached_data_index, ret): ACL_DATA_WITHOUT_AIPP 0,
    ACL_DATA_WITH_STATIC_AIPP 1, ACL_DATA_WITH_DYNAMIC_AIPP 2 (with the parameter input's index),
    ACL_DYNAMIC_AIPP_NODE 3 (the parameter input itself); the index is -1 when there is none."""
    kind, attached = model_record(model_id).model.aipp_type(as_int(index, "index"))
    return _TYPES[kind], -1 if attached is None else attached
