"""MiniLM sentence encoders on the in-process runtime.

References: onnxruntime on the very ONNX file of paraphrase-MiniLM-L3-v2 (output ``461`` = mean-pooled
embedding), and a plain numpy BERT written here for all-MiniLM-L6-v2 (safetensors weights), run one
sentence at a time without padding (so the job's batching and masks are checked too)."""
from __future__ import annotations

import math

import numpy as np
import pytest

from conftest import make_local_runtime
from devices.errors import InvalidDeviceError, InvalidParamError, MemoryAllocationError
from fp32 import assert_within, gamma
from runtime.models import EmbedJob
from runtime.models.common import hbm_used


def settled_hbm(devs) -> list[int]:
    """HBM in use once the caching pools gave back what they cached (a job's close empties the pool,
    also of what other jobs cached on the same device)."""
    for d in devs:
        d.empty_cache()
    return hbm_used(devs)
from runtime.models.weights import load_safetensors, minilm_l3_onnx, minilm_l6_dir

ARENA = 256 << 20

TEXTS = [
    "A man is playing a guitar.",
    "The new movie is awesome!",
    "NPUs run matrix multiplications on their Cube units, and vector operations elsewhere.",
    "hi",
    "Two dogs are running through a grassy field while their owner watches from a bench nearby.",
    "The cat sits on the mat.",
    "Quantum computing, in principle, could factor large integers efficiently.",
    "I love pizza",
    "Is this the real life? Is this just fantasy?",
    "Paris is the capital of France.",
]


@pytest.fixture(scope="module")
def rt():
    r = make_local_runtime(2, arena=ARENA)
    yield r
    r.close()


@pytest.fixture(scope="module")
def hf_tok():
    from tokenizers import Tokenizer
    t = Tokenizer.from_file(str(minilm_l6_dir() / "tokenizer.json"))
    t.no_padding()
    t.enable_truncation(max_length=128)
    return t


# ---------------------------------------------------------------------------------------------- references
@pytest.fixture(scope="module")
def ort_l3(hf_tok):
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    sess = ort.InferenceSession(str(minilm_l3_onnx()), so, providers=["CPUExecutionProvider"])
    encs = hf_tok.encode_batch(TEXTS)
    s = max(len(e.ids) for e in encs)
    ids = np.zeros((len(encs), s), np.int64)
    mask = np.zeros((len(encs), s), np.int64)
    for i, e in enumerate(encs):
        ids[i, :len(e.ids)] = e.ids
        mask[i, :len(e.ids)] = 1
    return sess.run(["461"], {"input_ids": ids, "attention_mask": mask})[0]


def _gelu(x):
    return 0.5 * x * (1.0 + np.vectorize(math.erf)(x / math.sqrt(2.0)).astype(np.float32))


def _ln(x, g, b, eps=1e-12):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * g + b


