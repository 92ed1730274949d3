"""PyTorch's own device-generic tests on the ``npu`` device: ``instantiate_device_type_tests`` with the
PrivateUse1 test base (torch.testing._internal.common_device_type), over PyTorch's OpInfo database
(common_methods_invocations.op_db: each operator's own sample inputs).

The pattern is PyTorch's ``test_compare_cpu`` (test/test_ops.py): every sample input of an operator runs
on the CPU and, moved to the device, on the device; the results must agree -- with PyTorch's float32
tolerances (``assertEqual``) for elementwise operators and data movement, and within the float32 rounding
bound of their sums (tests/fp32.py) for the operators that sum, where the npu kernels add in another order
than the CPU's.  The operators are those real inference and training code uses (the list
scripts/torch_ops_record.py records from SmolLM2, MiniLM and a training step); each instantiated test is
``test_compare_cpu_<op>_npu_float32``.  The samples are made on the CPU and moved (PyTorch makes them on
the device, whose random numbers come from another generator).  Two device-generic tests without OpInfo
check factories and copies between npu devices.
"""
from __future__ import annotations

import unittest

import pytest
import torch

import runtime.torch  # noqa: F401  (the npu device)
from conftest import installed, make_local_runtime
from fp32 import assert_within, gamma

# PyTorch adds its PrivateUse1 test base when ``torch.npu.is_available()`` at the moment
# common_device_type is imported; that call creates the process's vnpu runtime, so the import happens
# inside a runtime installed (and closed) for it -- nothing is left running after collection.
with installed(make_local_runtime(1, arena=64 << 20)):
    from torch.testing._internal import common_device_type as cdt
    from torch.testing._internal.common_methods_invocations import op_db
from torch.testing._internal.common_utils import TestCase  # noqa: E402

#: (OpInfo name, variant) -> what real code uses it for
OPS = {
    ("add", ""): "residuals, biases", ("mul", ""): "gates, scales", ("sub", ""): "rsub in masks",
    ("div", "no_rounding_mode"): "mean pooling", ("neg", ""): "rotary halves", ("pow", ""): "RMSNorm",
    ("rsqrt", ""): "RMSNorm", ("exp", ""): "softmax", ("tanh", ""): "BERT pooler", ("cos", ""): "rotary",
    ("sin", ""): "rotary", ("clamp", ""): "normalize", ("where", ""): "masks", ("masked_fill", ""): "masks",
    ("nn.functional.relu", ""): "MLPs", ("nn.functional.silu", ""): "SwiGLU", ("nn.functional.gelu", ""): "BERT FFN",
    ("mm", ""): "linear", ("bmm", ""): "attention", ("addmm", ""): "linear + bias", ("baddbmm", ""): "attention",
    ("matmul", ""): "everything", ("nn.functional.linear", ""): "projections",
    ("softmax", ""): "attention", ("nn.functional.layer_norm", ""): "BERT", ("nn.functional.rms_norm", ""): "Llama",
    ("nn.functional.embedding", ""): "token embeddings",
    ("nn.functional.scaled_dot_product_attention", ""): "attention",
    ("sum", ""): "pooling", ("mean", ""): "RMSNorm", ("amax", ""): "softmax", ("argmax", ""): "greedy decoding",
    ("cumsum", ""): "position ids", ("cat", ""): "KV cache", ("stack", ""): "batches", ("transpose", ""): "heads",
    ("permute", ""): "heads", ("index_select", ""): "gather", ("nn.functional.conv2d", ""): "CNNs",
    ("nn.functional.avg_pool2d", ""): "CNNs",
}
SELECTED = [op for op in op_db if (op.name, op.variant_test_name) in OPS]

#: instantiated test -> why it fails on the npu device today.  Marked as expected failures (reported as
#: xfail, never skipped): one that starts passing fails the suite ("unexpected success") until it leaves
#: this table, so the table is always the true list.
KNOWN_FAILING: dict[str, str] = {
    "test_compare_cpu_argmax_npu_float32": "argmax over a size-1 dim with keepdim (3,2,1,2), dim=2: ZeroDivisionError",
    "test_compare_cpu_nn_functional_conv2d_npu_float32": "conv2d of an unbatched (C, H, W) input: IndexError",
}


@pytest.fixture(scope="module", autouse=True)
def rt():
    """Two in-process devices (the cross-device test needs a second one)."""
    with installed(make_local_runtime(2, arena=256 << 20)) as r:
        yield r


def _to(x, device):
    """``x`` on ``device`` (a tensor; other arguments as they are), keeping requires_grad."""
    if not isinstance(x, torch.Tensor):
        return x
    return x.detach().to(device).requires_grad_(x.requires_grad)


#: operators linear in each argument: the same operator on the arguments' absolute values gives sum |terms|
#: of every result element (Higham's bound below is then exact in form)
LINEAR = {"mm", "bmm", "matmul", "addmm", "baddbmm", "nn.functional.linear", "nn.functional.conv2d", "sum",
          "mean", "cumsum", "nn.functional.avg_pool2d"}
