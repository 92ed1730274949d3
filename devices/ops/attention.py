"""Attention kernels (cube): ``attention`` (dense: softmax(q k^T * scale + mask [+ causal]) v with GQA),
``incre_flash_attention`` (one decode step over a packed KV cache ``[S, B, W, D]``, CANN
IncreFlashAttention) and ``paged_attention`` (token rows over key/value caches of fixed-size blocks
``[NB, BS, Hkv, D]`` through per-row block tables, CANN/ATB PagedAttention).

Both cached kernels read the cache in place up to per-sequence lengths (and, for incre_flash_attention,
from per-sequence left paddings) held in device memory, so a decode step's launches are the same from
step to step and can be captured as a graph.  Lengths and block ids are checked when the kernel runs:
one out of range traps (ACL_ERROR_RT_AICORE_TRAP_READ_OVERFLOW, like a user kernel's ``GmTensor``)
before any block writes anything.  Rows of a paged prefill chunk are rows whose lengths grow by one; new
keys and values reach a cache with ``scatter_update`` (:mod:`devices.ops.embedding`).

Blocks split ``B * Hq`` (attention; GQA groups stay whole per box), ``B * num_key_value_heads``
(incre_flash_attention: a block takes whole GQA groups) or the token rows ``N`` (paged_attention: rows
sharing a block table stay one gather per block).  A row with no visible key gets zeros, not NaN.
"""
from __future__ import annotations

import functools
import math

import numpy as np

from ..chip import Work
from ..errors import ACL_ERROR_RT_AICORE_TRAP_READ_OVERFLOW, KernelError
from ..registry import builtin
from .blocks import block_boxes, pad_box, part_for
from .checks import (FLOATS, ID_TYPES, arity, bool_attr, dtype_in, int_attr, ndim_in, need, num_attr, same_dtype,
                     shape_is)
from .norm import softmax
from .precision import F16, F32, compute_dtype, quiet
from .scratch import scratch
from .work import cube_work


@functools.lru_cache(maxsize=64)
def _causal_bias(sq: int, skv: int, q_offset: int):
    """Additive [Sq, Skv] float32 bias: -inf where key j > q_offset + i; None when nothing is masked."""
    if q_offset >= skv - 1:
        return None
    bias = np.where(np.arange(skv)[None, :] > (q_offset + np.arange(sq))[:, None], -np.inf, 0.0).astype(F32)
    bias.flags.writeable = False
    return bias


def _check_attention(inputs, outputs, attrs):
    nm = "attention"
    arity(nm, inputs, outputs, (3, 4))
    q, k, v, o = inputs[0], inputs[1], inputs[2], outputs[0]
    for what, d in (("q", q), ("k", k), ("v", v)):
        ndim_in(nm, d, what, 4, 4)
    dtype_in(nm, q, FLOATS, "q")
    same_dtype(nm, ("q", q), ("k", k), ("v", v), ("output", o))
    b, hq, sq, dq = q.shape
    bk, hkv, skv, dk = k.shape
    need(bk == b, nm, f"k batch {bk} differs from q batch {b}")
    need(dk == dq, nm, f"k head dim {dk} differs from q head dim {dq}")
    need(tuple(v.shape[:3]) == tuple(k.shape[:3]), nm,
         f"v shape {tuple(v.shape)} must match k {tuple(k.shape)} in [B, Hkv, Skv]")
    need(hkv >= 1 and hq % hkv == 0, nm, f"q heads {hq} must be a multiple of kv heads {hkv}")
    need(skv >= 1, nm, "attention needs at least one key (Skv >= 1)")
    shape_is(nm, o, (b, hq, sq, v.shape[3]))
    if len(inputs) == 4:
        m = inputs[3]
        dtype_in(nm, m, FLOATS, "mask")
        ndim_in(nm, m, "mask", 0, 4)
        full = (1,) * (4 - len(m.shape)) + tuple(m.shape)
        need(all(x in (1, y) for x, y in zip(full, (b, hq, sq, skv))), nm,
             f"mask shape {tuple(m.shape)} does not broadcast to [B, 1|Hq, Sq, Skv] = [{b}, {hq}, {sq}, {skv}]")
    bool_attr(nm, attrs, "causal")
    int_attr(nm, attrs, "q_offset", skv - sq)
    if attrs.get("scale") is not None:
        num_attr(nm, attrs, "scale", None)


