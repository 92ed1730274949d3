"""Indexed rows: ``embedding`` (rows of a table read at ids) and ``scatter_update`` (rows of its output
written *in place* at indices read from device memory: how new keys and values reach a KV cache; rows
not indexed keep their contents).

An id or index out of range is a KernelError raised before anything is written (scatter_update traps with
ACL_ERROR_RT_AICORE_TRAP_WRITE_OVERFLOW).  Blocks split the ids / the K updates (each block writes the
rows of its own updates).
"""
from __future__ import annotations

import numpy as np

from ..chip import Work
from ..errors import ACL_ERROR_RT_AICORE_TRAP_WRITE_OVERFLOW, KernelError
from ..registry import builtin
from .blocks import as_rows
from .checks import ANY, ID_TYPES, arity, dtype_in, ndim_in, need, same_dtype, shape_is


def _check_embedding(inputs, outputs, attrs):
    nm = "embedding"
    arity(nm, inputs, outputs, 2)
    table, ids, o = inputs[0], inputs[1], outputs[0]
    ndim_in(nm, table, "table", 2, 2)
    dtype_in(nm, ids, ID_TYPES, "ids")
    same_dtype(nm, ("table", table), ("output", o))
    shape_is(nm, o, tuple(ids.shape) + (table.shape[1],))


def _embedding_work(inputs, outputs, attrs):
    return Work(flops=0.0, bytes=inputs[1].nbytes + 2 * outputs[0].nbytes, unit="vector")


def _embedding_pd(inputs, outputs, attrs):
    return inputs[1].numel


@builtin("embedding", unit="vector", check=_check_embedding, work=_embedding_work, parallel_dim=_embedding_pd,
         gathers=(0,))
def _embedding_run(ctx, inputs, outputs, attrs):
    """out[*S, D] = table[ids]; an id outside [0, V) is a KernelError, never wrapped"""
    table, ids = inputs
    v, d = table.shape
    ids1 = ids.reshape(-1)
    o2 = as_rows(outputs[0], d, True)
    if ctx.block_dim > 1:
        r = ctx.split(ids1.size)
        if not r:
            return
        ids1, o2 = ids1[r.start:r.stop], o2[r.start:r.stop]
    if ids1.size == 0:
        return
    lo, hi = ids1.min(), ids1.max()
    if lo < 0 or hi >= v:
        bad = np.flatnonzero((ids1 < 0) | (ids1 >= v))
        first = int(bad[0]) + (ctx.split(ids.size).start if ctx.block_dim > 1 else 0)
        raise KernelError(f"embedding: id {int(ids.reshape(-1)[first])} at flat index {first} is outside the "
                          f"table's [0, {v}) rows ({bad.size} bad id(s) in block {ctx.block_idx})")
    np.take(table, ids1, axis=0, out=o2, mode="clip")               # range checked above; clip = no buffering


def _check_scatter_update(inputs, outputs, attrs):
    nm = "scatter_update"
    arity(nm, inputs, outputs, 2)
    upd, idx, var = inputs[0], inputs[1], outputs[0]
    ndim_in(nm, upd, "updates", 1)
    ndim_in(nm, var, "var", 1)
    ndim_in(nm, idx, "indices", 1, 1)
    dtype_in(nm, idx, ID_TYPES, "indices")
    dtype_in(nm, var, ANY, "var")
    same_dtype(nm, ("var", var), ("updates", upd))
    need(idx.shape[0] == upd.shape[0], nm,
         f"indices length {idx.shape[0]} differs from the updates' rows {upd.shape[0]} (updates [K, ...])")
    need(tuple(upd.shape[1:]) == tuple(var.shape[1:]), nm,
         f"updates row shape {tuple(upd.shape[1:])} differs from var row shape {tuple(var.shape[1:])}")


def _scatter_update_work(inputs, outputs, attrs):
    return Work(flops=0.0, bytes=inputs[1].nbytes + 2 * inputs[0].nbytes, unit="vector")


def _scatter_update_pd(inputs, outputs, attrs):
    return inputs[1].shape[0]


#: up to this many indices (one block) a scatter finds duplicates with a Python dict rather than a sort
_SMALL_SCATTER = 64


def _last_occurrence(idx: np.ndarray) -> np.ndarray | None:
    """Mask of the positions whose index does not occur again later; None when all are distinct."""
    order = np.argsort(idx, kind="stable")
    srt = idx[order]
    last = np.ones(idx.size, bool)
    np.not_equal(srt[1:], srt[:-1], out=last[:-1])
    if last.all():
        return None
    keep = np.zeros(idx.size, bool)
    keep[order[last]] = True
    return keep


@builtin("scatter_update", unit="vector", check=_check_scatter_update, work=_scatter_update_work,
         parallel_dim=_scatter_update_pd, scatters=(0,))
def _scatter_update_run(ctx, inputs, outputs, attrs):
    """In place: var[indices[k], ...] = updates[k, ...] (inputs updates [K, *R], indices [K]; output var
    [S, *R], its other rows untouched).  Duplicate indices: the last k wins.  An index outside [0, S)
    traps (TRAP_WRITE_OVERFLOW) and nothing is written (every block checks all K indices before writing)."""
    upd, idx = inputs
    var = outputs[0]
    k, s = idx.shape[0], var.shape[0]
    if k == 0:
        return
    if k == 1:                                                         # decode: one slot per step
        i = int(idx[0])
        if not 0 <= i < s:
            raise KernelError(f"scatter_update: index {i} at position 0 is outside var's [0, {s}) rows "
                              f"(1 bad index; nothing written)", code=ACL_ERROR_RT_AICORE_TRAP_WRITE_OVERFLOW)
        if ctx.block_idx == 0:
            var[i] = upd[0]
        return
    if k <= _SMALL_SCATTER and ctx.block_dim == 1:                   # a decode step's few rows: in Python
        il = idx.tolist()
        if min(il) >= 0 and max(il) < s:
            last = dict(zip(il, range(k)))                             # each index -> its last position
            if len(last) == k:
                var[idx] = upd
            else:
                var[list(last)] = upd[list(last.values())]
            return
    lo, hi = int(idx.min()), int(idx.max())
    if lo < 0 or hi >= s:
        bad = np.flatnonzero((idx < 0) | (idx >= s))
        raise KernelError(f"scatter_update: index {int(idx[bad[0]])} at position {int(bad[0])} is outside var's "
                          f"[0, {s}) rows ({bad.size} bad index(es); nothing written)",
                          code=ACL_ERROR_RT_AICORE_TRAP_WRITE_OVERFLOW)
    keep = _last_occurrence(idx)
    if ctx.block_dim == 1:
        if keep is None:
            var[idx] = upd                                             # distinct rows: one fancy assignment
        else:
            var[idx[keep]] = upd[keep]
        return
    r = ctx.split(k)
    if not r:
        return
    ib, ub = idx[r.start:r.stop], upd[r.start:r.stop]
    if keep is not None:
        kb = keep[r.start:r.stop]
        ib, ub = ib[kb], ub[kb]
    var[ib] = ub
