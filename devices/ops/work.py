"""The work a launch does (:class:`~devices.chip.Work`: flops and bytes for the roofline cost model),
shared by the kernel families."""
from __future__ import annotations

from ..chip import Work


def io_bytes(inputs, outputs) -> int:
    return sum(d.nbytes for d in inputs) + sum(d.nbytes for d in outputs)


def vector_work(flops_per_elem: float):
    """``flops_per_elem`` per output element, every tensor read/written once."""
    def work(inputs, outputs, attrs):
        n = outputs[0].numel if outputs else 0
        return Work(flops=flops_per_elem * n, bytes=io_bytes(inputs, outputs), unit="vector")
    return work


def input_vector_work(flops_per_elem: float):
    """Like :func:`vector_work` but counted per element of the first input (reductions, norms)."""
    def work(inputs, outputs, attrs):
        return Work(flops=flops_per_elem * inputs[0].numel, bytes=io_bytes(inputs, outputs), unit="vector")
    return work


def cube_work(inputs, outputs, flops) -> Work:
    return Work(flops=flops, bytes=io_bytes(inputs, outputs), unit="cube", fp16=outputs[0].dtype == "float16")
