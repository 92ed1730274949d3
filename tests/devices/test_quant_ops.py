"""The weight-quantized kernels (devices/ops/quant.py) against an independent reference: the ``gguf``
package's own dequantisation (``gguf.dequantize``, numpy code of the llama.cpp project) followed by a
float64 numpy matmul, on random blocks of every format and on real rows of SmolLM2's GGUF file.

Tolerance: the expanded weights are exact in float32 (an fp16 scale times a 4- or 8-bit integer), so
the kernel's result differs from the float64 product only by float32 accumulation: the a-priori bound
gamma(K + K/32 + 8) * (|a| @ (|w| + 2 max|w| of the row)) (the Q4_1 / Q4_K offsets are summed apart, per
32 weights, and |scale * q| + |offset| <= |w| + 2 max|w|)."""
from __future__ import annotations

import numpy as np
import pytest

import gguf
from devices.chip import ASCEND_910B3, CostModel, Work
from devices.errors import InvalidParamError, KernelError
from devices.kernel import BlockCtx, TensorDesc, lookup
from devices.ops.qformats import GGUF_FORMATS, dequantize, quantize_int8
from fp32 import assert_within, gamma
from runtime.models.weights import load_gguf_quantized, smollm2_gguf

GGML = {"q8_0": gguf.GGMLQuantizationType.Q8_0, "q4_1": gguf.GGMLQuantizationType.Q4_1,
        "q4_k": gguf.GGMLQuantizationType.Q4_K}


