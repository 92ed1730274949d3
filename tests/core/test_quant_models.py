"""Quantized execution of real models: SmolLM2 with its GGUF blocks kept in HBM (``quantization="gguf"``)
against the same model dequantised to float32, and MiniLM-L3 compiled with ``vnpu atc --quant int8``
against its float32 compilation.

What is asserted: the weights' device bytes (>= 4x fewer); the logits at the prompts' last position
against float32's: the kernels on GGUF weights compute on activations quantized to 8 bits per 32 values
(llama.cpp's numerics), so each of the ~210 matmuls of a token moves its result by up to ~1/254 of a
block's largest activation and the logits move by a few percent of their range (measured: cosine 0.99918
and 0.99986, max |diff| 3.7 % and 1.6 % of the range); SmolLM2-135M's top tokens are near-ties (0.1 apart
at 25), so greedy tokens differ from float32's from the first one on.  Asserted with ~3x margin: cosine
>= 0.995, every logit within 10 % of float32's range, float32's top token among the top 3.  The serve
engine's greedy tokens against the GenerateJob's on the same quantized weights (the same numerics, only
float32 summation order differs -- which can move an activation across an 8-bit rounding boundary, so
a logit by ~1 % of the range: the two agree up to a first difference, which must be at a near-tie: the job's token among the
engine's top five, less than :data:`NEAR_TIE` nats below the engine's choice -- SmolLM2's top tokens can
be a three-way tie, 0.02 nats apart, so it need not be the second); the sentence embeddings' cosine
(>= 0.999: int8 per-channel rounding is the only change)."""
from __future__ import annotations

import numpy as np
import pytest

from conftest import make_local_runtime
from devices.errors import AtcError, InvalidParamError
from runtime.atc import compile_model, make_options
from runtime.atc.hostrun import HostRun
from runtime.models import GenerateJob
from runtime.models.weights import minilm_l3_onnx
from runtime.serve.engine import EngineConfig

PROMPTS = ["What is the capital of France?", "Write a haiku about the sea."]
NEW_TOKENS = 10
NEAR_TIE = 0.5          #: nats: ~1.5 % of the logits' range (~30), the most a rounding flip has moved one


@pytest.fixture(scope="module")
def rt():
    r = make_local_runtime(1, 1 << 30)
    yield r
    r.close()


@pytest.fixture(scope="module")
def fp32_tokens(rt):
    """(weight bytes, greedy tokens, last-position logits) of the float32 job."""
    job = GenerateJob(rt)
    try:
        weights = sum(r.weight_bytes() for r in job.ranks)
        return (weights, [g.token_ids for g in job.generate(PROMPTS, max_new_tokens=NEW_TOKENS)],
                job.score(PROMPTS, raw=False))
    finally:
        job.close()


@pytest.fixture(scope="module")
def gguf_run(rt):
    """(rank, weight bytes, greedy tokens, last-position logits) of the job on the GGUF blocks."""
    job = GenerateJob(rt, quantization="gguf")
    try:
        rank = job.ranks[0]
        return (rank, rank.weight_bytes(), [g.token_ids for g in job.generate(PROMPTS, max_new_tokens=NEW_TOKENS)],
                job.score(PROMPTS, raw=False))
    finally:
        job.close()


def agreement(a: list[list[int]], b: list[list[int]]) -> tuple[int, int]:
    """(tokens equal before each sequence's first difference, tokens of the reference)."""
    same = 0
    for x, y in zip(a, b):
        same += next((i for i, (p, q) in enumerate(zip(x, y)) if p != q), min(len(x), len(y)))
    return same, sum(len(x) for x in a)


def test_smollm2_gguf_blocks_in_hbm_agree_with_float32(fp32_tokens, gguf_run):
    fp32_bytes, ref, ref_logits = fp32_tokens
    rank, q_bytes, got, logits = gguf_run
    assert rank.qt["embd"] == "q8_0r" and rank.qt["0.wqkv"] == "q4_1r" and rank.qt["29.wd"] == "q4_1r"
    same, total = agreement(ref, got)
    print(f"\nSmolLM2 weights in HBM: float32 {fp32_bytes} B, GGUF blocks {q_bytes} B "
          f"({fp32_bytes / q_bytes:.2f}x); greedy tokens agreeing: {same}/{total}")
    assert fp32_bytes >= 4 * q_bytes
    for want, have in zip(ref_logits.astype(np.float64), logits.astype(np.float64)):
        span = want.max() - want.min()
        cos = want @ have / np.linalg.norm(want) / np.linalg.norm(have)
        print(f"logits: cosine {cos:.6f}, max |diff| {np.abs(have - want).max() / span:.4f} of the range")
        assert cos >= 0.995
        assert np.abs(have - want).max() <= 0.10 * span
        assert (have > have[want.argmax()]).sum() < 3