def _attention_pd(inputs, outputs, attrs):
    return inputs[0].shape[0] * inputs[0].shape[1]


def _attention_work(inputs, outputs, attrs):
    b, hq, sq, d = inputs[0].shape
    skv, dv = inputs[2].shape[2], inputs[2].shape[3]
    return cube_work(inputs, outputs, 2.0 * b * hq * sq * skv * (d + dv) + 5.0 * b * hq * sq * skv)


@builtin("attention", unit="cube", check=_check_attention, work=_attention_work, parallel_dim=_attention_pd)
@quiet
def _attention_run(ctx, inputs, outputs, attrs):
    """softmax(q @ k^T * scale + mask [+ causal]) @ v; q [B,Hq,Sq,D], k/v [B,Hkv,Skv,D], GQA by h // (Hq/Hkv)"""
    q, k, v = inputs[0], inputs[1], inputs[2]
    mask = inputs[3] if len(inputs) > 3 else None
    out = outputs[0]
    b, hq, sq, d = q.shape
    hkv, skv, dv = k.shape[1], k.shape[2], v.shape[3]
    g = hq // hkv
    scale = attrs.get("scale")
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    cbias = None
    if attrs.get("causal", False):
        cbias = _causal_bias(sq, skv, int(attrs.get("q_offset", skv - sq)))
    q5 = q.reshape(b, hkv, g, sq, d)
    o5 = out.reshape((b, hkv, g, sq, dv), copy=False)
    m5 = None
    if mask is not None:
        m4 = mask.reshape((1,) * (4 - mask.ndim) + mask.shape)
        mh = (hkv, g) if m4.shape[1] == hq and hq > 1 else (1, 1)
        m5 = m4.reshape((m4.shape[0],) + mh + m4.shape[2:])
    ct = compute_dtype(out.dtype)
    for box in block_boxes(ctx, (b, hkv, g)):
        bs, ks, gs = pad_box(box, 3)
        qb = q5[bs, ks, gs]
        nb, nk, ng = qb.shape[:3]
        qm = qb.reshape(nb, nk, ng * sq, d)
        kb, vb = k[bs, ks], v[bs, ks]
        if qm.dtype != ct:
            qm, kb, vb = qm.astype(ct), kb.astype(ct), vb.astype(ct)
        s = np.matmul(qm, kb.swapaxes(-1, -2))                       # [nb, nk, ng*Sq, Skv]
        s *= scale
        if m5 is not None or cbias is not None:
            s5 = s.reshape(nb, nk, ng, sq, skv)
            if m5 is not None:
                s5 += part_for(m5, (bs, ks, gs), 5)
            if cbias is not None:
                s5 += cbias
        softmax(s, s, -1)
        ob = o5[bs, ks, gs]
        if ob.dtype == ct:
            np.matmul(s, vb, out=ob.reshape((nb, nk, ng * sq, dv), copy=False))
        else:
            np.copyto(ob, np.matmul(s, vb).reshape(nb, nk, ng, sq, dv), casting="same_kind")


_IFA = "incre_flash_attention"


def _head_counts(nm, attrs, wq) -> tuple[int, int]:
    """Attrs ``num_heads`` (in ``[1, wq]``, the query's heads per row) and ``num_key_value_heads`` (an int;
    each kernel checks how it divides ``num_heads``), both required."""
    for key in ("num_heads", "num_key_value_heads"):
        need(key in attrs, nm, f"attr {key!r} is required")
    h = int_attr(nm, attrs, "num_heads", None)
    need(1 <= h <= wq, nm, f"attr 'num_heads'={h} must be in [1, {wq}] (query has {wq} heads per row)")
    return h, int_attr(nm, attrs, "num_key_value_heads", None)


def _head_range_attr(nm, attrs, key, n, w) -> int:
    need(key in attrs, nm, f"attr {key!r} is required")
    v = int_attr(nm, attrs, key, None)
    need(0 <= v and v + n <= w, nm, f"attr {key!r}={v}: heads [{v}, {v + n}) do not fit in the cache's "
                                    f"{w} heads per slot")
    return v