def numpy_minilm_l6(w: dict, ids: list[int]) -> np.ndarray:
    """all-MiniLM-L6-v2 for ONE unpadded sentence: BERT, mean pooling, L2 normalisation."""
    S, H = len(ids), 12
    x = w["embeddings.word_embeddings.weight"][ids] + w["embeddings.position_embeddings.weight"][:S] \
        + w["embeddings.token_type_embeddings.weight"][0]
    x = _ln(x, w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"])
    for i in range(6):
        p = f"encoder.layer.{i}."
        lin = lambda h, n: h @ w[p + n + ".weight"].T + w[p + n + ".bias"]  # noqa: E731
        q, k, v = (lin(x, "attention.self." + n).reshape(S, H, 32).transpose(1, 0, 2)
                   for n in ("query", "key", "value"))
        s = q @ k.transpose(0, 2, 1) / math.sqrt(32)
        s = np.exp(s - s.max(-1, keepdims=True))
        s /= s.sum(-1, keepdims=True)
        a = (s @ v).transpose(1, 0, 2).reshape(S, 384)
        x = _ln(x + lin(a, "attention.output.dense"), w[p + "attention.output.LayerNorm.weight"],
                w[p + "attention.output.LayerNorm.bias"])
        f = _gelu(lin(x, "intermediate.dense"))
        x = _ln(x + lin(f, "output.dense"), w[p + "output.LayerNorm.weight"], w[p + "output.LayerNorm.bias"])
    e = x.mean(0)
    return e / np.linalg.norm(e)


@pytest.fixture(scope="module")
def ref_l6(hf_tok):
    w = load_safetensors(minilm_l6_dir() / "model.safetensors")
    hf_tok.enable_truncation(max_length=256)
    return np.stack([numpy_minilm_l6(w, e.ids) for e in hf_tok.encode_batch(TEXTS)])


@pytest.fixture(scope="module")
def l6_single(rt):
    with EmbedJob(rt, "minilm-l6", devices=1, batch_size=4) as job:
        return job.embed(TEXTS)


# ---------------------------------------------------------------------------------------------- L3 vs onnxruntime
@pytest.mark.parametrize("parallel,n", [("dp", 1), ("dp", 2), ("tp", 2)])
def test_l3_matches_onnxruntime(rt, ort_l3, parallel, n):
    devs = rt.devices()
    before = settled_hbm(devs)
    with EmbedJob(rt, "minilm-l3", devices=n, parallel=parallel, batch_size=4) as job:
        got = job.embed(TEXTS)
        st = job.last_stats
    assert got.shape == (len(TEXTS), 384)
    assert float(np.abs(got - ort_l3).max()) <= 1e-4
    assert st.items == len(TEXTS) and len(st.devices) == n
    # per batch and rank (the module doc of runtime.models.bert): embeddings 3, 12 per layer, pooling 1
    per_rank = 3 + 12 * 3 + 1                                       # L3: 3 layers, no L2 normalisation
    per = 4 if parallel == "tp" else max(1, min(4, -(-len(TEXTS) // n)))
    batches = -(-len(TEXTS) // per)
    ranks = n if parallel == "tp" else 1                            # tp: every batch runs on every rank
    assert st.launches == batches * ranks * per_rank, (st.launches, batches)
    assert st.collectives == (batches * n * 2 * 3 if parallel == "tp" else 0)   # tp: 2 all-reduces a layer
    if parallel == "dp" and n == 2:
        assert all(d.modeled_ms > 0 for d in st.devices)            # both devices took batches
    assert hbm_used(devs) == before


# ---------------------------------------------------------------------------------------------- L6 vs numpy
def test_l6_matches_numpy(l6_single, ref_l6):
    assert float(np.abs(l6_single - ref_l6).max()) <= 1e-4
    # unit length up to the float32 rounding of the device's normalisation (a 384-term sum of squares)
    assert_within(np.linalg.norm(l6_single.astype(np.float64), axis=1), 1.0, gamma(384 + 6))
    sims = l6_single @ l6_single.T
    assert sims[0, 1] < sims[0, 0]


def test_l6_data_parallel_matches_single(rt, l6_single):
    with EmbedJob(rt, "minilm-l6", devices=2, parallel="dp", batch_size=3) as job:
        got = job.embed(TEXTS)
    assert float(np.abs(got - l6_single).max()) <= 1e-5


def test_l6_tensor_parallel_matches_single(rt, l6_single):
    with EmbedJob(rt, "minilm-l6", devices=2, parallel="tp", batch_size=4) as job:
        got = job.embed(TEXTS)
    assert float(np.abs(got - l6_single).max()) <= 1e-5


def test_job_is_reusable_and_batches_grow(rt, l6_single):
    with EmbedJob(rt, "minilm-l6", devices=1, batch_size=2) as job:
        a = job.embed(TEXTS[3:4])                                     # one short sentence first
        b = job.embed(TEXTS)                                          # then longer batches
    assert float(np.abs(a[0] - l6_single[3]).max()) <= 1e-5
    assert float(np.abs(b - l6_single).max()) <= 1e-5


# ---------------------------------------------------------------------------------------------- bad input
def test_bad_input(rt):
    with pytest.raises(InvalidParamError) as e:
        EmbedJob(rt, "bert-huge")
    assert e.value.code == 107000
    with pytest.raises(InvalidDeviceError) as e:
        EmbedJob(rt, "minilm-l3", devices=3)
    assert e.value.code == 107001
    with pytest.raises(InvalidParamError):
        EmbedJob(rt, "minilm-l3", devices=1, parallel="pp")
    with pytest.raises(InvalidParamError):
        EmbedJob(rt, "minilm-l3", devices=0)
    devs = rt.devices()
    before = settled_hbm(devs)
    with EmbedJob(rt, "minilm-l3", devices=1) as job:
        for bad in ([], [""], ["ok", "  "], "a string", [None]):
            with pytest.raises(InvalidParamError):
                job.embed(bad)
    with pytest.raises(InvalidParamError):
        job.embed(["closed"])
    assert hbm_used(devs) == before


def test_out_of_memory_is_clean():
    small = make_local_runtime(2, arena=48 << 20)        # L6 weights alone are 91 MB
    try:
        devs = small.devices()
        before = settled_hbm(devs)
        with pytest.raises(MemoryAllocationError) as e:
            EmbedJob(small, "minilm-l6", devices=2, parallel="dp")
        assert e.value.code == 207001
        assert hbm_used(devs) == before
    finally:
        small.close()


# ---------------------------------------------------------------------------------------------- CLI
def test_cli_embed(tmp_path, monkeypatch, capsys, l6_single):
    import json

    from runtime.cli import main
    monkeypatch.setenv("VNPU_BACKEND", "local")
    monkeypatch.setenv("VNPU_DEVICES", "2")
    monkeypatch.setenv("VNPU_HBM_BYTES", str(256 << 20))
    src = tmp_path / "in.txt"
    src.write_text("\n".join(TEXTS) + "\n")
    out = tmp_path / "emb.npy"
    assert main(["run", "embed", "--model", "minilm-l6", "--devices", "2", "--input", str(src),
                 "--output", str(out), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["count"] == len(TEXTS) and doc["dim"] == 384 and len(doc["stats"]["devices"]) == 2
    assert float(np.abs(np.load(out) - l6_single).max()) <= 1e-5
    assert main(["run", "embed", "--devices", "3", "hello"]) == 2
    assert "3 devices asked, only 2" in capsys.readouterr().err        # checked before the job starts
    assert main(["run", "embed", "--input", str(tmp_path / "missing.txt")]) == 2
