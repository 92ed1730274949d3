"""SmolLM2-135M-Instruct (llama architecture) on virtual NPUs: prefill, then token-by-token decode with a
KV cache in device HBM.

Layout (chosen so that every launch reads and writes contiguous tensors, the only kind a launch takes):

- Tokens are *sequence-major*: row ``s * B + b`` is position slot ``s`` of sequence ``b``.  Batches are
  left-padded (pads masked out of attention), so the newest token of every sequence sits in the same
  slot and one decode step appends one row block ``[B, ...]``.
- The residual stream is kept twice, ``x2 = [2, M, d]`` (both halves equal): RMSNorm of it feeds the
  gate and up projections as ONE ``batch_matmul`` (weights stacked ``[2, ff, d]``) whose two outputs are
  the contiguous inputs of ``swiglu``; half 0 feeds the QKV projection.
- Per layer, a history buffer ``H = [cap, B, W, Dh]`` (``W = Hq + 2 Hkv`` heads) is the KV cache: slot
  ``t`` holds the fused q|k|v projection of position slot ``t``.  RoPE runs in place on ``[B, C, Hkv,
  Dh]`` chunks (``C = Hq/Hkv + 2``) with positions ``[B, C]``: the q and k chunks get the token
  position, the v chunk position 0 (an exact identity rotation).
- Prefill: the projection writes slots ``[0, P)`` of ``H`` directly; one ``embedding`` gather per layer
  builds the head-major attention operands (row ids computed on the host), then causal ``attention``.
- Decode: the projection writes a staging row ``qkvd [B, W, Dh]``; ``scatter_update`` puts it into
  ``H`` at the slot held in device memory, and ``incre_flash_attention`` reads ``H`` in place over the
  slots ``[pad_b, len_b)`` held in device memory.  Nothing of a decode step's launches changes from
  step to step (same shapes, same pointers), so the first step of a call is captured as a graph
  (``aclmdlRI``, :mod:`runtime.graph`) and every step is ONE replay on each device.
- Per step the host writes ONE small buffer (token ids, positions, slot, lengths, pads) with a
  stream-ordered ``Stream.write``; it reads back only the ``[B, vocab]`` logits.
- GGUF keeps llama.cpp's permuted q/k rows (rope pairs (2i, 2i+1)): the weights stay as they are and
  RoPE runs with ``style="interleaved"`` (the same math as Hugging Face rotate-half on unpermuted rows).

Decode launches per layer: rmsnorm, matmul(qkv), rope, scatter_update, incre_flash_attention,
matmul(o), add, rmsnorm, batch_matmul(gate|up), swiglu, matmul(down), add = 12 (+2 all-reduces under
tensor parallelism); per step also one embedding, a final rmsnorm and the LM-head matmul, and one host
write of the step inputs.  With ONE sequence the residual stream is a single row, which fits the
``bias`` input of ``matmul`` (``[N]``): the o and down projections add the residual themselves
(``out = a @ w^T + x``, ping-pong buffers), and gate|up is one plain matmul (its two halves are
contiguous rows): 10 launches per layer.  With graphs (the default) all of a step's launches on a device
are ONE replay: 2 stream ops per step (the input write and the replay), carried by one RPC.

Parallel modes: ``none`` (one device), ``tp`` (heads, FFN columns and vocabulary split; partial sums of
the o and down projections all-reduced; one KV-head group per device, so the degree must divide the KV
heads), ``pp`` (contiguous layer stages; the residual stream is sent device to device).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from devices.errors import AclError, InvalidParamError
from devices.ops.qformats import GGUF_FORMATS, ROWS, dequantize, group_rows, repack
from runtime import hccl
from runtime.stages import LOADING_WEIGHTS, UPLOADING, stage

from .common import (Block, Closer, DescCache, JobBase, DeviceTimer, HostPack, Joined, JobStats, Launcher, Weight, now,
                     pick_devices, td, upload_block)
from .tokenizer import GgufBpeTokenizer, gguf_tokenizer
from .parallel import decoder_splits
from .weights import (LLAMA_BLOCK, LlamaConfig, llama_layer, llama_output, load_gguf_for, read_gguf_header,
                      smollm2_gguf)

DECODER_MODELS: dict[str, Callable] = {"smollm2": smollm2_gguf}


def decoder_config(model: str) -> LlamaConfig:
    """A decoder's shape from its GGUF header alone (milliseconds: no tensor, no vocabulary is read)."""
    if model not in DECODER_MODELS:
        raise InvalidParamError(f"unknown decoder model {model!r} (known: {', '.join(DECODER_MODELS)})")
    return LlamaConfig.from_gguf_meta(read_gguf_header(DECODER_MODELS[model]()))
DEFAULT_MAX_LEN = 2048


# ---------------------------------------------------------------------------------------------- sampling
def sample_token(logits: np.ndarray, rng: np.random.Generator, temperature: float, top_k: int,
                 top_p: float) -> int:
    """Greedy when ``temperature == 0``; else temperature, then top-k, then top-p (nucleus)."""
    if temperature <= 0:
        return int(np.argmax(logits))
    z = logits.astype(np.float64) / temperature
    if top_k and top_k < z.size:
        kth = np.partition(z, -top_k)[-top_k]
        z = np.where(z < kth, -np.inf, z)
    z -= z.max()
    p = np.exp(z)
    p /= p.sum()
    if top_p < 1.0:
        order = np.argsort(-p, kind="stable")
        cum = np.cumsum(p[order])
        keep = int(np.searchsorted(cum, top_p) + 1)
        mask = np.zeros_like(p, dtype=bool)
        mask[order[:keep]] = True
        p = np.where(mask, p, 0.0)
        p /= p.sum()
    return int(rng.choice(p.size, p=p))


