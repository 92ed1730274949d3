"""Offline models on devices (what ``acl.mdl`` wraps): load a ``vnpu atc`` .om (or an .onnx compiled on
load), describe it, execute it as one graph replay per call, switch dynamic batch gears, unload.

    from runtime import offline
    m = offline.load("m.om", device)            # or offline.load("m.onnx", device, input_shape="x:1,3,32,32")
    m.desc.inputs[0].name, m.desc.inputs[0].size, m.desc.dynamic_batch
    m.execute([x_tensor], [y_tensor], stream)   # device buffers: Tensor, DataBuffer(ptr, size) or (ptr, size)
    m.unload()
"""
from .desc import ACL_DTYPES, ACL_FORMATS, IOSpec, ModelDesc
from .model import DataBuffer, OfflineModel, as_buffer, get_model, load, load_from_bytes

__all__ = ["ACL_DTYPES", "ACL_FORMATS", "IOSpec", "ModelDesc", "DataBuffer", "OfflineModel", "as_buffer", "get_model",
           "load", "load_from_bytes"]
