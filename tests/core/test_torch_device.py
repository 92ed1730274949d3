"""runtime.torch: the ``npu`` device itself -- tensors in vnpu HBM, host copies, views, device selection,
bad input.  In-process devices (one 2-device runtime for the module); numbers checked against torch on CPU."""
from __future__ import annotations

import pytest
import torch

import runtime.torch as rtorch
from conftest import installed, make_local_runtime


@pytest.fixture(scope="module", autouse=True)
def npu_runtime():
    with installed(make_local_runtime(2)) as r:
        yield r


def test_tensor_lives_in_vnpu_hbm_and_round_trips():
    a = torch.randn(3, 5, generator=torch.Generator().manual_seed(0))
    before = torch.npu.memory_allocated(0)
    x = a.to("npu")
    assert x.device == torch.device("npu", 0) and x.is_npu and not a.is_npu
    assert torch.npu.memory_allocated(0) >= before + a.numel() * 4
    assert torch.equal(x.cpu(), a)
    assert rtorch.nbytes(x) == 60 and rtorch.vnpu_device(x).index == 0
    raw = rtorch.vnpu_device(x).memcpy_d2h(rtorch.device_ptr(x), 60)     # the bytes really are on the device
    assert raw.tobytes() == a.numpy().tobytes()


def test_views_share_device_memory_and_write_through():
    a = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    x = a.npu()
    assert torch.equal(x.t().cpu(), a.t())
    assert torch.equal(x[1:, 2].cpu(), a[1:, 2])
    assert torch.equal(x[:, ::2].reshape(-1).cpu(), a[:, ::2].reshape(-1))
    x[:, 1] = torch.tensor([-1.0, -2.0, -3.0, -4.0]).npu()      # a strided write lands in the base
    a[:, 1] = torch.tensor([-1.0, -2.0, -3.0, -4.0])
    assert torch.equal(x.cpu(), a)
    x.t()[2].fill_(7.0)
    a.t()[2].fill_(7.0)
    assert torch.equal(x.cpu(), a)


def test_second_device_and_set_device():
    x = torch.ones(4, device="npu:1")
    assert x.device == torch.device("npu", 1) and rtorch.vnpu_device(x).index == 1
    torch.npu.set_device(1)
    try:
        assert torch.npu.current_device() == 1
        assert torch.empty(2, device="npu").device == torch.device("npu", 1)
    finally:
        torch.npu.set_device(0)
    y = x.to("npu:0")
    assert y.device == torch.device("npu", 0) and torch.equal(y.cpu(), torch.ones(4))


def test_bad_device_index_is_a_typed_error():
    with pytest.raises(rtorch.NpuDeviceError, match=r"npu:7 does not exist.*2 npu device"):
        torch.zeros(2, device="npu:7")
    with pytest.raises(rtorch.NpuDeviceError):
        torch.npu.set_device(5)


def test_mixing_devices_is_a_typed_error():
    a, b = torch.ones(3, device="npu:0"), torch.ones(3, device="npu:1")
    with pytest.raises(rtorch.NpuDeviceMismatchError, match="npu:0 and npu:1"):
        a + b


def test_module_npu_and_matmul_match_cpu():
    torch.manual_seed(1)
    lin = torch.nn.Linear(8, 3)
    a = torch.randn(5, 8)
    want = lin(a)
    lin.npu()
    assert lin.weight.device.type == "npu"
    got = lin(a.npu()).cpu()
    # fp32 GEMM of K=8: a few ulp of the largest partial sum
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("make", [
    lambda t: t.view(-1, 4), lambda t: t.t(), lambda t: t.transpose(-1, 0), lambda t: t.permute(1, 0),
    lambda t: t.unsqueeze(-1), lambda t: t.unsqueeze(0), lambda t: t[2], lambda t: t[-1, 1:5:2],
    lambda t: t[:, 3:], lambda t: t[1:3].unsqueeze(1).expand(-1, 3, -1), lambda t: t.detach(),
    lambda t: t.t().reshape(-1), lambda t: t[:, ::2].t()[1], lambda t: t[5:2]],
    ids=["view", "t", "transpose", "permute", "unsqueeze-1", "unsqueeze0", "select", "select-slice", "slice",
         "expand", "detach", "reshape-copy", "chain", "empty-slice"])
def test_views_have_torchs_sizes_strides_and_values(make):
    a = torch.arange(48, dtype=torch.float32).reshape(8, 6)
    got, want = make(a.npu()), make(a)
    assert (tuple(got.shape), got.stride(), got.storage_offset()) == \
        (tuple(want.shape), want.stride(), want.storage_offset())
    assert torch.equal(got.cpu(), want)