# ---------------------------------------------------------------------------------------------- one device
@dataclass
class RankSpec:
    """What one device computes."""
    layers: range
    hq: int            #: query heads on this device
    hkv: int           #: kv heads on this device
    ff: int            #: FFN columns on this device
    q0: int            #: first query head
    kv0: int
    f0: int
    embed: bool        #: runs the token embedding
    head: bool         #: runs the final norm + LM head
    v0: int = 0        #: vocabulary rows of the LM head on this device
    v1: int = 0


class LlamaRank:
    """Weights and per-call buffers of one device, and the launches it issues."""

    def __init__(self, dev, cfg: LlamaConfig, spec: RankSpec, host: dict, comm=None, mode: str = "none"):
        self.dev = dev
        self.cfg = cfg
        self.spec = spec
        self.comm = comm
        self.tp = mode == "tp" and comm is not None          # all-reduce the o / down projections
        self.prev = self.next = -1                           # pipeline neighbours (ranks)
        if mode == "pp" and comm is not None:
            self.prev, self.next = comm.rank - 1, comm.rank + 1
        self.lc = Launcher(dev)
        self.w: Block | None = None
        self.buf: Block | None = None                        # this call's activations and step inputs (short-lived)
        self.kv: Block | None = None                         # this call's KV history (long-lived)
        self.packs: dict[str, HostPack] = {}
        self.graph = None                                    # this call's captured decode step
        self.graph_counts = (0, 0)                           # (launches, collectives) inside it
        self.qt: dict[str, str] = {}                         #: weight -> quantized format (absent: float32)
        try:
            self.w = upload_block(dev, self._host_weights(host))
        except BaseException:
            self.lc.close()
            raise
        self.chunk = spec.hq // spec.hkv + 2            # rope chunks of Hkv heads per token row
        self.W = spec.hq + 2 * spec.hkv                  # heads per H row
        self._wd = DescCache(dev, self._weight_descs)   # launch arguments, built once (again after a move)
        self._kvd = DescCache(dev, self._kv_descs)

    def _weight_descs(self) -> dict:
        spec, cfg = self.spec, self.cfg
        wd = {k: t.desc for k, t in self.w.views.items()}
        for i in spec.layers:
            g = wd[f"{i}.wgu"]
            wd[f"{i}.wgu2"] = td(g, (2 * spec.ff, g.shape[-1]))  # gate|up rows as one matrix
        if spec.head:
            e = wd["embd"]
            row = e.shape[1] * (4 if e.dtype == "float32" else 1)
            wd["head"] = td(e, (spec.v1 - spec.v0, e.shape[1]), spec.v0 * row)
        return wd

    def _kv_descs(self) -> tuple[dict, dict]:
        dh = self.cfg.head_dim
        hist = {i: self.kv[f"H{i}"].desc for i in self.spec.layers}
        return hist, {i: td(h, (self.cap * self.B * self.W, dh)) for i, h in hist.items()}

    @property
    def wd(self) -> dict:
        return self._wd.get()

    # -------------------------------------------------------------- weights
    def _host_weights(self, host: dict) -> dict[str, Weight]:
        """This device's share of the weights; quantized ones (``host["qtypes"]``) stay in their blocks
        and their format goes to :attr:`qt` (weights joined into one matrix share a format, else they are
        joined in float32).  Joined matrices (q|k|v, gate|up) are :class:`Joined` parts, written into their
        device slot one by one: no host copy of the join (~420 MB for SmolLM2 in float32)."""
        cfg, sp = self.cfg, self.spec
        dh = cfg.head_dim
        qts = host.get("qtypes", {})
        out: dict[str, np.ndarray] = {}

        if sp.embed or sp.head:
            out["embd"] = np.asarray(host["embd"])
            if qts.get("embd"):
                self.qt["embd"] = qts["embd"]
        if sp.head:
            out["out_norm"] = host["out_norm"]
        for i in sp.layers:
            L = host["layers"][i]
            kind = {r: qts.get((i, r)) for r in ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down")}
            parts = [self._rows(L["wq"], kind["wq"], sp.q0 * dh, (sp.q0 + sp.hq) * dh),
                     self._rows(L["wk"], kind["wk"], sp.kv0 * dh, (sp.kv0 + sp.hkv) * dh),
                     self._rows(L["wv"], kind["wv"], sp.kv0 * dh, (sp.kv0 + sp.hkv) * dh)]
            out[f"{i}.an"] = L["attn_norm"]
            out[f"{i}.wqkv"] = self._join(f"{i}.wqkv", parts, [kind["wq"], kind["wk"], kind["wv"]], Joined.rows)
            out[f"{i}.wo"] = self._cols(f"{i}.wo", L["wo"], kind["wo"], sp.q0 * dh, (sp.q0 + sp.hq) * dh)
            out[f"{i}.fn"] = L["ffn_norm"]
            gu = [self._rows(L["w_gate"], kind["w_gate"], sp.f0, sp.f0 + sp.ff),
                  self._rows(L["w_up"], kind["w_up"], sp.f0, sp.f0 + sp.ff)]
            out[f"{i}.wgu"] = self._join(f"{i}.wgu", gu, [kind["w_gate"], kind["w_up"]], Joined.stack)
            out[f"{i}.wd"] = self._cols(f"{i}.wd", L["w_down"], kind["w_down"], sp.f0, sp.f0 + sp.ff)
        return self._repacked(out)

    def _repacked(self, out: dict[str, Weight]) -> dict[str, Weight]:
        """Quantized weights whose rows fill whole groups repacked for the fused kernels
        (:func:`devices.ops.qformats.repack`, lossless; the cost model still prices the GGUF bytes); a
        table whose LM-head share does not start on a group stays in its GGUF blocks.  Compiles the fused
        loops on a first use (numba, some seconds; later processes, the device's included, load them from
        its on-disk cache).  Repacking works on groups of ROWS rows, so joined parts that each fill whole
        groups are repacked part by part (the same bytes as the joined matrix repacked)."""
        if self.qt:
            from devices.ops.qfused import compile_all          # numba: imported only where it is used
            compile_all()
        for key, fmt in list(self.qt.items()):
            w = out[key]
            if w.shape[-2] % ROWS or (key == "embd" and self.spec.head and not self._head_on_groups(w.shape[-2])):
                continue
            if isinstance(w, Joined) and w.ndim == 2 and any(p.shape[0] % ROWS for p in w.parts):
                w = np.concatenate(w.parts)                     # a part splits a group: join on the host
            if isinstance(w, Joined):
                mats = [repack(fmt, p) for p in w.parts]
                out[key] = Joined.stack([m for _, m in mats]) if w.ndim == 3 else Joined.rows([m for _, m in mats])
            else:
                mats = [repack(fmt, m) for m in (w if w.ndim == 3 else [w])]
                out[key] = np.stack([m for _, m in mats]) if w.ndim == 3 else mats[0][1]
            self.qt[key] = mats[0][0]
        return out

    def _head_on_groups(self, v: int) -> bool:
        """Whether this device's LM-head share of the ``v``-row table (a slice of it, read with the
        groups of its own row count) starts on a group of the table and has the table's groups."""
        r = group_rows(v)
        return self.spec.v0 % r == 0 and group_rows(self.spec.v1 - self.spec.v0) == r

    @staticmethod
    def _rows(w, kind, lo: int, hi: int):
        return (w, kind) if (lo, hi) == (0, w.shape[0]) else (w[lo:hi], kind)

    def _join(self, key: str, parts: list, kinds: list, fn) -> Joined:
        """Matrices ``parts`` (``(array, format)`` pairs) joined by ``fn`` (:meth:`Joined.rows` or
        :meth:`Joined.stack`): in their blocks when they share a format, else all in float32."""
        if len(set(kinds)) == 1 and kinds[0] is not None:
            self.qt[key] = kinds[0]
            return fn([np.asarray(p) for p, _ in parts])
        return fn([np.asarray(p, np.float32) if k is None else dequantize(k, np.asarray(p)) for p, k in parts])

    def _cols(self, key: str, w, kind, lo: int, hi: int) -> np.ndarray:
        """Columns ``[lo, hi)`` of ``w`` (a quantized one: whole blocks, else float32)."""
        k_all = w.shape[1] if kind is None else GGUF_FORMATS[kind].row_len(w.shape[1])
        if kind is not None:
            f = GGUF_FORMATS[kind]
            if (lo, hi) == (0, k_all):
                self.qt[key] = kind
                return np.asarray(w)
            if lo % f.block == 0 and hi % f.block == 0:
                self.qt[key] = kind
                return np.ascontiguousarray(w[:, lo // f.block * f.block_bytes:hi // f.block * f.block_bytes])
            w = dequantize(kind, np.asarray(w))
        return np.ascontiguousarray(w[:, lo:hi])

    # -------------------------------------------------------------- weight launches
    def linear(self, lc, a, key: str, out, bias=None) -> None:
        """``out = a @ W[key]^T (+ bias)``: a matmul, or on quantized weights a weight_quant_matmul
        (only orders the device)."""
        ins = [a, self.wd[key]] + ([] if bias is None else [bias])
        qt = self.qt.get("embd" if key == "head" else key.replace("wgu2", "wgu"))
        if qt is None:
            lc("matmul", ins, [out], transpose_b=True)
        else:
            lc("weight_quant_matmul", ins, [out], qtype=qt)

    def gate_up(self, lc, h2, h0, key: str, gu) -> None:
        """``gu[j] = h @ W[key][j]^T`` for the gate (j = 0) and up (1) halves: one batch_matmul of
        ``h2 [2, M, d]``, or on quantized weights one weight_quant_matmul of ``h0 [M, d]``."""
        qt = self.qt.get(key)
        if qt is None:
            lc("batch_matmul", [h2, self.wd[key]], [gu], transpose_b=True)
        else:
            lc("weight_quant_matmul", [h0, self.wd[key]], [gu], qtype=qt)

    def embed(self, lc, ids, out) -> None:
        """``out = embd[ids]`` (dequantised rows when the table is quantized)."""
        qt = self.qt.get("embd")
        if qt is None:
            lc("embedding", [self.wd["embd"], ids], [out])
        else:
            lc("quant_embedding", [self.wd["embd"], ids], [out], qtype=qt)

    def weight_bytes(self) -> int:
        """Device bytes of this rank's weights."""
        return 0 if self.w is None else int(self.w.size)

    # -------------------------------------------------------------- per-call buffers
    def plan(self, B: int, P: int, cap: int) -> int:
        """Lay out this call's buffers (KV history, activations, step inputs); returns their bytes."""
        cfg, sp = self.cfg, self.spec
        d, dh = cfg.d_model, cfg.head_dim
        b = Block(self.dev)
        kv = Block(self.dev)
        Mp = B * P
        for i in sp.layers:
            kv.add(f"H{i}", (cap, B, self.W, dh))
        n_p = B * sp.hq * P + 2 * B * sp.hkv * P
        for tag, M in (("p", Mp), ("d", B)):
            b.add(f"x2{tag}", (2, M, d))
            b.add(f"h2{tag}", (2, M, d))
            b.add(f"tmp{tag}", (M, d))
            b.add(f"gu{tag}", (2, M, sp.ff))
            b.add(f"f{tag}", (M, sp.ff))
        b.add("gp", (n_p, dh))
        b.add("qkvd", (B, self.W, dh))                 # a decode step's q|k|v before it joins the cache
        b.add("attp", (B, sp.hq, P, dh))
        b.add("att2p", (Mp, sp.hq * dh))
        b.add("attd", (B, sp.hq, 1, dh))
        if sp.head:
            b.add("hf", (B, d))
            b.add("logits", (B, sp.v1 - sp.v0))
        # step inputs: one host write per step (prefill: of the prefix the step uses)
        b.add("idsp", (2, Mp), "int32")
        b.add("posp", (Mp, self.chunk), "int32")
        b.add("maskp", (B, P))
        b.add("gidsp", (n_p,), "int32")
        b.add("idsd", (2, B), "int32")
        b.add("posd", (B, self.chunk), "int32")
        b.add("slotd", (1,), "int32")                 # the cache slot this step writes
        b.add("lensd", (B,), "int32")                 # slots attended: [pad_b, slot]
        b.add("padsd", (B,), "int32")
        self.buf, self.kv = b, kv
        self.B, self.P, self.cap = B, P, cap
        return b.size + kv.size

    def allocate(self) -> None:
        """This call's buffers, for work on the rank's stream: the KV history long-lived (packed with the
        weights at the top of HBM), activations and step inputs short-lived."""
        self.kv.allocate(self.lc.stream, lifetime="long")
        try:
            self.buf.allocate(self.lc.stream)
        except BaseException:
            self.kv.free()
            raise
        self.packs = {"p": HostPack(self.buf, ["idsp", "posp", "maskp", "gidsp"]),
                      "d": HostPack(self.buf, ["idsd", "posd", "slotd", "lensd", "padsd"])}
        self.graph = None
        self._kvd = DescCache(self.dev, self._kv_descs)

    @property
    def hist(self) -> dict:
        return self._kvd.get()[0]

    @property
    def table(self) -> dict:
        return self._kvd.get()[1]

    def release(self) -> None:
        if self.graph is not None:
            g, self.graph = self.graph, None
            g.destroy()
        for blk in (self.buf, self.kv):
            if blk is not None:
                blk.free()
        self.buf = self.kv = None
        self.packs = {}

    # -------------------------------------------------------------- step inputs
    def set_decode_inputs(self, ids: np.ndarray | None, positions: np.ndarray, slot: int,
                          pads: np.ndarray) -> None:
        """A decode step's inputs, in device memory where the (captured) launches read them: token
        ``ids [B]``, ``positions [B]``, the cache ``slot`` written, and per sequence the slots attended
        (``[pads[b], slot]``).  One stream-ordered write."""
        pk = self.packs["d"]
        if ids is not None:
            pk.put("idsd", np.concatenate([ids, ids]))
        pos = np.zeros((self.B, self.chunk), np.int32)
        pos[:, :-1] = positions[:, None]
        pk.put("posd", pos)
        pk.put("slotd", np.array([slot]))
        pk.put("lensd", np.full(self.B, slot + 1))
        pk.put("padsd", pads)
        self.lc.write(pk)

    def set_inputs(self, tag: str, ids: np.ndarray | None, positions: np.ndarray, q_slots: np.ndarray,
                   skv: int, valid: int, pads: np.ndarray, need_mask: bool) -> None:
        """Prefill inputs: token ``ids`` and ``positions [M]`` per token row; q rows from slots
        ``q_slots``; ``skv`` key rows of which slots ``[0, valid)`` hold keys."""
        B, W, sp = self.B, self.W, self.spec
        pk = self.packs[tag]
        if ids is not None:
            pk.put(f"ids{tag}", np.concatenate([ids, ids]))
        pos = np.zeros((positions.size, self.chunk), np.int32)
        pos[:, :-1] = positions[:, None]
        pk.put(f"pos{tag}", pos)
        bb = np.arange(B)
        q = (q_slots[None, None, :] * B + bb[:, None, None]) * W + np.arange(sp.hq)[None, :, None]
        s = np.minimum(np.arange(skv), valid - 1)            # never a slot not written yet (garbage)
        k = (s[None, None, :] * B + bb[:, None, None]) * W + sp.hq + np.arange(sp.hkv)[None, :, None]
        gids = np.concatenate([q.ravel(), k.ravel(), (k + sp.hkv).ravel()])
        pk.put(f"gids{tag}", gids)
        if need_mask:
            j = np.arange(skv)
            m = np.where((j[None, :] < pads[:, None]) | (j[None, :] >= valid), -np.inf, 0.0).astype(np.float32)
            pk.put(f"mask{tag}", m)
        self.lc.write(pk, f"gids{tag}", gids.size)

    # -------------------------------------------------------------- launches
    def prefill(self, P: int, need_mask: bool) -> None:
        """Issue this device's part of the prefill: ``P`` slots per sequence."""
        self._forward("p", P, need_mask)

    def decode(self, need_pads: bool, use_graph: bool) -> None:
        """Issue one decode step.  Its launches are the same every step (the step's values are in
        device memory), so with ``use_graph`` the first step is captured (aclmdlRI) and every step is
        one replay: one stream op instead of ~300 launches."""
        lc = self.lc
        if use_graph and self.graph is None:
            l0, c0 = lc.launches, lc.collectives
            with lc.stream.capture() as cap:
                self._forward("d", 1, need_pads)
            self.graph, self.graph_counts = cap.graph, (lc.launches - l0, lc.collectives - c0)
            lc.launches, lc.collectives = l0, c0
        if self.graph is None:
            self._forward("d", 1, need_pads)
            return
        self.graph.execute_async(lc.stream)
        lc.launches += self.graph_counts[0]
        lc.collectives += self.graph_counts[1]

    def _forward(self, tag: str, sq: int, need_mask: bool) -> None:
        """One forward pass of ``sq`` new tokens per sequence: prefill (``tag == "p"``, slots
        ``[0, sq)``, gather + causal attention) or one decode step (``"d"``: the step's q|k|v goes to a
        staging row, joins the cache at the slot held in device memory, and attention reads the cache
        in place up to the lengths held in device memory)."""
        cfg, sp, lc, bf, w = self.cfg, self.spec, self.lc, self.buf, self.wd
        B, W, dh, d, ff = self.B, self.W, cfg.head_dim, cfg.d_model, sp.ff
        M = B * sq
        single = tag == "d" and B == 1          # one sequence: residual adds fused into the matmuls
        x2, h2, tmp = bf[f"x2{tag}"], bf[f"h2{tag}"], td(bf[f"tmp{tag}"])
        gu, f = bf[f"gu{tag}"], td(bf[f"f{tag}"])
        h0 = td(h2, (M, d))
        pos = td(bf[f"pos{tag}"], (M, self.chunk))
        att = td(bf["attp"] if tag == "p" else bf["attd"])
        att2 = td(bf["att2p"]) if tag == "p" else td(att, (M, sp.hq * dh))
        eps = float(cfg.eps)
        rope_attrs = {"base": float(cfg.rope_base), "style": "interleaved"}
        if tag == "p":
            g = bf["gp"]
            nq, nk = B * sp.hq * sq, B * sp.hkv * sq
            gids = td(bf["gidsp"], (nq + 2 * nk,))
            gv = td(g, (nq + 2 * nk, dh))
            qkv = [td(g, (B, sp.hq, sq, dh)), td(g, (B, sp.hkv, sq, dh), nq * dh * 4),
                   td(g, (B, sp.hkv, sq, dh), (nq + nk) * dh * 4)]
            qkv += [td(bf["maskp"], (B, 1, 1, sq))] if need_mask else []
            att2t = td(att2, (sq, B, sp.hq, dh))
        else:
            st = td(bf["qkvd"])
            lens = [td(bf["lensd"])] + ([td(bf["padsd"])] if need_mask else [])
            ifa = {"num_heads": sp.hq, "num_key_value_heads": sp.hkv, "key_head_offset": sp.hq,
                   "value_head_offset": sp.hq + sp.hkv}
            att3 = td(att, (B, sp.hq, dh))
        gate, up = td(gu, (M, ff)), td(gu, (M, ff), M * ff * 4)
        gu1 = td(gu, (1, 2 * ff))
        # the residual stream: x2 [2, M, d] (both halves equal), or for one sequence two [1, d]
        # buffers used in turn (a matmul's bias input adds the residual: out = a @ w^T + x)
        xa, xb = x2.view((1, d)), x2.view((1, d), offset_bytes=d * 4)
        x = xa if single else x2
        if sp.embed:
            self.embed(lc, td(bf[f"ids{tag}"], (1,) if single else (2, M)), td(x))
        elif self.comm is not None:
            self.comm.recv(x, self.prev, stream=lc.stream)
            lc.collectives += 1
        x2d, h2d = td(x2), td(h2)
        hist, table = self.hist, self.table
        for i in sp.layers:
            H = hist[i]
            lc("rmsnorm", [td(x), w[f"{i}.an"]], [h0 if single else h2d], eps=eps)
            if tag == "p":
                slot = td(H, (M, W * dh))
                rv = td(slot, (M, self.chunk, sp.hkv, dh))
                self.linear(lc, h0, f"{i}.wqkv", slot)
                lc("rope", [rv, pos], [rv], **rope_attrs)
                lc("embedding", [table[i], gids], [gv])
                lc("attention", qkv, [att], causal=True, q_offset=0)
                lc("transpose", [att], [att2t], perm=(2, 0, 1, 3))
            else:
                rv = td(st, (M, self.chunk, sp.hkv, dh))
                self.linear(lc, h0, f"{i}.wqkv", td(st, (M, W * dh)))
                lc("rope", [rv, pos], [rv], **rope_attrs)
                lc("scatter_update", [td(st, (1, B * W * dh)), td(bf["slotd"])], [td(H, (self.cap, B * W * dh))])
                lc("incre_flash_attention", [st, H] + lens, [att3], **ifa)
            if single:
                x = self._proj_residual(att2, f"{i}.wo", x, xb if x is xa else xa)
                lc("rmsnorm", [td(x), w[f"{i}.fn"]], [h0], eps=eps)
                self.linear(lc, h0, f"{i}.wgu2", gu1)
                lc("swiglu", [td(gu, (1, ff)), td(gu, (1, ff), ff * 4)], [f])
                x = self._proj_residual(f, f"{i}.wd", x, xb if x is xa else xa)
                continue
            self.linear(lc, att2, f"{i}.wo", tmp)
            self._all_reduce(bf[f"tmp{tag}"])
            lc("add", [x2d, tmp], [x2d])
            lc("rmsnorm", [x2d, w[f"{i}.fn"]], [h2d], eps=eps)
            self.gate_up(lc, h2d, h0, f"{i}.wgu", td(gu))
            lc("swiglu", [gate, up], [f])
            self.linear(lc, f, f"{i}.wd", tmp)
            self._all_reduce(bf[f"tmp{tag}"])
            lc("add", [x2d, tmp], [x2d])
        if sp.head:
            last = td(x) if single else td(x2, (B, d), (sq - 1) * B * d * 4)
            lc("rmsnorm", [last, w["out_norm"]], [td(bf["hf"])], eps=eps)
            self.linear(lc, td(bf["hf"]), "head", td(bf["logits"]))
        elif self.comm is not None:
            self.comm.send(x, self.next, stream=lc.stream)
            lc.collectives += 1

    def _proj_residual(self, a, key, x, out):
        """``out = a @ W[key]^T + x`` for one row (the residual rides in the bias input; under tensor
        parallelism only rank 0 adds it and the all-reduce sums the partial products)."""
        first = not self.tp or self.comm.rank == 0
        self.linear(self.lc, a, key, td(out), td(x, (x.shape[-1],)) if first else None)
        self._all_reduce(out)
        return out

    def _all_reduce(self, t) -> None:
        if self.tp:
            self.comm.all_reduce(t, t, op="sum", stream=self.lc.stream)
            self.lc.collectives += 1

    def logits(self) -> np.ndarray:
        return self.buf["logits"].numpy(self.lc.stream)

    def close(self) -> None:
        c = Closer()
        c.push(self.lc.close)
        if self.w is not None:
            c.push(self.w.free)
        c.push(self.release)
        self.w = None
        c.close()


def rank_specs(cfg: LlamaConfig, parallel: str, n: int) -> list[RankSpec]:
    """What each of ``n`` devices computes under ``parallel`` (``none``/``tp``: heads, FFN columns and
    vocabulary split; ``pp``: contiguous layer stages)."""
    L, V = cfg.n_layers, cfg.vocab
    if parallel in ("none", "tp"):
        hq, hkv, ff = cfg.n_heads // n, cfg.n_kv_heads // n, cfg.d_ff // n
        return [RankSpec(range(L), hq, hkv, ff, r * hq, r * hkv, r * ff, True, True, r * V // n,
                         (r + 1) * V // n) for r in range(n)]
    bounds = [round(r * L / n) for r in range(n + 1)]
    return [RankSpec(range(bounds[r], bounds[r + 1]), cfg.n_heads, cfg.n_kv_heads, cfg.d_ff, 0, 0, 0,
                     r == 0, r == n - 1, 0, V) for r in range(n)]


def host_weights(g, cfg: LlamaConfig) -> dict:
    """The host arrays a :class:`LlamaRank` uploads its share of (``embd``, ``out_norm``, ``layers``)."""
    host = {"embd": g.tensors["token_embd.weight"],
            "layers": [llama_layer(g.tensors, i) for i in range(cfg.n_layers)]}
    host["out_norm"], head = llama_output(g.tensors)
    if head is not host["embd"]:
        raise InvalidParamError("only tied LM heads are supported (the GGUF has output.weight)")
    qt = getattr(g, "qtypes", {})
    host["qtypes"] = {"embd": qt.get("token_embd.weight")}
    for i in range(cfg.n_layers):
        for suffix, role in LLAMA_BLOCK.items():
            host["qtypes"][(i, role)] = qt.get(f"blk.{i}.{suffix}")
    return host


# ---------------------------------------------------------------------------------------------- the job
@dataclass
class Generation:
    token_ids: list[int]
    text: str
    prompt_tokens: int
    finish: str = "length"

    def as_dict(self) -> dict:
        return {"token_ids": list(self.token_ids), "text": self.text, "prompt_tokens": self.prompt_tokens,
                "finish": self.finish}

    def __getitem__(self, k):          # dict-style access: g["token_ids"], g["text"]
        return self.as_dict()[k]


class GenerateJob(JobBase):
    """A causal-LM inference job: weights uploaded once, ``generate`` as often as wanted, ``close``.

    ``parallel``: ``"none"`` (one device), ``"tp"`` (tensor parallel over ``devices``), ``"pp"``
    (pipeline stages over ``devices``).  ``devices``: a count (the first ones) or a list of device
    ids.  ``max_len`` bounds prompt + new tokens (the KV history is allocated per call for exactly what
    the call needs, up to this).  ``block_dim``: blocks per launch (None: the device's helper for
    prefill, one block for decode steps, whose kernels are too small to gain from splitting).
    ``graphs``: capture the first decode step of a call on each device and replay it for the others
    (False: launch every kernel of every step).  ``quantization``: ``"none"`` (weights dequantised to
    float32 at load) or ``"gguf"`` (the file's Q8_0 / Q4_1 / Q4_K blocks kept in HBM, computed on by
    ``weight_quant_matmul`` / ``quant_embedding``)."""

    def __init__(self, rt, model: str = "smollm2", devices: int | Sequence[int] = 1, parallel: str = "none",
                 max_len: int = DEFAULT_MAX_LEN, gguf_path: str | None = None, block_dim: int | None = None,
                 graphs: bool = True, quantization: str = "none"):
        if model not in DECODER_MODELS:
            raise InvalidParamError(f"unknown decoder model {model!r} (known: {', '.join(DECODER_MODELS)})")
        if parallel not in ("none", "tp", "pp"):
            raise InvalidParamError(f"parallel must be none, tp or pp for a decoder, got {parallel!r}")
        devs = pick_devices(rt, devices)
        if parallel == "none" and len(devs) != 1:
            raise InvalidParamError(f"parallel='none' runs on one device, got devices={devices} (use tp or pp)")
        path = str(gguf_path or DECODER_MODELS[model]())
        self.model = model
        self.parallel = parallel
        with stage(LOADING_WEIGHTS, model):
            self.tok: GgufBpeTokenizer = gguf_tokenizer(path)
            g = load_gguf_for(path, quantization)
        cfg = LlamaConfig.from_gguf_meta(g.meta)
        self.cfg = cfg
        self.quantization = quantization
        if not isinstance(max_len, int) or max_len < 2:
            raise InvalidParamError(f"max_len must be an integer >= 2, got {max_len!r}")
        self.max_len = min(max_len, cfg.context)
        n = len(devs)
        problem = decoder_splits(model, cfg).problem(parallel, n)
        if problem:
            raise InvalidParamError(problem)
        self.devices = devs
        self.block_dim = block_dim
        self.graphs = bool(graphs)
        self._closed = False
        self._comms = []
        self.ranks: list[LlamaRank] = []
        self.last_stats = JobStats()
        host = host_weights(g, cfg)
        specs = rank_specs(cfg, parallel, n)
        comms = None
        try:
            if n > 1:
                comms = hccl.comm_init_all(devs)
                self._comms = list(comms)
            with stage(UPLOADING, f"{model} on {n} device(s)", total=n) as advance:
                for r, (dev, sp) in enumerate(zip(devs, specs)):
                    self.ranks.append(LlamaRank(dev, cfg, sp, host, comms[r] if comms else None, parallel))
                    advance()
        except BaseException:
            self._teardown()
            raise

    # -------------------------------------------------------------- prompts
    def encode_prompts(self, prompts: Sequence, raw: bool) -> list[list[int]]:
        if isinstance(prompts, (str, bytes)) or not isinstance(prompts, (list, tuple)):
            raise InvalidParamError("prompts must be a list of strings (or of token-id lists)")
        if not prompts:
            raise InvalidParamError("no prompts given")
        out = []
        for i, p in enumerate(prompts):
            if isinstance(p, str):
                if not p.strip():
                    raise InvalidParamError(f"prompt {i} is empty")
                ids = self.tok.encode(p) if raw else self.tok.chat_prompt(p)
            else:
                try:
                    ids = [int(x) for x in p]
                except (TypeError, ValueError):
                    raise InvalidParamError(f"prompt {i} must be a string or a list of token ids") from None
                if not ids:
                    raise InvalidParamError(f"prompt {i} is empty")
                if min(ids) < 0 or max(ids) >= self.cfg.vocab:
                    raise InvalidParamError(f"prompt {i} has token ids outside [0, {self.cfg.vocab})")
            if len(ids) > self.cfg.context:
                raise InvalidParamError(f"prompt {i} has {len(ids)} tokens, longer than the model's context "
                                        f"of {self.cfg.context}")
            out.append(ids)
        return out

    # -------------------------------------------------------------- generation
    def _check_sampling(self, max_new_tokens, temperature, top_k, top_p) -> None:
        if self._closed:
            raise InvalidParamError("the job is closed")
        if not isinstance(max_new_tokens, (int, np.integer)) or max_new_tokens < 1:
            raise InvalidParamError(f"max_new_tokens must be a positive integer, got {max_new_tokens!r}")
        if not (isinstance(temperature, (int, float)) and math.isfinite(temperature) and temperature >= 0):
            raise InvalidParamError(f"temperature must be >= 0, got {temperature!r}")
        if not isinstance(top_k, (int, np.integer)) or top_k < 0:
            raise InvalidParamError(f"top_k must be an integer >= 0, got {top_k!r}")
        if not (isinstance(top_p, (int, float)) and 0 < top_p <= 1):
            raise InvalidParamError(f"top_p must be in (0, 1], got {top_p!r}")

    def score(self, prompts: Sequence, raw: bool = True) -> np.ndarray:
        """Logits ``[B, vocab]`` at the last position of each prompt (one prefill, nothing generated)."""
        self._check_sampling(1, 0.0, 0, 1.0)
        out: dict = {}

        def keep(logits: np.ndarray, t: int) -> None:
            out["logits"] = logits
            return None

        self._run(self.encode_prompts(prompts, raw), 1, keep)
        return out["logits"]

    def generate(self, prompts: Sequence, max_new_tokens: int = 32, temperature: float = 0.0, top_k: int = 0,
                 top_p: float = 1.0, seed: int = 0, raw: bool = False,
                 on_token: Callable[[int, int, str], None] | None = None,
                 stop_at_eos: bool = True) -> list[Generation]:
        """Generate for each prompt (a string, chat-templated unless ``raw``, or a list of token ids).
        Greedy when ``temperature == 0``; sampling draws from one generator seeded with ``seed`` per
        prompt, so a prompt gets the same tokens alone or in a batch.
        ``on_token(prompt_index, token_id, text_piece)`` is called as tokens come."""
        self._check_sampling(max_new_tokens, temperature, top_k, top_p)
        ids = self.encode_prompts(prompts, raw)
        B = len(ids)
        rngs = [np.random.default_rng(seed) for _ in range(B)]
        out: list[list[int]] = [[] for _ in range(B)]
        done = [False] * B
        finish = ["length"] * B
        stops = {self.tok.eos_id}
        if self.tok.tokens and self.tok.tokens[0] == "<|endoftext|>":
            stops.add(0)
        texts = [""] * B

        def step(logits: np.ndarray, t: int):
            """Sample from the step's logits; the next input tokens, or None to stop."""
            nxt = np.full(B, self.tok.pad_id, np.int64)
            for b in range(B):
                if done[b]:
                    continue
                tok = sample_token(logits[b], rngs[b], temperature, top_k, top_p)
                nxt[b] = tok
                out[b].append(tok)
                if on_token is not None:
                    full = self.tok.decode(out[b])
                    piece = full[len(texts[b]):] if full.startswith(texts[b]) else full
                    texts[b] = full
                    on_token(b, tok, piece)
                if stop_at_eos and tok in stops:
                    done[b], finish[b] = True, "eos"
            if all(done) or t == max_new_tokens - 1:
                return None
            return nxt

        lens = self._run(ids, max_new_tokens, step)
        self.last_stats.items = sum(len(o) for o in out)
        return [Generation(o, self.tok.decode(o), int(n), f) for o, n, f in zip(out, lens, finish)]

    def _run(self, ids: list[list[int]], max_new_tokens: int, step) -> np.ndarray:
        """Prefill, then decode while ``step(logits, t)`` returns the next tokens."""
        B = len(ids)
        lens = np.array([len(x) for x in ids])
        P = int(lens.max())
        if P + max_new_tokens > self.max_len:
            raise InvalidParamError(f"prompt ({P} tokens) + max_new_tokens ({max_new_tokens}) exceeds the "
                                    f"job's max length {self.max_len}")
        cap = P + max_new_tokens - 1 if max_new_tokens > 1 else P
        pads = (P - lens).astype(np.int64)
        need_mask = bool(pads.any())
        stats = JobStats()
        t_start = now()
        coll0 = sum(r.lc.collectives for r in self.ranks)
        for r in self.ranks:
            r.plan(B, P, cap)
        timer = None
        try:
            for r in self.ranks:
                r.allocate()
            timer = DeviceTimer([r.lc for r in self.ranks])
            timer.start()
            l0 = sum(r.lc.launches for r in self.ranks)
            # ---- prefill: slots [0, P) (left-padded, sequence-major)
            grid = np.zeros((P, B), np.int64)
            for b, x in enumerate(ids):
                grid[pads[b]:, b] = x
            pos = np.maximum(np.arange(P)[:, None] - pads[None, :], 0).reshape(-1)
            for r in self.ranks:
                r.set_inputs("p", grid.reshape(-1) if r.spec.embed else None, pos, np.arange(P), P, P, pads,
                             need_mask)
            for r in self.ranks:
                r.lc.block_dim = 0 if self.block_dim is None else self.block_dim
                r.prefill(P, need_mask)
                r.lc.block_dim = 1 if self.block_dim is None else self.block_dim
            logits = self._logits()
            stats.prefill_s = now() - t_start
            stats.prefill_tokens = int(lens.sum())
            ld0 = [r.lc.launches for r in self.ranks]
            t_dec = now()
            steps = 0
            for t in range(max_new_tokens):
                nxt = step(logits, t)
                if nxt is None:
                    break
                slot = P + t
                dpos = (slot - pads).astype(np.int64)
                for r in self.ranks:
                    r.set_decode_inputs(nxt if r.spec.embed else None, dpos, slot, pads)
                for r in self.ranks:
                    r.decode(need_mask, self.graphs)
                logits = self._logits()
                steps += 1
            stats.decode_s = now() - t_dec
            stats.decode_steps = steps
            ld1 = [r.lc.launches for r in self.ranks]
            stats.decode_launches = sum(ld1) - sum(ld0)
            stats.device_launches_per_token = [(b - a) / steps if steps else 0.0 for a, b in zip(ld0, ld1)]
            stats.launches = sum(ld1) - l0
            stats.devices = timer.stop()
        finally:
            if timer is not None:
                timer.destroy()
            for r in self.ranks:
                try:
                    r.lc.stream.synchronize()       # nothing may still use the buffers (error paths)
                except AclError:
                    pass
                r.release()
        stats.wall_s = now() - t_start
        stats.collectives = sum(r.lc.collectives for r in self.ranks) - coll0
        self.last_stats = stats
        return lens

    def _logits(self) -> np.ndarray:
        heads = [r for r in self.ranks if r.spec.head]
        parts = [r.logits() for r in heads]
        return parts[0] if len(parts) == 1 else np.concatenate(parts, axis=1)