def _check_ifa(inputs, outputs, attrs):
    nm = _IFA
    arity(nm, inputs, outputs, (3, 4))
    q, cache, lens, o = inputs[0], inputs[1], inputs[2], outputs[0]
    ndim_in(nm, q, "query", 3, 3)
    ndim_in(nm, cache, "cache", 4, 4)
    dtype_in(nm, q, FLOATS, "query")
    same_dtype(nm, ("query", q), ("cache", cache), ("output", o))
    b, wq, d = q.shape
    s, bc, w, dc = cache.shape
    need(bc == b, nm, f"cache batch {bc} (cache [S, B, W, D] = {tuple(cache.shape)}) differs from query batch {b}")
    need(dc == d, nm, f"cache head dim {dc} differs from query head dim {d}")
    need(d >= 1, nm, "head dim D must be >= 1")
    for what, t in (("actual_seq_lengths", lens),) + ((("kv_padding", inputs[3]),) if len(inputs) > 3 else ()):
        dtype_in(nm, t, ID_TYPES, what)
        need(tuple(t.shape) == (b,), nm, f"{what} shape {tuple(t.shape)} must be [B] = [{b}]")
    h, hkv = _head_counts(nm, attrs, wq)
    need(hkv >= 1 and h % hkv == 0, nm,
         f"attr 'num_key_value_heads'={hkv} must be >= 1 and divide num_heads={h}")
    _head_range_attr(nm, attrs, "key_head_offset", hkv, w)
    _head_range_attr(nm, attrs, "value_head_offset", hkv, w)
    if attrs.get("scale") is not None:
        num_attr(nm, attrs, "scale", None)
    shape_is(nm, o, (b, h, d))


def _ifa_pd(inputs, outputs, attrs):
    return inputs[0].shape[0] * int(attrs["num_key_value_heads"])


def _ifa_work(inputs, outputs, attrs):
    q, cache = inputs[0], inputs[1]
    b, _, d = q.shape
    s = cache.shape[0]
    h, hkv = int(attrs["num_heads"]), int(attrs["num_key_value_heads"])
    item = np.dtype(q.dtype).itemsize
    nbytes = item * (b * h * d + 2 * s * b * hkv * d) + outputs[0].nbytes + sum(t.nbytes for t in inputs[2:])
    return Work(flops=4.0 * b * h * s * d, bytes=nbytes, unit="cube", fp16=q.dtype == "float16")


@functools.lru_cache(maxsize=1)
def _f16_table() -> np.ndarray:
    t = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(F16).astype(F32)
    t.flags.writeable = False
    return t


def _f16_to_f32(a: np.ndarray) -> np.ndarray:
    """Exact float16 -> float32 by a 64K-entry table (about twice numpy's astype on strided data)."""
    return np.take(_f16_table(), a.view(np.uint16))


def _ifa_rows(q, cache, out, b, k0, k1, lo, hi, g, ko, vo, scale) -> None:
    """out heads [k0*g, k1*g) of sequence ``b``: kv-heads [k0, k1) over cache slots [lo, hi).

    Masked slots (``j < pad_b``) are skipped rather than scored ``-inf``: the same softmax (they would
    get probability exactly 0) without touching their memory."""
    nk = k1 - k0
    d = q.shape[2]
    ob = out[b, k0 * g:k1 * g].reshape((nk, g, d), copy=False)
    n = hi - lo
    if n <= 0:                                                         # nothing visible: zeros
        ob[...] = 0
        return
    ct = compute_dtype(out.dtype)
    qs = np.multiply(q[b, k0 * g:k1 * g].reshape(nk, g, d), scale, dtype=ct)    # scale folded into q
    kb = cache[lo:hi, b, ko + k0:ko + k1].transpose(1, 0, 2)         # [nk, n, D] views of the cache
    vb = cache[lo:hi, b, vo + k0:vo + k1].transpose(1, 0, 2)
    if kb.dtype == F16:
        kb, vb = _f16_to_f32(kb), _f16_to_f32(vb)
    elif kb.dtype != ct:
        kb, vb = kb.astype(ct), vb.astype(ct)
    # one gemv per head (matrix @ vector, broadcast over the group): numpy/BLAS run small-M gemms far
    # slower than gemvs, and every head's result is independent of how heads are split into blocks
    s = np.matmul(kb[:, None], qs[..., None]).reshape(nk, g, n)        # [nk, g, n] scores
    s -= s.max(axis=-1, keepdims=True)
    np.exp(s, out=s)
    z = s.sum(axis=-1, keepdims=True)
    r = np.matmul(s[:, :, None, :], vb[:, None]).reshape(nk, g, d)     # unnormalized p @ V
    np.divide(r, z, out=ob)                                            # one rounding into float16


