"""runtime.torch on the cluster backend: npu tensors in the HBM of device actors (real Ray actors, gRPC on
loopback; the session's shared 4-device cluster), the same code as in-process.  One module runtime."""
from __future__ import annotations

import pytest
import torch

import runtime.torch as rtorch

pytestmark = pytest.mark.cluster
CLUSTER = pytest.mark.parametrize("rt", ["cluster"], indirect=True)


@CLUSTER
def test_tensors_and_a_layer_on_device_actors(rt):
    assert rt.backend.name != "local" and torch.npu.device_count() == 4
    torch.manual_seed(0)
    lin = torch.nn.Linear(32, 8)
    a = torch.randn(4, 32)
    want = torch.softmax(lin(a), -1)
    lin.to("npu:2")
    with torch.no_grad():
        got = torch.softmax(lin(a.to("npu:2")), -1)
    assert got.device == torch.device("npu", 2) and rtorch.vnpu_device(got).index == 2
    torch.testing.assert_close(got.cpu(), want.detach(), rtol=1e-5, atol=1e-6)   # K=32 fp32 GEMM, softmax of 8
    x = torch.arange(12.0).reshape(3, 4).to("npu:1")
    x[:, 1] = -1.0                                        # a strided write, batched to the actor
    assert torch.equal(x.t().contiguous().cpu(), torch.tensor([[0.0, 4, 8], [-1, -1, -1], [2, 6, 10], [3, 7, 11]]))


@CLUSTER
def test_streams_events_memory_and_fallback_on_the_cluster(rt):
    s = torch.npu.Stream(3)
    x = torch.ones(32, 32, device="npu:3")
    start, end = torch.npu.Event(), torch.npu.Event()
    start.record(s)
    with torch.npu.stream(s):
        y = x @ x
    end.record(s)
    end.synchronize()
    assert start.elapsed_time(end) > 0
    assert torch.npu.memory_allocated(3) >= 2 * 32 * 32 * 4
    rtorch.reset_fallback_counts()
    with pytest.warns(rtorch.NpuFallbackWarning):
        v, _ = torch.topk(y, 2)
    assert rtorch.fallback_counts() == {"aten::topk": 1} and torch.equal(v.cpu(), torch.full((32, 2), 32.0))
    with pytest.raises(rtorch.NpuDeviceMismatchError):
        y + torch.ones(32, 32, device="npu:0")
