"""runtime.torch operators: each runs on the npu device (as vnpu kernels) and matches torch on the CPU.

In-process devices (one 2-device runtime for the module).  Tolerances follow the computation: exact for
data movement, comparisons and integer math; a few float32 ulps of the magnitude for one elementwise
pass; K * eps32 of the largest partial sum for a K-long reduction or GEMM (fp32.py's rule of thumb).
Every test also checks that nothing fell back to the CPU unless it says so."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import runtime.torch as rtorch
from conftest import installed, make_local_runtime

EPS32 = torch.finfo(torch.float32).eps
G = torch.Generator().manual_seed(1234)


@pytest.fixture(scope="module", autouse=True)
def npu_runtime():
    with installed(make_local_runtime(2)) as r:
        yield r


@pytest.fixture(autouse=True)
def no_fallback():
    rtorch.reset_fallback_counts()
    yield
    assert rtorch.fallback_counts() == {}, "ran on the CPU instead of vnpu kernels"


def rnd(*shape, scale=1.0):
    return torch.randn(*shape, generator=G) * scale


def k_tol(k: int, mag: float = 1.0) -> dict:
    """A K-term float32 accumulation of O(mag) terms."""
    return dict(rtol=4 * EPS32 * k, atol=4 * EPS32 * k * mag)


def same(got, want, **tol):
    assert got.device.type == "npu", got.device
    torch.testing.assert_close(got.cpu(), want, **(tol or dict(rtol=0, atol=0)))


UNARY = [("relu", torch.relu, 0), ("neg", torch.neg, 0), ("abs", torch.abs, 0), ("exp", torch.exp, 4),
         ("tanh", torch.tanh, 4), ("sigmoid", torch.sigmoid, 4), ("silu", F.silu, 4), ("gelu", F.gelu, 8),
         ("sin", torch.sin, 4), ("cos", torch.cos, 4), ("erf", torch.erf, 4)]


@pytest.mark.parametrize("name,fn,ulps", UNARY, ids=[u[0] for u in UNARY])
def test_unary(name, fn, ulps):
    a = rnd(4, 7, scale=2.0)
    same(fn(a.npu()), fn(a), rtol=max(ulps, 1) * EPS32, atol=max(ulps, 1) * EPS32)


def test_sqrt_rsqrt_log_pow():
    a = rnd(5, 6).abs() + 0.5
    x = a.npu()
    for got, want in ((x.sqrt(), a.sqrt()), (x.rsqrt(), a.rsqrt()), (x.log(), a.log()), (x.pow(2), a.pow(2)),
                      (x ** x, a ** a)):
        same(got, want, rtol=8 * EPS32, atol=8 * EPS32)


def test_binary_broadcast_scalars_and_promotion():
    a, b = rnd(3, 4), rnd(4)
    x, y = a.npu(), b.npu()
    same(x + y, a + b)
    same(x - 2 * y, a - 2 * b, rtol=EPS32, atol=4 * EPS32)
    same(x * y, a * b)
    same(x / (y.abs() + 1), a / (b.abs() + 1), rtol=EPS32, atol=EPS32)
    same(x + 3, a + 3)
    same(1 - x, 1 - a)
    same(x.add(y, alpha=0.5), a.add(b, alpha=0.5), rtol=EPS32, atol=2 * EPS32)
    i = torch.arange(12).reshape(3, 4)
    same(i.npu() * 3 + 1, i * 3 + 1)
    same(i.npu() + x, i + a)                            # int64 + float32 -> float32
    same(torch.maximum(x, y), torch.maximum(a, b))
    same(torch.minimum(x, y), torch.minimum(a, b))
    same(x.clamp(-0.5, 0.5), a.clamp(-0.5, 0.5))


def test_in_place_ops_write_the_npu_tensor_and_its_views():
    a = rnd(4, 4)
    x = a.npu()
    x.add_(1.0)
    x.mul_(torch.full((4,), 2.0).npu())
    x[:, 0].relu_()
    a.add_(1.0).mul_(2.0)
    a[:, 0].relu_()
    same(x, a)


def test_comparisons_logic_where_masked_fill():
    a, b = rnd(3, 5), rnd(5)
    x, y = a.npu(), b.npu()
    for got, want in ((x < y, a < b), (x <= 0, a <= 0), (x > y, a > b), (x >= 0.1, a >= 0.1), (x != y, a != b),
                      (x == x, a == a), ((x > 0) & (y < 0), (a > 0) & (b < 0)), ((x > 0) | (y < 0), (a > 0) | (b < 0)),
                      (~(x > 0), ~(a > 0))):
        same(got, want)
    same(torch.where(x > 0, x, y), torch.where(a > 0, a, b))
    same(x.masked_fill(x < 0, -1.0), a.masked_fill(a < 0, -1.0))


def test_matmul_family():
    a, b, c = rnd(5, 16), rnd(16, 7), rnd(7)
    same(a.npu() @ b.npu(), a @ b, **k_tol(16, 4))
    same(torch.addmm(c.npu(), a.npu(), b.npu()), torch.addmm(c, a, b), **k_tol(16, 4))
    same(F.linear(a.npu(), b.t().contiguous().npu(), c.npu()), F.linear(a, b.t().contiguous(), c), **k_tol(16, 4))
    p, q = rnd(3, 4, 8), rnd(3, 8, 5)
    same(torch.bmm(p.npu(), q.npu()), torch.bmm(p, q), **k_tol(8, 4))
    same(torch.bmm(p.npu(), p.npu().transpose(1, 2)), torch.bmm(p, p.transpose(1, 2)), **k_tol(8, 4))
    base = rnd(3, 4, 5)
    same(torch.baddbmm(base.npu(), p.npu(), q.npu(), beta=0.5, alpha=2.0),
         torch.baddbmm(base, p, q, beta=0.5, alpha=2.0), **k_tol(8, 8))
    same(p.npu() @ q.npu(), p @ q, **k_tol(8, 4))       # matmul of 3-D operands


def test_softmax_norms_reductions():
    a = rnd(4, 6, 10, scale=3.0)
    x = a.npu()
    same(x.softmax(-1), a.softmax(-1), **k_tol(10))
    same(x.softmax(1), a.softmax(1), **k_tol(6))
    same(x.log_softmax(-1), a.log_softmax(-1), **k_tol(10, 10))
    w, b = rnd(10), rnd(10)
    with torch.no_grad():
        same(F.layer_norm(x, (10,), w.npu(), b.npu()), F.layer_norm(a, (10,), w, b), **k_tol(10, 4))
    same(x.sum(-1), a.sum(-1), **k_tol(10, 3))
    same(x.sum(), a.sum(), **k_tol(240, 3))
    same(x.mean((0, 2), keepdim=True), a.mean((0, 2), keepdim=True), **k_tol(40, 3))
    same(x.amax(1), a.amax(1))
    same(x.max(), a.max())
    same(x.argmax(-1), a.argmax(-1))
    same(x.cumsum(2), a.cumsum(2), **k_tol(10, 3))
    i = torch.arange(10)
    same(i.npu().cumsum(0), i.cumsum(0))
    same((x > 2).any(), (a > 2).any())
    same((x > -9).all(), (a > -9).all())


def test_views_cat_stack_embedding():
    a = rnd(2, 3, 4)
    x = a.npu()
    same(x.permute(2, 0, 1).reshape(4, 6), a.permute(2, 0, 1).reshape(4, 6))
    same(x.transpose(0, 1).contiguous(), a.transpose(0, 1).contiguous())
    same(x.unsqueeze(1).expand(2, 5, 3, 4) * 1, a.unsqueeze(1).expand(2, 5, 3, 4) * 1)
    same(torch.cat([x, x[:, :1]], 1), torch.cat([a, a[:, :1]], 1))
    same(torch.stack([x, -x], 0), torch.stack([a, -a], 0))
    parts = x.split(1, dim=2)
    same(parts[3], a.split(1, dim=2)[3])
    same(x.flip(0) if False else x[1], a[1])
    w = rnd(11, 5)
    ids = torch.tensor([[0, 3, 10], [3, 3, 1]])
    same(F.embedding(ids.npu(), w.npu()), F.embedding(ids, w))
    same(x.to(torch.float16), a.to(torch.float16))
    same(x.to(torch.int32), a.to(torch.int32))


def test_attention_conv_pool():
    q, k, v = rnd(2, 6, 5, 8), rnd(2, 2, 7, 8), rnd(2, 2, 7, 8)
    mask = torch.rand(5, 7, generator=G) > 0.3
    mask[:, 0] = True
    for kw in (dict(is_causal=True), dict(attn_mask=mask)):
        npu_kw = {**kw, **({"attn_mask": mask.npu()} if "attn_mask" in kw else {})}
        got = F.scaled_dot_product_attention(q.npu(), k.npu(), v.npu(), enable_gqa=True, **npu_kw)
        same(got, F.scaled_dot_product_attention(q, k, v, enable_gqa=True, **kw), **k_tol(8 + 7, 4))
    img, wt, bias = rnd(2, 3, 9, 9), rnd(4, 3, 3, 3), rnd(4)
    same(F.conv2d(img.npu(), wt.npu(), bias.npu(), stride=2, padding=1),
         F.conv2d(img, wt, bias, stride=2, padding=1), **k_tol(27, 4))
    same(F.max_pool2d(img.npu(), 3, 2, 1), F.max_pool2d(img, 3, 2, 1))
    same(F.avg_pool2d(img.npu(), 2), F.avg_pool2d(img, 2), rtol=4 * EPS32, atol=4 * EPS32)


def test_factories_random_item():
    same(torch.arange(3, 11, 2, device="npu"), torch.arange(3, 11, 2))
    same(torch.zeros(2, 3, device="npu:1"), torch.zeros(2, 3))
    same(torch.full((2,), 7, device="npu"), torch.full((2,), 7))
    torch.npu.manual_seed(5)
    r1 = torch.randn(4, 4, device="npu").cpu()
    torch.npu.manual_seed(5)
    r2 = torch.randn(4, 4, device="npu").cpu()
    assert torch.equal(r1, r2) and r1.std() > 0.3
    x = torch.tensor([1.5, -2.0]).npu()
    assert x.sum().item() == -0.5 and bool((x > 0).any())
    assert math.isclose(float(x.abs().max()), 2.0)


def test_training_step_equals_cpu():
    """Forward, backward and an SGD step on npu give the CPU's parameters (fp32, a handful of ulps)."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    twin = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    twin.load_state_dict(net.state_dict())
    twin.npu()
    x, y = rnd(6, 8), torch.tensor([0, 1, 2, 3, 0, 1])
    for m, xx in ((net, x), (twin, x.npu())):
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        out = m(xx)
        loss = (out.log_softmax(-1) * F.one_hot(y, 4).to(out.device)).sum()
        loss.backward()
        opt.step()
    for p, q in zip(net.parameters(), twin.parameters()):
        same(q, p.detach(), **k_tol(16, 4))


