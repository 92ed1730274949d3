"""The weight-quantized kernels (devices/ops/quant.py) against an independent reference: the ``gguf``
package's own dequantisation (``gguf.dequantize``, numpy code of the llama.cpp project) followed by a
float64 numpy matmul, on random blocks of every format and on real rows of SmolLM2's GGUF file.

Kernels on GGUF weights compute on activations quantized per 32 values as GGML's Q8_1 (llama.cpp's
numerics): the reference's activations are quantized the same way here (:func:`q8_1`, numpy).

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
from devices.ops.qformats import GGUF_FORMATS, PACKED, ROWS, dequantize, packed_row_bytes, quantize_int8, repack
from devices.ops.qfused import dequantize_packed
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


def q8_1(a):
    """The activations as the fused loops see them, computed here in numpy from the definition of GGML's
    Q8_1 (llama.cpp's AVX2 quantize_row_q8_1): per 32 values ``amax``, ``aq = rint(a * (127 / amax))``
    in float32 (ties to even), value ``aq * (amax / 127)``; float64 ``[M, K]``."""
    a = np.asarray(a, np.float32).reshape(a.shape[0], -1, 32)
    amax = np.abs(a).max(axis=2, keepdims=True)
    with np.errstate(divide="ignore"):
        inv = np.where(amax > 0, np.float32(127) / amax, np.float32(0)).astype(np.float32)
    aq = np.rint(a * inv)
    assert np.abs(aq).max() <= 127
    return (aq.astype(np.float64) * (amax / np.float32(127)).astype(np.float64)).reshape(a.shape[0], -1)


def fused_bound(aq, w, extra=0):
    """Float32 error bound of the fused loops on the quantized activations ``aq`` (from :func:`q8_1`):
    each block's exact integer sum is scaled in float32 (a few roundings of terms no larger than
    ``sum |aq_j| * (max |w| + 23 (max w - min w))`` over the block: for w = d q + offset with 4-bit q the
    scale is at most the block's range and ``|offset + 8 d| <= max |w| + 15 |d|``) and the K/32 block
    terms are summed in float32."""
    n, k = w.shape
    wb = np.asarray(w, np.float64).reshape(n, -1, 32)
    mag = np.abs(wb).max(axis=2) + 23 * (wb.max(axis=2) - wb.min(axis=2))          # [N, K/32]
    asum = np.abs(aq).reshape(aq.shape[0], -1, 32).sum(axis=2)                     # [M, K/32]
    return gamma(k // 32 + 8 + extra) * (asum @ mag.T)


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
    aq = q8_1(a)                          # GGUF weights: the activations quantized as llama.cpp does
    got = run_blocks("weight_quant_matmul", [a, raw], (m, n), {"qtype": fmt}, block_dim)
    assert_within(got, reference(aq, w), bound(aq, w, 1), f"{fmt} M={m} blocks={block_dim}")
    got = run_blocks("weight_quant_matmul", [a, raw, bias], (m, n), {"qtype": fmt}, block_dim)
    assert_within(got, reference(aq, w) + bias, bound(aq, w, 2) + gamma(2) * np.abs(bias), "with bias")


def test_tiles_cover_every_row(monkeypatch):
    """A weight larger than one tile: every tile's rows land in their own output columns."""
    import devices.ops.quant as quant
    monkeypatch.setattr(quant, "TILE_BYTES", 4 * 256 * 3)          # 3 rows per tile at K = 256
    raw = random_blocks("q4_k", 11, 256, seed=5)
    w = gguf.dequantize(raw, GGML["q4_k"])
    for m in (2, 20):
        a = np.random.default_rng(m).standard_normal((m, 256)).astype(np.float32)
        got = run_blocks("weight_quant_matmul", [a, raw], (m, 11), {"qtype": "q4_k"}, 1)
        assert_within(got, reference(q8_1(a), w), bound(q8_1(a), w, 1))


def test_stacked_weights_share_the_activations():
    """A 3-D weight [G, N, .] gives out [G, M, N] (the gate|up projections of one launch)."""
    raw = np.stack([random_blocks("q4_1", 24, 64, seed=s) for s in (6, 7)])
    a = np.random.default_rng(8).standard_normal((5, 64)).astype(np.float32)
    got = run_blocks("weight_quant_matmul", [a, raw], (2, 5, 24), {"qtype": "q4_1"}, 2)
    for g in range(2):
        w = gguf.dequantize(raw[g], GGML["q4_1"])
        assert_within(got[g], reference(q8_1(a), w), bound(q8_1(a), w, 1))


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
        assert_within(got, reference(q8_1(a), w), bound(q8_1(a), w, 1), name)
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
    ([((1, 64), "float32"), ((40, 48), "uint8")], [((1, 40), "float32")], {"qtype": "q4_1r"}, "groups of 32 rows"),
    ([((1, 64), "float32"), ((32, 50), "uint8")], [((1, 32), "float32")], {"qtype": "q4_1r"}, "20-byte blocks"),
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


# ------------------------------------------------------------------ repacked (row-interleaved) layouts
def packed(fmt, raw):
    """``repack`` of a 2-D or stacked 3-D matrix of GGUF blocks (what the model upload does)."""
    if raw.ndim == 3:
        mats = [repack(fmt, m) for m in raw]
        return mats[0][0], np.stack([m for _, m in mats])
    return repack(fmt, raw)


@pytest.mark.parametrize("fmt", list(GGUF_FORMATS))
def test_repack_is_lossless(fmt):
    """The repacked layout dequantises to exactly the gguf package's weights, and the byte count is
    quants + a float32 scale (and offset) per 32 weights."""
    raw = random_blocks(fmt, 64, 512, seed=11)
    qt, p = repack(fmt, raw)
    assert PACKED[qt] == fmt and p.dtype == np.uint8 and p.shape[0] == 64
    assert p.shape[1] == (GGUF_FORMATS[fmt].row_bytes(512) if fmt != "q4_k" else 512 // 2 + 512 // 4)
    np.testing.assert_array_equal(dequantize_packed(qt, p), gguf.dequantize(raw, GGML[fmt]))
    special = np.array([6e-8, -6e-8, 0.0, -0.0, 65504.0, -1e-5, 3.0517578e-05], np.float16)   # fp16 subnormals ..
    blocks = raw.reshape(64, -1, GGUF_FORMATS[fmt].block_bytes)
    blocks[:len(special), 0, :2] = special.view(np.uint8).reshape(-1, 2)                        # .. as scales d
    qt, p = repack(fmt, raw)
    np.testing.assert_array_equal(dequantize_packed(qt, p), gguf.dequantize(raw, GGML[fmt]))
    with pytest.raises(InvalidParamError, match="groups"):
        repack(fmt, raw[:40])


@pytest.mark.parametrize("fmt", list(GGUF_FORMATS))
@pytest.mark.parametrize("m,block_dim", [(1, 1), (1, 3), (5, 2), (16, 1), (40, 1), (40, 3)])
def test_repacked_matmul_equals_dequantize_then_matmul(fmt, m, block_dim):
    """Both paths on the repacked layout (the fused loop for few rows, compiled tiles + BLAS for many)
    against the gguf package's dequantisation and a float64 matmul; a block split keeps whole groups."""
    import devices.ops.quant as quant
    n, k = 3 * ROWS, 512
    raw = random_blocks(fmt, n, k, seed=12)
    w = gguf.dequantize(raw, GGML[fmt])
    qt, p = repack(fmt, raw)
    fused = m <= quant.FUSED_ROWS
    assert fused == (m < 40)
    a = np.random.default_rng(13).standard_normal((m, k)).astype(np.float32)
    bias = np.random.default_rng(14).standard_normal(n).astype(np.float32)
    aq = q8_1(a)                                    # both paths compute on 8-bit activations
    bnd = fused_bound(aq, w) if fused else bound(aq, w, 1)
    got = run_blocks("weight_quant_matmul", [a, p], (m, n), {"qtype": qt}, block_dim)
    assert_within(got, reference(aq, w), bnd, f"{qt} M={m} blocks={block_dim}")
    got = run_blocks("weight_quant_matmul", [a, p, bias], (m, n), {"qtype": qt}, block_dim)
    bnd = fused_bound(aq, w, 1) if fused else bound(aq, w, 2)
    assert_within(got, reference(aq, w) + bias, bnd + gamma(2) * np.abs(bias), "with bias")


@pytest.mark.parametrize("fmt", list(GGUF_FORMATS))
@pytest.mark.parametrize("n", [ROWS, 3 * ROWS, 2 * ROWS, 6 * ROWS])
def test_fused_loops_on_8bit_activations(fmt, n):
    """The fused loops (every row count 1..16; groups of 32 rows and of 64) and the tiles (20 rows)
    against the float64 product of the gguf package's dequantised weight and the activations quantized
    per 32 as GGML's Q8_1 (numpy, from the format's definition); with ``quantize_a=False`` against the
    plain float64 product.  An odd K, a fresh random matrix per format, activations of mixed scales (a
    zero block included)."""
    from devices.ops.qformats import group_rows
    from devices.ops.quant import packed_matmul
    k = 256 * 3 if fmt == "q4_k" else 32 * 13
    raw = random_blocks(fmt, n, k, seed=20 + n)
    w = gguf.dequantize(raw, GGML[fmt])
    qt, p = repack(fmt, raw)
    assert group_rows(n) == (64 if n % 64 == 0 else 32)
    rng = np.random.default_rng(n)
    for m in range(1, 17):
        a = (rng.standard_normal((m, k)) * rng.choice([1e-3, 1.0, 30.0], (m, k // 32)).repeat(32, axis=1))
        a = a.astype(np.float32)
        a[0, 32:64] = 0
        got = np.full((m, n), np.nan, np.float32)
        packed_matmul(a, p, qt, got)
        aq = q8_1(a)
        assert_within(got, reference(aq, w), fused_bound(aq, w), f"{qt} N={n} M={m}")
        got = np.full((m, n), np.nan, np.float32)
        packed_matmul(a, p, qt, got, quantize_a=False)
        assert_within(got, reference(a, w), bound(a, w), f"{qt} N={n} M={m} float32 activations")
    a = rng.standard_normal((20, k)).astype(np.float32)              # the tiles (prefill): the same numbers
    for quantize_a in (True, False):
        got = np.full((20, n), np.nan, np.float32)
        packed_matmul(a, p, qt, got, quantize_a=quantize_a)
        aq = q8_1(a) if quantize_a else a
        assert_within(got, reference(aq, w), bound(aq, w, 1), f"{qt} N={n} M=20 tiles")


def test_fused_loops_quantize_like_llamacpp_and_propagate_nan():
    """With amax = 127 the activations' scale is 1: integers are kept, ties round to even (2.5 -> 2,
    3.5 -> 4, as llama.cpp's AVX2 rounding), and the fused result is the float64 product of the weight
    and those integers up to float32 rounding; a NaN or inf in a 32-block makes that row NaN."""
    from devices.ops.quant import packed_matmul
    raw = random_blocks("q8_0", 64, 64, seed=30)
    w = gguf.dequantize(raw, GGML["q8_0"])
    qt, p = repack("q8_0", raw)
    a = np.zeros((3, 64), np.float32)
    a[:, :32] = np.arange(-127, 129, 8, dtype=np.float32)           # amax 127: scale 1
    a[:, 5], a[:, 6] = 2.5, 3.5
    a[:, 32:] = -40.0
    a[1, 40] = np.nan
    a[2, 33] = np.inf
    got = np.empty((3, 64), np.float32)
    packed_matmul(a, p, qt, got)
    ints = a[:1].astype(np.float64)
    ints[0, 5], ints[0, 6] = 2, 4
    ints[0, 32:] = -127                                             # a block of one value: amax 40, aq -127
    ints[0, 32:] *= 40 / 127
    np.testing.assert_array_equal(q8_1(a[:1])[:, :32], ints[:, :32])
    assert_within(got[:1], reference(ints, w), fused_bound(ints, w), "exact steps")
    assert np.isnan(got[1:]).all()


def test_repacked_tiles_and_stacks(monkeypatch):
    """A stacked [2, N, .] repacked weight through tiles of one group each (many tiles), and through the
    fused loop; float16 activations are computed in float32."""
    import devices.ops.quant as quant
    monkeypatch.setattr(quant, "TILE_BYTES", 4 * 64 * ROWS)       # one group per tile at K = 64
    raw = np.stack([random_blocks("q4_k", 2 * ROWS, 256, seed=s) for s in (15, 16)])
    qt, p = packed("q4_k", raw)
    for m in (1, 2, 20):                                            # 1: the stack as one matrix, one call
        a = np.random.default_rng(m).standard_normal((m, 256)).astype(np.float32)
        got = run_blocks("weight_quant_matmul", [a, p], (2, m, 2 * ROWS), {"qtype": qt}, 1)
        for g in range(2):
            w = gguf.dequantize(raw[g], GGML["q4_k"])
            if m <= quant.FUSED_ROWS:
                assert_within(got[g], reference(q8_1(a), w), fused_bound(q8_1(a), w), f"g={g} M={m}")
            else:
                assert_within(got[g], reference(q8_1(a), w), bound(q8_1(a), w, 1), f"g={g} M={m}")
    a16 = np.random.default_rng(17).standard_normal((3, 256)).astype(np.float16)
    out = np.empty((2, 3, 2 * ROWS), np.float16)
    lookup("weight_quant_matmul").run(BlockCtx(0, 1, 0), [a16, p], [out], {"qtype": qt})
    w = gguf.dequantize(raw[1], GGML["q4_k"])
    want = reference(q8_1(a16.astype(np.float32)), w)
    np.testing.assert_allclose(out[1].astype(np.float64), want, rtol=2e-3, atol=2e-3 * np.abs(want).max())


def test_repacked_real_smollm2_rows_and_embedding():
    """The file's own Q4_1 and Q8_0 rows repacked: the fused loop, and the embedding's row gather equal
    to the gguf package's rows exactly; an id outside the table is refused."""
    g = load_gguf_quantized(smollm2_gguf())
    for name, fmt in (("blk.3.ffn_down.weight", "q4_1"), ("token_embd.weight", "q8_0")):
        raw = np.asarray(g.tensors[name][:96])
        w = gguf.dequantize(raw, GGML[fmt])
        qt, p = repack(fmt, raw)
        a = np.random.default_rng(18).standard_normal((1, w.shape[1])).astype(np.float32)
        got = run_blocks("weight_quant_matmul", [a, p], (1, 96), {"qtype": qt}, 1)
        assert_within(got, reference(q8_1(a), w), fused_bound(q8_1(a), w), name)
        ids = np.array([[95, 0], [17, 64]], np.int64)
        emb = run_blocks("quant_embedding", [p, ids], (2, 2, w.shape[1]), {"qtype": qt}, 3)
        np.testing.assert_array_equal(emb, w[ids])
        with pytest.raises(KernelError, match="id 96"):
            out = np.empty((1, w.shape[1]), np.float32)
            lookup("quant_embedding").run(BlockCtx(0, 1, 0), [p, np.array([96], np.int32)], [out], {"qtype": qt})


def test_repacked_priced_as_the_gguf_blocks():
    """Repacking changes the bytes in HBM, not the modelled clock: the work of a repacked launch is the
    work of the same launch on the GGUF blocks it was made from."""
    m, n, k = 1, 1536, 576
    a, o = TensorDesc(0, (m, k), "float32"), TensorDesc(0, (m, n), "float32")
    kern = lookup("weight_quant_matmul")
    for fmt in GGUF_FORMATS:
        kk = 512 if fmt == "q4_k" else k
        a = TensorDesc(0, (m, kk), "float32")
        raw = TensorDesc(0, (2, n, GGUF_FORMATS[fmt].row_bytes(kk)), "uint8")
        rp = TensorDesc(0, (2, n, packed_row_bytes(fmt + "r", kk)), "uint8")
        o = TensorDesc(0, (2, m, n), "float32")
        assert kern.work((a, rp), (o,), {"qtype": fmt + "r"}) == kern.work((a, raw), (o,), {"qtype": fmt})
