"""Real PyTorch code, not ours, unchanged, on the ``npu`` device (``import runtime.torch``): HF transformers
SmolLM2-135M ``generate`` (greedy), sentence-transformers all-MiniLM-L6-v2 ``encode``, and a plain
``torch.nn`` training step (forward, cross-entropy, backward, SGD) -- each against the same code on the CPU.

The models are the libraries' own classes loaded from the installed packages (:mod:`runtime.models.hf`);
the tests only move them with ``.to("npu")`` / ``device="npu"`` as a user does.  Tolerances follow the
computation (tests/fp32.py: float32 rounding bounds for the sums each result goes through); greedy tokens
must be identical.  One in-process vnpu runtime (one device) per module."""
from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch

import runtime.torch as vtorch
from conftest import installed, make_local_runtime
from fp32 import U, gamma
from runtime.models import hf

#: operators that carry the models' arithmetic: none of them may fall back to the CPU
HEAVY = ("mm", "bmm", "addmm", "matmul", "linear", "baddbmm", "_scaled_dot_product", "softmax", "safe_softmax",
         "layer_norm", "rms_norm", "embedding", "silu", "gelu")

PROMPTS = ["The capital of France is", "Write a haiku about virtual devices."]
SENTENCES = ["A man is playing a guitar.", "NPUs run matrix multiplications on their Cube units.", "hi",
             "Two dogs are running through a grassy field while their owner watches from a bench nearby."]


@pytest.fixture(scope="module")
def rt():
    with installed(make_local_runtime(1, arena=1 << 30)) as r:     # SmolLM2 in float32: ~540 MB
        yield r


@pytest.fixture(autouse=True)
def _counts():
    vtorch.reset_fallback_counts()


def heavy(counts: dict[str, int]) -> dict[str, int]:
    """The fallbacks (``aten::name.overload`` -> count) of operators that do a model's arithmetic."""
    return {k: v for k, v in counts.items()
            if any(k.split("::")[-1].split(".")[0].lstrip("_").startswith(h.lstrip("_")) for h in HEAVY)}


# ---------------------------------------------------------------------------------------------- SmolLM2
@pytest.fixture(scope="module")
def smollm2_runs(rt):
    """CPU greedy generation of each prompt (tokens and per-step scores), then the same model moved to
    npu and the same generation there."""
    model, tok = hf.smollm2()
    gen = dict(max_new_tokens=5, do_sample=False, output_scores=True, return_dict_in_generate=True)
    cpu = []
    with torch.no_grad():
        for p in PROMPTS:
            enc = tok(p, return_tensors="pt")
            cpu.append(model.generate(**enc, **gen))
        model.to("npu")
        vtorch.reset_fallback_counts()
        npu = []
        for p in PROMPTS:
            enc = tok(p, return_tensors="pt").to("npu")
            npu.append(model.generate(**enc, **gen))
    yield {"model": model, "cpu": cpu, "npu": npu, "fallbacks": vtorch.fallback_counts()}
    del model


def test_smollm2_lives_on_npu(smollm2_runs):
    params = list(smollm2_runs["model"].parameters())
    assert params and all(p.device.type == "npu" for p in params)
    assert all(r.sequences.device.type == "npu" for r in smollm2_runs["npu"])


def test_smollm2_greedy_generate_is_token_identical_to_cpu(smollm2_runs):
    for p, c, n in zip(PROMPTS, smollm2_runs["cpu"], smollm2_runs["npu"]):
        assert n.sequences.cpu().tolist() == c.sequences.tolist(), p


def test_smollm2_logits_within_float32_bound(smollm2_runs):
    """Each step's logits: 30 layers of sums over d_model 576 and FFN 1536, reordered by other kernels ->
    at most gamma(layers x (576 + 1536)) relative to the logits' magnitude (far above float32 noise in
    practice, far below any wrong index or missed block)."""
    bound_rel = gamma(30 * (576 + 1536))
    for c, n in zip(smollm2_runs["cpu"], smollm2_runs["npu"]):
        for sc, sn in zip(c.scores, n.scores):
            sc, sn = sc.numpy(), sn.cpu().numpy()
            assert np.isfinite(sn).all()
            assert np.abs(sn - sc).max() <= bound_rel * np.abs(sc).max()