def test_what_real_models_call():
    """torch.tensor(..., device=npu) (its copy reaches the backend key), views under inference_mode,
    in-place metadata ops, vector @ matrix, safe softmax of a fully masked row, unbatched conv."""
    t = torch.tensor([[1, 2], [3, 4]], device="npu", dtype=torch.long)
    assert t.device.type == "npu" and torch.equal(t.cpu(), torch.tensor([[1, 2], [3, 4]]))
    b = torch.arange(10).expand(1, -1).to("npu")
    with torch.inference_mode():
        v = b[:, 2:5]
        assert not v.is_inference() and torch.equal(v.cpu(), torch.tensor([[2, 3, 4]]))
    c = torch.arange(6.0).reshape(2, 1, 3)
    y = c.npu()
    for t in (c, y):
        t.squeeze_(1)
        t.unsqueeze_(0)
        t.transpose_(0, 2)
    assert (tuple(y.shape), y.stride(), y.storage_offset()) == (tuple(c.shape), c.stride(), c.storage_offset())
    assert torch.equal(y.cpu(), c)
    vec, mat, w = rnd(10), rnd(10, 5), rnd(4, 10)
    same(vec.npu() @ mat.npu(), vec @ mat, **k_tol(10, 4))
    same(F.linear(vec.npu(), w.npu()), F.linear(vec, w), **k_tol(10, 4))
    s = torch.full((2, 4), float("-inf"))
    s[0, 1] = 0.5
    same(torch.ops.aten._safe_softmax.default(s.npu(), -1), torch.ops.aten._safe_softmax.default(s, -1))
    img, wt = rnd(3, 6, 6), rnd(2, 3, 3, 3)
    same(F.conv2d(img.npu(), wt.npu()), F.conv2d(img, wt), **k_tol(27, 4))