#: sums inside a nonlinear function (exp, rsqrt): bounded by the terms' size, |result| + max |input|
NONLINEAR_SUMS = {"softmax", "nn.functional.scaled_dot_product_attention", "nn.functional.layer_norm",
                  "nn.functional.rms_norm"}


def _abs(x):
    if isinstance(x, torch.Tensor) and x.is_floating_point():
        return x.abs()
    return abs(x) if isinstance(x, float) else x


def _bound(op, cpu_sample, want: torch.Tensor) -> torch.Tensor:
    """Elementwise bound on |npu - cpu| for a float32 result that sums up to K terms (K <= the largest
    input's size): two orders of the same sum differ by at most 2 gamma(K + extra) sum |terms|."""
    tensors = [t for t in (cpu_sample.input, *cpu_sample.args, *cpu_sample.kwargs.values())
               if isinstance(t, torch.Tensor)]
    k = max([t.numel() for t in tensors], default=1)
    if op.name in LINEAR:
        mag = op(_abs(cpu_sample.input), *[_abs(a) for a in cpu_sample.args],
                 **{n: _abs(v) for n, v in cpu_sample.kwargs.items()})
        return 2 * gamma(k + 2) * mag.abs().double()
    biggest = max([float(t.abs().max()) for t in tensors if t.is_floating_point() and t.numel()], default=0.0)
    return 2 * gamma(k + 8) * (want.abs().double() + biggest)


class TestNpuGeneric(TestCase):
    @cdt.ops(SELECTED, allowed_dtypes=(torch.float32,))
    def test_compare_cpu(self, device, dtype, op):
        cpu_samples = list(op.sample_inputs("cpu", dtype))
        self.assertTrue(cpu_samples, f"{op.name} has no sample inputs")
        for cpu_sample in cpu_samples:
            sample = cpu_sample.transform(lambda x: _to(x, device))
            got = sample.output_process_fn_grad(op(sample.input, *sample.args, **sample.kwargs))
            want = cpu_sample.output_process_fn_grad(op(cpu_sample.input, *cpu_sample.args, **cpu_sample.kwargs))
            for g in (got if isinstance(got, (tuple, list)) else (got,)):
                if isinstance(g, torch.Tensor):
                    self.assertEqual(g.device.type, "npu", msg=f"{op.name}: a result left the device")
            what = f"{op.name} on {sample.summary()}"
            if op.name in LINEAR | NONLINEAR_SUMS:       # another summation order than the CPU kernel's
                self.assertEqual(got.shape, want.shape, msg=what)
                assert_within(got.cpu().numpy(), want.numpy(), _bound(op, cpu_sample, want).numpy(), what)
            else:                                         # elementwise and data movement: PyTorch's tolerances
                self.assertEqual(got, want, exact_device=False, msg=what)

    @cdt.dtypes(torch.float32, torch.int64)
    def test_factories_and_copies(self, device, dtype):
        ref = torch.arange(24, dtype=dtype).reshape(4, 6)
        t = torch.arange(24, dtype=dtype, device=device).reshape(4, 6)
        self.assertEqual(t.device.type, "npu")
        self.assertEqual(t.cpu(), ref)
        self.assertEqual(torch.zeros(3, dtype=dtype, device=device).cpu(), torch.zeros(3, dtype=dtype))
        self.assertEqual(torch.full((2, 2), 7, dtype=dtype, device=device).cpu(), torch.full((2, 2), 7, dtype=dtype))
        self.assertEqual(t.t().contiguous().cpu(), ref.t().contiguous())
        self.assertEqual(t[1:3, ::2].cpu(), ref[1:3, ::2])

    @cdt.deviceCountAtLeast(2)
    def test_copy_between_devices(self, devices):
        a = torch.randn(5, 7, device=devices[0])
        b = a.to(devices[1])
        self.assertEqual(b.device, torch.device(devices[1]))
        self.assertEqual((b * 2).cpu(), a.cpu() * 2)


cdt.instantiate_device_type_tests(TestNpuGeneric, globals(), only_for="privateuse1")
for _name in KNOWN_FAILING:       # (no module-level alias of the class: pytest would collect it twice)
    setattr(TestNpuGenericPRIVATEUSE1, _name,  # noqa: F821 (made by instantiate_device_type_tests)
            unittest.expectedFailure(getattr(TestNpuGenericPRIVATEUSE1, _name)))  # noqa: F821


def test_the_selection_is_instantiated():
    """Every selected operator has its instantiated test, and every known failure names one of them."""
    names = {n for n in dir(TestNpuGenericPRIVATEUSE1) if n.startswith("test_")}  # noqa: F821
    assert len(SELECTED) == len(OPS), sorted(set(OPS) - {(o.name, o.variant_test_name) for o in SELECTED})
    for op in SELECTED:
        assert f"test_compare_cpu_{op.formatted_name}_npu_float32" in names, op.name
    assert set(KNOWN_FAILING) <= names
