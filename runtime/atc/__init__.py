"""``vnpu atc``: the offline model compiler (ONNX -> vnpu ``.om``).

    from runtime.atc import compile_model, make_options
    cm = compile_model("m.onnx", make_options(input_shape="x:-1,3,32,32", dynamic_batch_size="1,2,4"))
    cm.save("m.om"); print(cm.report)

Modules, one job each: :mod:`.options` (ATC flags), :mod:`.onnx_import`, :mod:`.ir`, :mod:`.ops` (the
operator table: shape inference, folding, lowering per op), :mod:`.fold`, :mod:`.fuse`, :mod:`.lower`,
:mod:`.program`, :mod:`.memplan`, :mod:`.om` (the container), :mod:`.compiler` (the pipeline),
:mod:`.hostrun` (a compiled gear run by numpy on the host: the bound the device replay is measured
against).
"""
from .compiler import CompiledModel, compile_model
from .om import read_om, write_om
from .options import DEFAULT_SOC, DYNAMIC_INPUT_NAME, CompileOptions, make_options

__all__ = ["CompiledModel", "compile_model", "read_om", "write_om", "CompileOptions", "make_options", "DEFAULT_SOC",
           "DYNAMIC_INPUT_NAME"]
