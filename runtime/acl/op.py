"""``acl.op``: single-operator execution (``aclop*``): attribute sets, single-operator models, execution by
operator type or by handle, and Cast.

An operator runs from a single-operator model, as in CANN: ``vnpu atc --singleop op_list.json --output
DIR`` compiles the entries of an ATC op list (each an operator type, its input and output descriptions
-- a constant input with its values -- and attributes) into one ``.om`` each; ``set_model_dir(DIR)`` (or
``load`` from host memory) makes them known to the process; ``execute_v2(op_type, input_descs,
input_buffers, output_descs, output_buffers, attr, stream)`` runs the one whose type, descriptions
(data type, format, dims, constant values set with ``acl.set_tensor_const``) and attributes match the
call (an attribute at the operator's default matches one not given).  No model of the type:
100024 ACL_ERROR_OP_NOT_FOUND; a type whose models differ in the inputs, outputs or attributes: 100021,
100022 or 100023.  ``create_handle`` matches once for ``execute_with_handle``; ``cast`` and
``create_handle_for_cast`` find the Cast to the output description's type.

An execution is a model execution on the current context's device (:mod:`runtime.offline`): the model is
uploaded the first time a context runs it and goes with that context; ``execute_v2`` only queues the
work on ``stream`` (the device kernel's errors surface at ``synchronize_stream``) and goes through the
same launch checks, cost model, profiler and sanitizer as ``acl.mdl``.  A constant input's data buffer is
not read (pass ``acl.create_data_buffer(0, 0)``, as the public samples do).

This module holds the API of ``acl.op`` and nothing else (``dir(acl.op)`` lists exactly it;
tests/reference/pyacl_api.txt); the functions live in :mod:`runtime.acl._op`.
"""
from ._op import (  # noqa: F401 - the API of acl.op
    create_attr, destroy_attr, set_attr_bool, set_attr_int, set_attr_float, set_attr_string, set_attr_data_type,
    set_attr_list_bool, set_attr_list_int, set_attr_list_float, set_attr_list_string, set_attr_list_data_type,
    set_attr_list_list_int, set_model_dir, load, execute_v2, create_handle, create_handle_for_cast,
    execute_with_handle, destroy_handle, cast,
)
