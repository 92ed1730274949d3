"""The built-in kernel library, on numpy: importing this package registers every built-in kernel.

Every kernel is ``run(ctx, inputs, outputs, attrs)`` (see :mod:`devices.kernel`): ``inputs`` are read-only
numpy views, ``outputs`` writable views of the checked shape and dtype.  Block ``ctx.block_idx`` of
``ctx.block_dim`` writes only its share (``ctx.split(parallel_dim)``) and the shares of all blocks cover
the outputs exactly once.  ``block_dim == 1`` takes a direct path: one numpy call per step, ``out=``
wherever numpy allows it, no copies beyond the fp32 upcast of float16 data.

Families, one module each (its docstring says what its blocks split over):

- :mod:`.elementwise`: binary (add, sub, mul, div, pow), unary and scalar (gelu, silu, relu, exp, tanh,
  sqrt, rsqrt, neg, erf, sigmoid, clip, add_scalar, mul_scalar, sin, cos, log, abs), maximum, minimum,
  swiglu, equal, where, cast, copy, fill;
- :mod:`.layout`: transpose, strided_slice, concat, expand, gather;
- :mod:`.norm`: softmax, layernorm, rmsnorm;  :mod:`.reduce`: reduce_sum/mean/max/min, argmax, cumsum;
- :mod:`.matmul`: matmul, batch_matmul, fused_matmul;
- :mod:`.quant`: weight_quant_matmul, quant_embedding (weights kept quantized: GGUF Q8_0 / Q4_1 / Q4_K
  blocks, int8 per-channel; layouts in :mod:`.qformats`);
- :mod:`.attention`: attention, incre_flash_attention, paged_attention (KV caches read in place);
- :mod:`.rope`;  :mod:`.embedding`: embedding, scatter_update (in place);
- :mod:`.cnn`: conv2d, max_pool2d, avg_pool2d, batch_norm;  :mod:`.aipp`: aipp (the image stage ATC puts
  in front of a model input);
- :mod:`.dvpp`: the DVPP media engines (JPEG decode/encode, PNG decode, VPC), on :mod:`.picture`;
  :mod:`.dvpp_video`: VDEC / VENC (H.264 / H.265, PyAV);
- :mod:`.logic`: less, less_equal, greater, greater_equal, not_equal, logical_and/or/xor/not;
- :mod:`.strided`: strided_gather, strided_scatter (as_strided views of a flat buffer).

What they share: :mod:`.checks` (launch checks: attribute, dtype and shape validation, InvalidParamError),
:mod:`.blocks` (how blocks split a launch), :mod:`.work` (flops and bytes for the cost model),
:mod:`.precision` (float16 in float32, silent floating-point exceptions), :mod:`.activations` (the
numpy activation functions, and the epilogues of fused kernels) and :mod:`.scratch` (per-thread buffers a
kernel reuses from launch to launch: paged attention's gathered keys and values).

Float16 is computed in float32 where it matters (matmul accumulation, softmax, norms, gelu/silu/swiglu,
rope, attention, sums) and rounded once into the output.  Floating-point exceptions are silent, as on
the device (``inf``/``nan`` results, no numpy warnings).  Elementwise, softmax, norm and rope kernels are
safe when an output aliases its input (same pointer).  A softmax or attention row whose entries are all
``-inf`` (fully masked) yields zeros, not NaN, so padding cannot poison later layers.  Indices, ids and
lengths read from device memory are checked when the kernel runs: one out of range is a KernelError
(the cached and indexed kernels trap with ACL_ERROR_RT_AICORE_TRAP_READ/WRITE_OVERFLOW) before any block
writes anything.
"""
from . import (aipp, attention, cnn, dvpp, dvpp_video, elementwise, embedding, layout, logic, matmul,  # noqa: F401
               norm, quant, reduce, rope, strided)