@builtin(_IFA, unit="cube", check=_check_ifa, work=_ifa_work, parallel_dim=_ifa_pd, gathers=(1,))
@quiet
def _ifa_run(ctx, inputs, outputs, attrs):
    """Decode attention over a packed KV cache read in place (CANN IncreFlashAttention with
    actual_seq_lengths).  query [B, Wq, D] (heads [0, num_heads) are the queries), cache [S, B, W, D]
    (keys of kv-head g at head key_head_offset+g, values at value_head_offset+g), actual_seq_lengths [B]
    (sequence b attends over slots [0, len_b)), optional kv_padding [B] (slots j < pad_b masked);
    out [B, num_heads, D].  A length outside [0, S] traps (TRAP_READ_OVERFLOW) with nothing written."""
    q, cache, lens = inputs[0], inputs[1], inputs[2]
    out = outputs[0]
    s_max = cache.shape[0]
    ln = lens.tolist()
    if ln and (min(ln) < 0 or max(ln) > s_max):                      # every block checks all of them
        bad = [i for i, x in enumerate(ln) if not 0 <= x <= s_max]
        raise KernelError(f"{_IFA}: actual_seq_lengths[{bad[0]}]={ln[bad[0]]} is outside the cache's "
                          f"[0, {s_max}] slots ({len(bad)} bad length(s) in block {ctx.block_idx})",
                          code=ACL_ERROR_RT_AICORE_TRAP_READ_OVERFLOW)
    pad = inputs[3].tolist() if len(inputs) > 3 else None
    hkv = attrs["num_key_value_heads"]
    g = attrs["num_heads"] // hkv
    ko, vo = attrs["key_head_offset"], attrs["value_head_offset"]
    scale = attrs.get("scale")
    scale = 1.0 / math.sqrt(q.shape[2]) if scale is None else float(scale)
    if ctx.block_dim == 1:
        for b, hi in enumerate(ln):
            _ifa_rows(q, cache, out, b, 0, hkv, max(pad[b], 0) if pad else 0, hi, g, ko, vo, scale)
        return
    r = ctx.split(len(ln) * hkv)
    if not r:
        return
    for b in range(r.start // hkv, (r.stop + hkv - 1) // hkv):
        k0, k1 = max(r.start - b * hkv, 0), min(r.stop - b * hkv, hkv)
        _ifa_rows(q, cache, out, b, k0, k1, max(pad[b], 0) if pad else 0, ln[b], g, ko, vo, scale)


_PA = "paged_attention"


def _check_pa(inputs, outputs, attrs):
    nm = _PA
    arity(nm, inputs, outputs, 5)
    q, kc, vc, bt, lens, o = inputs[0], inputs[1], inputs[2], inputs[3], inputs[4], outputs[0]
    ndim_in(nm, q, "query", 3, 3)
    ndim_in(nm, kc, "key_cache", 4, 4)
    dtype_in(nm, q, FLOATS, "query")
    same_dtype(nm, ("query", q), ("key_cache", kc), ("value_cache", vc), ("output", o))
    n, wq, d = q.shape
    nb, bs, hkv_c, dc = kc.shape
    need(tuple(vc.shape) == tuple(kc.shape), nm,
         f"value_cache shape {tuple(vc.shape)} differs from key_cache {tuple(kc.shape)}")
    need(dc == d, nm, f"cache head dim {dc} differs from query head dim {d}")
    need(d >= 1 and bs >= 1 and nb >= 1, nm, "caches need >= 1 block, block size and head dim")
    dtype_in(nm, bt, ID_TYPES, "block_tables")
    ndim_in(nm, bt, "block_tables", 2, 2)
    need(bt.shape[0] == n and bt.shape[1] >= 1, nm,
         f"block_tables shape {tuple(bt.shape)} must be [N, max_blocks] = [{n}, >= 1]")
    dtype_in(nm, lens, ID_TYPES, "context_lens")
    need(tuple(lens.shape) == (n,), nm, f"context_lens shape {tuple(lens.shape)} must be [N] = [{n}]")
    h, hkv = _head_counts(nm, attrs, wq)
    need(hkv == hkv_c, nm, f"attr 'num_key_value_heads'={hkv} differs from the caches' {hkv_c} heads")
    need(h % hkv == 0, nm, f"num_heads={h} must be a multiple of num_key_value_heads={hkv}")
    if attrs.get("scale") is not None:
        num_attr(nm, attrs, "scale", None)
    shape_is(nm, o, (n, h, d))


def _pa_pd(inputs, outputs, attrs):
    return inputs[0].shape[0]


def _pa_work(inputs, outputs, attrs):
    """Upper bound: every row attends over its whole block table (the lengths are in device memory)."""
    q, kc, bt = inputs[0], inputs[1], inputs[3]
    n, _, d = q.shape
    span = bt.shape[1] * kc.shape[1]
    h, hkv = int(attrs["num_heads"]), int(attrs["num_key_value_heads"])
    item = np.dtype(q.dtype).itemsize
    nbytes = item * (n * h * d + 2 * n * span * hkv * d) + outputs[0].nbytes + bt.nbytes + inputs[4].nbytes
    return Work(flops=4.0 * n * h * span * d, bytes=nbytes, unit="cube", fp16=q.dtype == "float16")


#: what one more group of decode rows costs, in key positions of one row: a group is a dozen numpy calls
#: (~30 us) and a row attends ~5 positions per us at SmolLM2's 3 KV heads of 64, so rows whose lengths
#: differ by more than that per row go to groups of their own rather than being padded to one length
_GROUP_COST_KEYS = 160


def _pa_gather(cache, blocks, name: str, ct):
    """``cache [NB, BS, Hkv, D]`` blocks ``blocks [n, m]`` -> ``[n, m*BS, Hkv, D]`` in the compute dtype,
    in the thread's scratch buffer ``name`` (reused launch to launch).  Ids are clipped, not checked: the
    caller trapped on every id in use, and an unused entry (which may hold anything) is masked anyway."""
    n, m = blocks.shape
    g = cache.take(blocks, axis=0, out=scratch(name, (n, m) + cache.shape[1:], cache.dtype), mode="clip")
    g = g.reshape((n, m * cache.shape[1]) + cache.shape[2:])
    if g.dtype == F16:
        return _f16_to_f32(g)
    return g if g.dtype == ct else g.astype(ct)


def _pa_attend(q, kc, vc, blocks, lens, lmin: int, L: int, out, h: int, hkv: int, scale: float, ct) -> None:
    """Rows each with its own block table: row i attends over positions ``[0, lens[i])`` (1 <= ``lmin``
    <= lens[i] <= ``L``) of the blocks ``blocks[i]``.  q [n, Wq, D] (heads [0, h) are the queries), out
    [n, h, D] (written).  One gather of every row's blocks into a reused buffer and no copy beyond it: the
    scores' and the values' matmuls read the gathered keys in place, rows shorter than ``L`` are masked
    with an additive -inf, and the softmax's sum divides the product once (one rounding into float16)."""
    kb = _pa_gather(kc, blocks, "pa.k", ct)[:, :L].transpose(0, 2, 1, 3)        # [n, Hkv, L, D] views
    vb = _pa_gather(vc, blocks, "pa.v", ct)[:, :L].transpose(0, 2, 1, 3)
    _pa_softmax_v(q, kb, vb, out, h, hkv, scale, ct, lens if lmin < L else None)


def _pa_run_of(bl: list[int]) -> int:
    """1 / -1 when the block ids ``bl`` (two or more) are consecutive ascending / descending, else 0."""
    b0, m = bl[0], len(bl)
    if bl[-1] - b0 == m - 1 and bl == list(range(b0, b0 + m)):
        return 1
    if b0 - bl[-1] == m - 1 and bl == list(range(b0, b0 - m, -1)):
        return -1
    return 0


def _pa_attend_slice(q, kc, vc, bl: list[int], run: int, L: int, out, h, hkv, scale, ct) -> None:
    """One row whose blocks ``bl`` are consecutive ids (``run``: 1 ascending, -1 descending): its keys
    and values are one slice of the caches, read in place without a gather.  Descending, the slice holds
    the row's blocks last first: softmax and the value sum do not depend on the keys' order, and the
    last block's unwritten slots (now the slice's first) are masked."""
    bs, m = kc.shape[1], len(bl)
    lo = bl[0] if run > 0 else bl[-1]
    kb = kc[lo:lo + m].reshape(1, m * bs, kc.shape[2], kc.shape[3])
    vb = vc[lo:lo + m].reshape(1, m * bs, kc.shape[2], kc.shape[3])
    if run > 0:
        _pa_softmax_v(q, kb[:, :L].transpose(0, 2, 1, 3), vb[:, :L].transpose(0, 2, 1, 3), out, h, hkv, scale, ct)
    else:
        _pa_softmax_v(q, kb.transpose(0, 2, 1, 3), vb.transpose(0, 2, 1, 3), out, h, hkv, scale, ct,
                      hide=(L - (m - 1) * bs, bs))


def _pa_softmax_v(q, kb, vb, out, h: int, hkv: int, scale: float, ct, lens=None, hide=None) -> None:
    """softmax(q k^T * scale) v of rows q [n, Wq, D] (heads [0, h)) over keys / values kb, vb [n, Hkv, Lk, D]
    (views, any strides) into out [n, h, D]; ``lens`` [n]: row i sees keys [0, lens[i]) only; ``hide``
    (a, b): no row sees keys [a, b).  The softmax's sum divides the product once (one rounding into float16)."""
    n, d = q.shape[0], q.shape[2]
    g, lk = h // hkv, kb.shape[2]
    qs = np.multiply(q[:, :h], scale, dtype=ct, out=scratch("pa.q", (n, h, d), ct)).reshape(n, hkv, g, d)
    s = np.matmul(qs, kb.swapaxes(-1, -2), out=scratch("pa.s", (n, hkv, g, lk), ct))   # [n, Hkv, g, Lk]
    if lens is not None:
        s += np.where(np.arange(lk) < lens[:, None], ct(0), ct(-np.inf))[:, None, None, :]
    if hide is not None and hide[0] < hide[1]:
        s[..., hide[0]:hide[1]] = -np.inf
    s -= np.maximum.reduce(s, axis=-1, keepdims=True)
    np.exp(s, out=s)
    z = np.add.reduce(s, axis=-1, keepdims=True)
    if out.dtype == ct and out.flags.c_contiguous:
        o = out.reshape(n, hkv, g, d)
        np.matmul(s, vb, out=o)
        o /= z
    else:
        o = np.matmul(s, vb, out=scratch("pa.o", (n, hkv, g, d), ct))
        np.divide(o, z, out=out.reshape(n, hkv, g, d), casting="same_kind")


def _pa_groups(ls: list[int]) -> list[int]:
    """Cut points of rows sorted by length ``ls`` (ascending, all >= 1) into consecutive groups, each
    padded to its longest: the fewest padded positions plus :data:`_GROUP_COST_KEYS` per group
    (dynamic programming over the cuts; a decode batch has a few dozen rows at most)."""
    n = len(ls)
    best = [0] + [math.inf] * n
    cut = [0] * (n + 1)
    for j in range(1, n + 1):
        lj = ls[j - 1]
        bj, cj = math.inf, 0
        for i in range(j):
            c = best[i] + _GROUP_COST_KEYS + (j - i) * lj
            if c < bj:
                bj, cj = c, i
        best[j], cut[j] = bj, cj
    cuts, j = [n], n
    while j:
        j = cut[j]
        cuts.append(j)
    return cuts[::-1]


def _pa_singles(q, kc, vc, bt, ln, lens: list[int], out, rows: list[int], h, hkv, scale, ct) -> None:
    """Rows ``rows`` (ascending; ``lens`` all rows' lengths) each with its own block table (decode), in
    groups of similar length (:func:`_pa_groups`): a group of consecutive rows is read and written in
    place, any other through copies of its rows.  A row of length 0 gets zeros."""
    bs = kc.shape[1]
    if len(rows) == 1:                                             # one row: no grouping
        a = rows[0]
        L = lens[a]
        if not L:
            out[a] = 0
            return
        m = -(-L // bs)
        run = (1 if m == 1 else _pa_run_of(bt[a, :m].tolist())) if kc.dtype == ct else 0
        if run:                                                    # one slice of the cache: no gather
            _pa_attend_slice(q[a:a + 1], kc, vc, bt[a, :m].tolist(), run, L, out[a:a + 1], h, hkv, scale, ct)
        else:
            _pa_attend(q[a:a + 1], kc, vc, bt[a:a + 1, :m], ln[a:a + 1], L, L, out[a:a + 1], h, hkv, scale, ct)
        return
    order = sorted(rows, key=lens.__getitem__)
    srt = [lens[r] for r in order]
    z0 = srt.count(0)
    if z0:
        out[order[:z0]] = 0
    if z0 == len(srt):
        return
    cuts = [z0 + c for c in _pa_groups(srt[z0:])] if srt[z0] != srt[-1] else [z0, len(srt)]
    for i, j in zip(cuts[:-1], cuts[1:]):
        L = srt[j - 1]
        m = -(-L // bs)
        gi = order[i:j]
        a = min(gi)
        if max(gi) - a == j - i - 1:                               # consecutive rows: in place
            b = a + j - i
            _pa_attend(q[a:b], kc, vc, bt[a:b, :m], ln[a:b], srt[i], L, out[a:b], h, hkv, scale, ct)
            continue
        o = scratch("pa.rows", (j - i, h, q.shape[2]), out.dtype)
        _pa_attend(q[gi], kc, vc, bt[gi, :m], ln[gi], srt[i], L, o, h, hkv, scale, ct)
        out[gi] = o                                                # fancy index: an assignment, not a view


def _pa_segment(q, kc, vc, bt, ln, out, a, b, h, hkv, scale, ct) -> None:
    """Rows [a, b) sharing one block table (a prefill chunk): one gather of their sequence's keys,
    causal through the rows' lengths."""
    g, d, bs = h // hkv, q.shape[2], kc.shape[1]
    lr = ln[a:b]
    L = int(lr.max())
    nr = b - a
    if L == 0:
        out[a:b] = 0
        return
    blocks = bt[a:a + 1, :(L + bs - 1) // bs]
    kb = _pa_gather(kc, blocks, "pa.k", ct)[0, :L].transpose(1, 0, 2)          # [Hkv, L, D] views
    vb = _pa_gather(vc, blocks, "pa.v", ct)[0, :L].transpose(1, 0, 2)
    qs = np.multiply(q[a:b, :h], scale, dtype=ct).reshape(nr, hkv, g, d).transpose(1, 0, 2, 3).reshape(hkv, nr * g, d)
    s = np.matmul(qs, kb.swapaxes(-1, -2))                          # [Hkv, nr*g, L]
    if int(lr.min()) < L:                                            # causal via the lengths
        bias = np.where(np.arange(L)[None, :] < lr[:, None], ct(0), ct(-np.inf))
        s.reshape(hkv, nr, g, L)[...] += bias[None, :, None, :]
    m = s.max(axis=-1, keepdims=True)
    np.maximum(m, np.finfo(ct).min, out=m)                         # all -inf: exp(-inf - min) = 0
    s -= m
    np.exp(s, out=s)
    z = s.sum(axis=-1, keepdims=True)
    z[z == 0] = 1                                                  # no visible key: zeros, not NaN
    o = np.matmul(s, vb)
    o /= z
    np.copyto(out[a:b].reshape(nr, hkv, g, d), o.reshape(hkv, nr, g, d).transpose(1, 0, 2, 3), casting="same_kind")


#: the unsigned view of a block table's ids, by item size (a negative id reads as a huge one)
_UNSIGNED = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def _pa_trap_checks(ctx, ln, lens: list[int], bt, nb: int, bs: int) -> int:
    """Trap (507042, nothing written) on a length outside ``[0, MB * BS]`` or a block id in use outside
    ``[0, NB)``; every block checks every row.  Returns the longest length."""
    n, mb = bt.shape
    if not n:
        return 0
    lo, hi = min(lens), max(lens)
    if lo < 0 or hi > mb * bs:
        ln = ln.astype(np.int64)
        bad = np.flatnonzero((ln < 0) | (ln > mb * bs))
        raise KernelError(f"{_PA}: context_lens[{bad[0]}]={ln[bad[0]]} is outside [0, {mb * bs}] "
                          f"(block table of {mb} blocks of {bs}; {bad.size} bad length(s) in block {ctx.block_idx})",
                          code=ACL_ERROR_RT_AICORE_TRAP_READ_OVERFLOW)
    sub = bt[:, :-(-hi // bs)]
    if sub.size and int(sub.view(_UNSIGNED[sub.itemsize]).max()) >= nb:   # a negative id wraps high
        used = np.arange(sub.shape[1])[None, :] < ((ln.astype(np.int64) + bs - 1) // bs)[:, None]
        badb = used & ((sub < 0) | (sub >= nb))
        if badb.any():
            r, c = (int(x[0]) for x in np.nonzero(badb))
            raise KernelError(f"{_PA}: block_tables[{r}, {c}]={int(bt[r, c])} is outside the caches' [0, {nb}) "
                              f"blocks ({int(badb.sum())} bad block id(s) in use, block {ctx.block_idx})",
                              code=ACL_ERROR_RT_AICORE_TRAP_READ_OVERFLOW)
    return hi


@builtin(_PA, unit="cube", check=_check_pa, work=_pa_work, parallel_dim=_pa_pd, gathers=(1, 2))
@quiet
def _pa_run(ctx, inputs, outputs, attrs):
    """Attention of token rows over a paged KV cache read in place (CANN/ATB PagedAttention with block
    tables).  query [N, Wq, D] (heads [0, num_heads) are the queries), key_cache / value_cache
    [NB, BS, Hkv, D], block_tables [N, MB], context_lens [N]; row n attends over positions
    [0, context_lens[n]) of its sequence, position j living in block block_tables[n, j // BS] at offset
    j % BS (so a prefill chunk is rows whose lengths grow by one: causal).  out [N, num_heads, D]; a
    row with length 0 gets zeros.  A length outside [0, MB * BS] or a used block id outside [0, NB)
    traps (507042) with nothing written."""
    q, kc, vc, bt, ln = inputs
    out = outputs[0]
    nb, bs = kc.shape[0], kc.shape[1]
    ls = ln.tolist()
    hi = _pa_trap_checks(ctx, ln, ls, bt, nb, bs)
    h, hkv = int(attrs["num_heads"]), int(attrs["num_key_value_heads"])
    scale = attrs.get("scale")
    scale = 1.0 / math.sqrt(q.shape[2]) if scale is None else float(scale)
    ct = compute_dtype(out.dtype)
    r = range(bt.shape[0]) if ctx.block_dim == 1 else ctx.split(bt.shape[0])
    if not r:
        return
    a0, a1 = r.start, r.stop
    if a1 - a0 == 1:
        _pa_singles(q, kc, vc, bt, ln, ls, out, [a0], h, hkv, scale, ct)
        return
    sub = bt[a0:a1, :-(-hi // bs)]                                   # rows sharing a table: a prefill chunk
    starts = [0] + (np.flatnonzero(np.any(sub[1:] != sub[:-1], axis=1)) + 1).tolist() + [a1 - a0]
    singles = []
    for a, b in zip(starts[:-1], starts[1:]):
        if b - a == 1:
            singles.append(a0 + a)
        else:
            _pa_segment(q, kc, vc, bt, ln, out, a0 + a, a0 + b, h, hkv, scale, ct)
    if singles:
        _pa_singles(q, kc, vc, bt, ln, ls, out, singles, h, hkv, scale, ct)