def test_smollm2_heavy_operators_ran_on_vnpu(smollm2_runs):
    fb = heavy(smollm2_runs["fallbacks"])
    assert fb == {}, f"model arithmetic fell back to the CPU: {fb}"


# ---------------------------------------------------------------------------------------------- MiniLM
@pytest.fixture(scope="module")
def minilm_runs(rt):
    cpu = hf.minilm("cpu").encode(SENTENCES, convert_to_tensor=True)
    vtorch.reset_fallback_counts()
    m = hf.minilm("npu")
    npu = m.encode(SENTENCES, convert_to_tensor=True)
    return {"cpu": cpu, "npu": npu, "params": list(m.parameters()), "fallbacks": vtorch.fallback_counts()}


def test_minilm_embeddings_on_npu_match_cpu(minilm_runs):
    """Unit vectors after 6 layers of sums over 384 (attention, projections) and 1536 (FFN) terms: each
    component within gamma(6 x (384 + 384 + 1536)) of the CPU's, cosine 1 within that bound squared x dim."""
    cpu, npu = minilm_runs["cpu"], minilm_runs["npu"]
    assert npu.device.type == "npu" and all(p.device.type == "npu" for p in minilm_runs["params"])
    got = npu.cpu().numpy().astype(np.float64)
    want = cpu.numpy().astype(np.float64)
    assert got.shape == want.shape == (len(SENTENCES), 384)
    bound = gamma(6 * (384 + 384 + 1536))
    assert np.abs(got - want).max() <= bound
    cos = (got * want).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)
    assert (cos >= 1 - 384 * bound ** 2 - 8 * U).all(), cos
    assert np.allclose(np.linalg.norm(got, axis=1), 1.0, atol=8 * U * math.sqrt(384))


def test_minilm_heavy_operators_ran_on_vnpu(minilm_runs):
    fb = heavy(minilm_runs["fallbacks"])
    assert fb == {}, f"model arithmetic fell back to the CPU: {fb}"


# ---------------------------------------------------------------------------------------------- training
def _train(net: torch.nn.Module, x, y, steps: int) -> tuple[list[float], torch.nn.Module]:
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(net(x), y)
        loss.backward()
        opt.step()
        losses.append(float(loss.item()))
    return losses, net


def test_training_steps_equal_cpu(rt):
    """Three SGD (momentum) steps of a Linear-ReLU-Linear-LayerNorm-Linear classifier: the losses and every
    parameter after them equal the CPU's within the rounding of the sums involved (inner dimensions <=
    32, batch 16, a few dozen elementwise roundings per step, three steps)."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(12, 32), torch.nn.ReLU(), torch.nn.Linear(32, 16),
                              torch.nn.LayerNorm(16), torch.nn.Linear(16, 5))
    x, y = torch.randn(16, 12), torch.randint(0, 5, (16,))
    cpu_losses, cpu_net = _train(copy.deepcopy(net), x, y, 3)
    npu_losses, npu_net = _train(copy.deepcopy(net).to("npu"), x.to("npu"), y.to("npu"), 3)
    assert all(p.device.type == "npu" for p in npu_net.parameters())
    assert all(p.grad is not None and p.grad.device.type == "npu" for p in npu_net.parameters())
    rel = gamma(3 * (32 + 16 + 16 + 64))                # three steps, each through the deepest chain of sums
    assert np.allclose(npu_losses, cpu_losses, rtol=rel, atol=0)
    for (name, pc), pn in zip(cpu_net.named_parameters(), npu_net.parameters()):
        c, n = pc.detach().numpy(), pn.detach().cpu().numpy()
        scale = np.abs(c).max() + np.abs(net.state_dict()[name].numpy()).max()
        assert np.abs(n - c).max() <= rel * scale, name
        assert not np.array_equal(c, net.state_dict()[name].numpy()), f"{name} was not trained"
