"""``acl.mdl``: offline models (``aclmdl*``: load, describe, datasets, execute, dynamic batch and dynamic
image size) and model run instances (``aclmdlRI*``: graphs captured from a stream, see :mod:`runtime.graph`).

Models are :mod:`runtime.offline` models: ``load_from_file`` takes a ``vnpu atc`` .om (an ``.onnx`` path
is compiled on load for the device's SoC: a vnpu extension), ``load_from_mem`` the bytes of one at a HOST
address (read through the host-pointer table, :mod:`runtime.hostmem`).  A model belongs to the
context that loaded it and goes with it (``reset_device``, ``destroy_context``, ``finalize``).  An
execution is ONE replay of the model's captured kernel graph between D2D copies of the dataset's
buffers; ``execute`` runs it on the current context's default stream and blocks the host until it is
done, ``execute_async`` only queues it on ``stream`` (``synchronize_stream`` reports its errors).

Handles (model descriptions, datasets) are ints; getters that are bare values in pyACL
(``get_num_inputs``, ``get_input_size_by_index``, ``get_input_data_type`` ...) return C's failure value
(0, -1, "") for an unknown or destroyed handle or an index out of range, the others ``(value, ret)``.
Codes, as CANN's acl layer and GE answer them: an unknown or destroyed handle, an index out of range, a
null address, batch 0, a name not found -> 100000 ACL_ERROR_INVALID_PARAM; an unloaded model id 145003;
buffer counts 100017/100018, sizes 145000, data types (a dataset tensor description that disagrees with
the model) 145022, gears 145013 (a batch or a (height, width) that is not one: ``set_dynamic_batch_size``,
``set_dynamic_hw_size``; ``get_dynamic_batch`` / ``get_dynamic_hw`` list them), dynamic input 145011/145012 (see :mod:`runtime.offline.model`); a
stream of another context 107003.  Nothing is queued when a call is refused.

Dynamic AIPP (a model compiled with ``aipp_mode : dynamic``, :mod:`runtime.atc.aipp`): ``create_aipp(batch)``
makes a parameter set, the ``set_aipp_*`` calls fill it (those with ``batch_index`` one picture),
``set_input_aipp(model_id, dataset, index, set)`` writes it into the dataset's buffer of the model's
``ascend_dynamic_aipp_data`` input (``get_aipp_type`` names which input that is); scaling (``scf``) and AX
swap are refused with 200006 ACL_ERROR_FEATURE_UNSUPPORTED.

This module holds the API of ``acl.mdl`` and nothing else (``dir(acl.mdl)`` lists exactly it, as pyACL's
does; tests/reference/pyacl_api.txt); the functions live in :mod:`runtime.acl._mdl`.
"""
from ._mdl import (  # noqa: F401 - the API of acl.mdl
    load_from_file, load_from_mem, unload, create_desc, destroy_desc, get_desc, get_num_inputs, get_num_outputs,
    get_input_size_by_index, get_output_size_by_index, get_input_dims, get_output_dims, get_cur_output_dims,
    get_input_data_type, get_output_data_type, get_input_format, get_output_format, get_input_name_by_index,
    get_output_name_by_index, get_input_index_by_name, get_output_index_by_name, get_dynamic_batch,
    get_dynamic_hw, create_dataset, destroy_dataset, add_dataset_buffer, get_dataset_buffer,
    get_dataset_num_buffers, set_dataset_tensor_desc, get_dataset_tensor_desc, execute, execute_async,
    set_dynamic_batch_size, set_dynamic_hw_size, ri_capture_begin, ri_capture_get_info, ri_capture_end,
    ri_execute_async, ri_execute,
    ri_debug_print, ri_destroy,
)
from ._aipp import (  # noqa: F401 - dynamic AIPP
    create_aipp, destroy_aipp, set_aipp_input_format, set_aipp_src_image_size, set_aipp_csc_params,
    set_aipp_rbuv_swap_switch, set_aipp_ax_swap_switch, set_aipp_scf_params, set_aipp_crop_params,
    set_aipp_padding_params, set_aipp_dtc_pixel_mean, set_aipp_dtc_pixel_min, set_aipp_pixel_var_reci,
    set_input_aipp, get_aipp_type,
)
