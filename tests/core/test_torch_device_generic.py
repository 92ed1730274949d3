"""PyTorch's own device-generic tests on the ``npu`` device: ``instantiate_device_type_tests`` with the
PrivateUse1 test base (torch.testing._internal.common_device_type), over PyTorch's OpInfo database
(common_methods_invocations.op_db: each operator's own sample inputs).

The pattern is PyTorch's ``test_compare_cpu`` (test/test_ops.py): every sample input of an operator runs
on the CPU and, moved to the device, on the device; the results must agree (``assertEqual``, PyTorch's
float32 tolerances).  The operators are those real inference and training code uses (the list recorded
from SmolLM2, MiniLM and a training step: /work/notes/torch_ops.md); each instantiated test is
``test_compare_cpu_<op>_npu_float32``.  (The samples are made on the CPU and moved, where PyTorch makes
them on the device: random tensors made on the npu device draw from another generator.)  Two device-generic tests without OpInfo check factories and
cross-device copies on every visible npu device.
"""
from __future__ import annotations

import unittest

import pytest
import torch

import runtime.torch  # noqa: F401  (the npu device)
from conftest import installed, make_local_runtime

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
            self.assertEqual(got, want, exact_device=False, msg=f"{op.name} on {sample.summary()}")

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
_CLS = globals()["TestNpuGenericPRIVATEUSE1"]
for _name, _why in KNOWN_FAILING.items():
    setattr(_CLS, _name, unittest.expectedFailure(getattr(_CLS, _name)))


def test_the_selection_is_instantiated():
    """Every selected operator has its instantiated test, and every known failure names one of them."""
    names = {n for n in dir(_CLS) if n.startswith("test_")}
    assert len(SELECTED) == len(OPS), sorted(set(OPS) - {(o.name, o.variant_test_name) for o in SELECTED})
    for op in SELECTED:
        assert f"test_compare_cpu_{op.formatted_name}_npu_float32" in names, op.name
    assert set(KNOWN_FAILING) <= names