def test_serve_engine_keeps_the_blocks_and_agrees(rt, fp32_tokens, gguf_run):
    """The serve engine's runner (paged KV cache, decode graphs) with ``quantization="gguf"``: the same
    greedy tokens as the GenerateJob on the same quantized weights, the weights in HBM as GGUF blocks."""
    from runtime.serve.engine import GenerateEngine
    from runtime.serve.engine.sampling import SamplingParams
    fp32_bytes = fp32_tokens[0]
    ref = gguf_run[2]
    e = GenerateEngine(rt, "smollm2", [0], EngineConfig(max_num_seqs=2, max_num_batched_tokens=64, max_model_len=128,
                                                        quantization="gguf"))
    try:
        q_bytes = sum(r.rank.weight_bytes() for r in e.runner.ranks)
        params = SamplingParams(max_tokens=NEW_TOKENS, temperature=0, ignore_eos=True, logprobs=5)
        handles = [e.add_request(e.tok.chat_prompt(p), params) for p in PROMPTS]
        while e.has_unfinished():
            e.step()
        outs = [h.result(0) for h in handles]
    finally:
        e.shutdown()
    got = [o.token_ids[:len(r)] for o, r in zip(outs, ref)]
    same, total = agreement(ref, got)
    print(f"\nserve engine, GGUF blocks: {q_bytes} B of weights; greedy tokens agreeing with the job's: {same}/{total}")
    assert fp32_bytes >= 4 * q_bytes
    assert same > 0
    for o, r in zip(outs, ref):
        k = next((i for i, (p, q) in enumerate(zip(o.token_ids, r)) if p != q), None)
        if k is None:
            continue
        top = dict(o.logprobs[k].top)
        first = o.logprobs[k].top[0][0]
        gap = top[first] - top[r[k]] if r[k] in top else float("inf")
        print(f"first difference at token {k}: the engine took {first}, the job {r[k]}, {gap:.3f} nats below it "
              f"in the engine's top {len(top)}")
        assert first == o.token_ids[k] and gap < NEAR_TIE


def test_quantization_is_checked(rt):
    with pytest.raises(InvalidParamError, match="quantization must be one of none, gguf"):
        GenerateJob(rt, quantization="int4")
    with pytest.raises(InvalidParamError, match="quantization must be one of"):
        EngineConfig(quantization="awq")


@pytest.fixture(scope="module")
def minilm_builds():
    path = str(minilm_l3_onnx())
    shapes = "input_ids:4,16;attention_mask:4,16"
    return {q: compile_model(path, make_options(shapes, quant=q)) for q in ("none", "int8")}


def test_minilm_int8_cosine_to_float32(minilm_builds):
    fp, q = minilm_builds["none"], minilm_builds["int8"]
    kinds = q.gears[0].program.kernel_counts()
    assert kinds["weight_quant_matmul"] == 18 and "matmul" not in kinds and "fused_matmul" not in kinds
    int8 = [t for t in q.manifest["weights"]["tensors"] if t["dtype"] == "int8"]
    assert len(int8) == 18
    saved = sum(4 * np.prod(t["shape"]) for t in int8) - sum(np.prod(t["shape"]) + 4 * t["shape"][0] for t in int8)
    assert len(fp.weights) - len(q.weights) >= saved * 0.99        # the float32 copies are gone from the blob
    rng = np.random.default_rng(0)
    ids = rng.integers(1000, 30000, (4, 16)).astype(np.int64)
    mask = np.ones((4, 16), np.int64)
    mask[3, 8:] = 0
    names = [o["name"] for o in fp.manifest["outputs"]]
    pooled = names.index("461")                                     # the mean-pooled sentence embedding
    a = HostRun(fp.manifest, fp.weights).run([ids, mask])[pooled]
    b = HostRun(q.manifest, q.weights).run([ids, mask])[pooled]
    cos = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
    print(f"\nMiniLM-L3 int8 vs float32: weights {len(q.weights)} / {len(fp.weights)} B, cosine {np.round(cos, 6)}")
    assert cos.min() >= 0.999
    assert not np.array_equal(a, b)                                  # the int8 weights were really used


def test_atc_quant_flag_is_checked():
    with pytest.raises(AtcError) as ei:
        make_options("x:1,4", quant="int4")
    assert ei.value.ecode == "E10001" and "--quant" in ei.value.line