def random_blocks(fmt: str, rows: int, k: int, seed: int = 0) -> np.ndarray:
    """``uint8 [rows, row_bytes]`` of random blocks whose fp16 scale fields are finite and moderate."""
    f = GGUF_FORMATS[fmt]
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, (rows, k // f.block * f.block_bytes), dtype=np.uint8)
    b = raw.reshape(rows, -1, f.block_bytes)
    n_scales = 1 if fmt == "q8_0" else 2
    sc = (rng.random(b.shape[:2] + (n_scales,)) * 0.02 * np.where(rng.random(b.shape[:2] + (n_scales,)) < 0.5, -1, 1))
    b[..., :2 * n_scales] = sc.astype(np.float16).view(np.uint8).reshape(b.shape[:2] + (2 * n_scales,))
    return raw


def descs(arrays):
    return tuple(TensorDesc(0, tuple(a.shape), np.dtype(a.dtype).name) for a in arrays)


def run_blocks(name, inputs, out_shape, attrs, block_dim):
    """Check and run kernel ``name`` block by block into one output (each block writes its share)."""
    k = lookup(name)
    out = np.full(out_shape, np.nan, np.float32)
    k.check(descs(inputs), descs([out]), attrs)
    for b in range(block_dim):
        k.run(BlockCtx(b, block_dim, 0), list(inputs), [out], dict(attrs))
    return out


def reference(a, w):
    return a.astype(np.float64) @ w.astype(np.float64).T


def bound(a, w, extra=0):
    k = w.shape[-1]
    mag = np.abs(w).astype(np.float64) + 2 * np.abs(w).max(axis=-1, keepdims=True)
    return gamma(k + k // 32 + 8 + extra) * (np.abs(a).astype(np.float64) @ mag.T)


@pytest.mark.parametrize("fmt", list(GGUF_FORMATS))
def test_dequantize_equals_the_gguf_package(fmt):
    raw = random_blocks(fmt, 7, 512, seed=1)
    np.testing.assert_array_equal(dequantize(fmt, raw), gguf.dequantize(raw, GGML[fmt]))


@pytest.mark.parametrize("fmt", list(GGUF_FORMATS))
@pytest.mark.parametrize("m,block_dim", [(1, 1), (3, 4), (40, 1), (40, 3)])
def test_weight_quant_matmul_equals_dequantize_then_matmul(fmt, m, block_dim):
    n, k = 70, 512                        # 70 rows: several tiles at K = 512 only with a small tile; see below
    raw = random_blocks(fmt, n, k, seed=2)
    w = gguf.dequantize(raw, GGML[fmt])
    a = np.random.default_rng(3).standard_normal((m, k)).astype(np.float32)
    bias = np.random.default_rng(4).standard_normal(n).astype(np.float32)
    got = run_blocks("weight_quant_matmul", [a, raw], (m, n), {"qtype": fmt}, block_dim)
    assert_within(got, reference(a, w), bound(a, w), f"{fmt} M={m} blocks={block_dim}")
    got = run_blocks("weight_quant_matmul", [a, raw, bias], (m, n), {"qtype": fmt}, block_dim)
    assert_within(got, reference(a, w) + bias, bound(a, w, 1) + gamma(2) * np.abs(bias), "with bias")


def test_tiles_cover_every_row(monkeypatch):
    """A weight larger than one tile: every tile's rows land in their own output columns."""
    import devices.ops.quant as quant
    monkeypatch.setattr(quant, "TILE_BYTES", 4 * 256 * 3)          # 3 rows per tile at K = 256
    raw = random_blocks("q4_k", 11, 256, seed=5)
    w = gguf.dequantize(raw, GGML["q4_k"])
    for m in (2, 20):
        a = np.random.default_rng(m).standard_normal((m, 256)).astype(np.float32)
        got = run_blocks("weight_quant_matmul", [a, raw], (m, 11), {"qtype": "q4_k"}, 1)
        assert_within(got, reference(a, w), bound(a, w))


def test_stacked_weights_share_the_activations():
    """A 3-D weight [G, N, .] gives out [G, M, N] (the gate|up projections of one launch)."""
    raw = np.stack([random_blocks("q4_1", 24, 64, seed=s) for s in (6, 7)])
    a = np.random.default_rng(8).standard_normal((5, 64)).astype(np.float32)
    got = run_blocks("weight_quant_matmul", [a, raw], (2, 5, 24), {"qtype": "q4_1"}, 2)
    for g in range(2):
        w = gguf.dequantize(raw[g], GGML["q4_1"])
        assert_within(got[g], reference(a, w), bound(a, w))


def test_int8_per_channel():
    rng = np.random.default_rng(9)
    wf = rng.standard_normal((33, 48)).astype(np.float32) * rng.random((33, 1)).astype(np.float32)
    q, scale = quantize_int8(wf)
    assert q.dtype == np.int8 and np.abs(q).max() == 127
    assert np.abs(q * scale[:, None] - wf).max() <= scale.max() / 2 * (1 + 1e-6)     # round to nearest
    a = rng.standard_normal((4, 48)).astype(np.float32)
    w = q.astype(np.float64) * scale[:, None]
    got = run_blocks("weight_quant_matmul", [a, q, scale], (4, 33), {"qtype": "int8"}, 3)
    assert_within(got, reference(a, w), gamma(48 + 2) * (np.abs(a) @ np.abs(w).T))
    emb = run_blocks("quant_embedding", [q, np.array([[3, 0], [32, 3]], np.int32), scale], (2, 2, 48),
                     {"qtype": "int8"}, 2)
    np.testing.assert_allclose(emb[1, 0], w[32], rtol=1e-7)


def test_real_smollm2_rows():
    """Rows of the file's own tensors (Q4_1 projection, Q8_0 token embedding) through both kernels."""
    g = load_gguf_quantized(smollm2_gguf())              # the file's blocks, from its header alone
    for name, fmt in (("blk.3.ffn_down.weight", "q4_1"), ("token_embd.weight", "q8_0")):
        assert g.qtypes[name] == fmt and g.types[name] == fmt.upper()
        raw = np.asarray(g.tensors[name][:96])
        w = gguf.dequantize(raw, GGML[fmt])
        a = np.random.default_rng(10).standard_normal((2, w.shape[1])).astype(np.float32)
        got = run_blocks("weight_quant_matmul", [a, raw], (2, 96), {"qtype": fmt}, 1)
        assert_within(got, reference(a, w), bound(a, w), name)
        ids = np.array([95, 0, 17], np.int32)
        emb = run_blocks("quant_embedding", [raw, ids], (3, w.shape[1]), {"qtype": fmt}, 2)
        np.testing.assert_array_equal(emb, w[ids])


def test_quant_embedding_refuses_an_id_out_of_range():
    raw = random_blocks("q8_0", 5, 64)
    k = lookup("quant_embedding")
    out = np.zeros((2, 64), np.float32)
    with pytest.raises(KernelError, match="id 5 at flat index 1"):
        k.run(BlockCtx(0, 1, 0), [raw, np.array([0, 5], np.int32)], [out], {"qtype": "q8_0"})


@pytest.mark.parametrize("ins,outs,attrs,match", [
    ([((1, 64), "float32"), ((4, 40), "uint8")], [((1, 4), "float32")], {"qtype": "q9"}, "qtype"),
    ([((1, 64), "float32"), ((4, 40), "uint8")], [((1, 4), "float32")], {}, "qtype"),
    ([((1, 64), "float32"), ((4, 41), "uint8")], [((1, 4), "float32")], {"qtype": "q4_1"}, "20-byte blocks"),
    ([((1, 32), "float32"), ((4, 40), "uint8")], [((1, 4), "float32")], {"qtype": "q4_1"}, "inner dims"),
    ([((1, 64), "float32"), ((4, 40), "int8")], [((1, 4), "float32")], {"qtype": "q4_1"}, "weight dtype"),
    ([((1, 64), "float32"), ((4, 64), "int8")], [((1, 4), "float32")], {"qtype": "int8"}, "expects 3 to 4"),
    ([((1, 64), "float32"), ((4, 64), "int8"), ((3,), "float32")], [((1, 4), "float32")], {"qtype": "int8"},
     "antiquant_scale"),
    ([((1, 64), "float32"), ((4, 40), "uint8")], [((1, 5), "float32")], {"qtype": "q4_1"}, "output"),
])
def test_bad_launches_are_refused(ins, outs, attrs, match):
    k = lookup("weight_quant_matmul")
    with pytest.raises(InvalidParamError, match=match):
        k.check(tuple(TensorDesc(0, s, d) for s, d in ins), tuple(TensorDesc(0, s, d) for s, d in outs), attrs)


def test_priced_at_the_int8_rate_over_the_quantized_bytes():
    """The cost model: a weight_quant_matmul is a cube task at the chip's INT8 rate; its bytes are the
    quantized weight's (5.6x fewer than float32 for Q4_1), so a decode-shaped launch (memory-bound) is
    modeled faster than the float32 matmul of the same shape."""
    spec = ASCEND_910B3
    assert spec.cube_ops_int8 == 2 * spec.cube_flops_fp16
    m, n, k = 1, 1536, 576
    a, w, o = TensorDesc(0, (m, k), "float32"), TensorDesc(0, (n, k // 32 * 20), "uint8"), \
        TensorDesc(0, (m, n), "float32")
    work = lookup("weight_quant_matmul").work((a, w), (o,), {"qtype": "q4_1"})
    assert work.int8 and work.unit == "cube" and work.flops == 2 * m * n * k
    assert work.bytes == a.nbytes + w.nbytes + o.nbytes
    cm = CostModel(spec)
    want = spec.launch_cost_s + max(work.flops / spec.cube_ops_int8, work.bytes / spec.hbm_bandwidth)
    assert cm.kernel(work, spec.ai_cores) == pytest.approx(want, rel=1e-12)
    big = cm.kernel(Work(flops=1e15, unit="cube", int8=True), spec.ai_cores)
    assert big == pytest.approx(spec.launch_cost_s + 1e15 / spec.cube_ops_int8, rel=1e-12)
    f32 = lookup("matmul").work((a, TensorDesc(0, (n, k), "float32"), ), (o,), {"transpose_b": True})
    launch = spec.launch_cost_s                                     # beyond the fixed launch cost: > 4x less
    assert cm.kernel(work, spec.ai_cores) - launch < (cm.kernel(f32, spec.ai_cores) - launch) / 4
