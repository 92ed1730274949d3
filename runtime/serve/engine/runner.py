"""The model runner: SmolLM2 (llama) forward passes over flat token batches with a paged KV cache.

A step is N token rows of any mix of sequences (decode tokens, prompt chunks).  Per device, per step,
the host writes ONE input buffer (token ids, positions, the KV slot of every head row, the block table
and context length of every row, the rows whose logits are wanted) with a stream-ordered write; the
launches read everything else from device memory:

    embedding -> per layer: rmsnorm, matmul(q|k|v), rope, scatter_update (new keys and values into
    their cache slots), paged_attention (the cache read in place through the block tables), matmul(o)
    [+ all-reduce], add, rmsnorm, batch_matmul(gate|up), swiglu, matmul(down) [+ all-reduce], add
    -> embedding (gather the rows to sample) -> rmsnorm -> matmul(LM head)

Decode-only steps replay a graph captured once per batch-size bucket (:attr:`EngineConfig.decode_buckets`,
all captured at start): the batch is padded to its bucket (pad rows write the null block and attend
over nothing), so a decode step is one stream task per device whatever its batch.  Steps with prompt
tokens launch their kernels (N varies).  Tensor parallel (``tp > 1``): heads, FFN columns and the
vocabulary split as in :mod:`runtime.models.llama`; each device holds the KV cache of its KV heads.

Every step also samples greedily on the device: ``argmax`` of the logits rows into the first slots of
the input buffer (the *feed*), and every step reads its token ids through a ``gather`` over [feed | the
ids the host wrote]: a row whose id the host does not know yet -- the token the step queued before it is
still computing -- takes it from the feed on the device (vLLM's async scheduling keeps sampled ids on the
GPU the same way).  :meth:`ModelRunner.launch` queues a step and returns at once; :meth:`ModelRunner.ids`
waits for that step only (an event recorded after it: the step queued behind it keeps the device busy
meanwhile) and reads its greedy ids, :meth:`ModelRunner.logits` its logits (host sampling).  The ids
are copied to one of two host-readable slots by step parity, so the next step's argmax cannot overwrite
them before the host has read them; on one node that read is a copy out of the device's shared-memory
arena (:mod:`driver.client`'s fast path), not a transfer over gRPC.

Blocking: :meth:`ModelRunner.execute` returns when the logits are on the host (it synchronizes each
device's stream); a step without rows to sample returns at once (its work only ordered on the streams).
:meth:`ModelRunner.launch` only orders the devices; :meth:`ModelRunner.ids` / :meth:`ModelRunner.logits`
block until that step is done.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from devices.errors import AclError, InvalidParamError
from devices.kernel import TensorDesc
from runtime import hccl
from runtime.stages import CAPTURING, UPLOADING, stage
from runtime.models.common import Block, Closer, align, td
from runtime.models.llama import LlamaRank, host_weights, rank_specs
from runtime.models.weights import LlamaConfig

from .config import EngineConfig
from .kv_cache import KvCache, kv_bytes_per_block

#: exec timeout of the tensor-parallel communicators: a collective waits this long at most for its peers
#: (a decode step's all-reduces wait milliseconds; HCCL's default, 1836 s, would let a placement that
#: lost a device hold its survivors that long before the engine can fall back)
HCCL_EXEC_TIMEOUT_S = 60.0


@dataclass
class StepInputs:
    """A step's rows (host arrays): ``ids``/``positions``/``slots`` [N] (slot = block * BS + offset;
    -1 = nowhere), ``tables`` [N, MB], ``lens`` [N] (positions attended), ``rows`` [R] (rows whose
    logits are wanted), ``decode``: every row is one sequence's newest token; ``fed`` [N] (optional):
    per row, the sampled row of the step queued before this one whose greedy id is this row's token (read
    on the device), or -1 (the host's id)."""
    ids: np.ndarray
    positions: np.ndarray
    slots: np.ndarray
    tables: np.ndarray
    lens: np.ndarray
    rows: np.ndarray
    decode: bool
    fed: np.ndarray | None = None

    @property
    def n(self) -> int:
        return int(self.ids.size)

    def padded(self, b: int) -> "StepInputs":
        """Decode rows padded to bucket ``b`` (pad rows: token 0 at position 0, nowhere, length 0)."""
        k = b - self.n
        if k == 0:
            return self
        z = np.zeros(k, np.int64)
        fed = None if self.fed is None else np.concatenate([self.fed, z - 1])
        return StepInputs(np.concatenate([self.ids, z]), np.concatenate([self.positions, z]),
                          np.concatenate([self.slots, z - 1]),
                          np.concatenate([self.tables, np.zeros((k, self.tables.shape[1]), np.int64)]),
                          np.concatenate([self.lens, z]), np.arange(b), True, fed)


@dataclass(frozen=True)
class Launched:
    """A step queued on the devices: its sampled rows ``r`` and the parity slot its ids go to."""
    r: int
    parity: int


class _Rank:
    """One device: weights (a :class:`LlamaRank`), its KV cache, activations and input buffer."""

    def __init__(self, rank: LlamaRank, cfg: LlamaConfig, ecfg: EngineConfig):
        self.rank, self.cfg, self.ecfg = rank, cfg, ecfg
        sp = rank.spec
        self.dev, self.lc = rank.dev, rank.lc
        self.hq, self.hkv, self.ff = sp.hq, sp.hkv, sp.ff
        self.W, self.C = rank.W, rank.chunk
        self.vr = sp.v1 - sp.v0
        self.mb = -(-ecfg.max_model_len // ecfg.block_size)
        n, r = ecfg.max_num_batched_tokens, ecfg.max_num_seqs
        d, dh = cfg.d_model, cfg.head_dim
        b = Block(self.dev)
        for name, shape in (("x2", (2, n, d)), ("h2", (2, n, d)), ("tmp", (n, d)), ("gu", (2, n, sp.ff)),
                            ("f", (n, sp.ff)), ("st", (n, self.W, dh)), ("att", (n, sp.hq, dh)),
                            ("hsel", (r, d)), ("hf", (r, d)), ("logits", (r, self.vr))):
            b.add(name, shape)
        self.feed = align(4 * r)                        # bytes of the feed at the head of the input buffer
        b.add("inp", (self.layout(n, r)[1],), "uint8")
        b.add("out_ids", (2, r), "int32")               # greedy ids of the last steps, by parity
        self.act = b.allocate(self.lc.stream)           # activations: short-lived, on the rank's stream
        self.kv: KvCache | None = None
        self.graphs: dict[int, object] = {}
        self.done = [self.dev.event(), self.dev.event()]     # recorded after the ids copy of a step, by parity

    # -------------------------------------------------------------- inputs
    def layout(self, n: int, r: int) -> tuple[dict[str, tuple[int, tuple]], int]:
        """Byte offsets and shapes of a step's int32 inputs for ``n`` rows and ``r`` sampled rows.  The
        feed (greedy ids of the last step, written by the device) comes first and the host's ids right
        after it, at fixed offsets whatever ``n``: ``gather`` reads both as one array."""
        out, off = {}, self.feed
        for name, shape in (("hid", (n,)), ("src", (2, n)), ("ids", (2, n)), ("pos", (n, self.C)),
                            ("slots", (n * self.W,)), ("bt", (n, self.mb)), ("lens", (n,)), ("rows", (max(r, 1),))):
            out[name] = (off, shape)
            off += align(4 * int(np.prod(shape)))
        return out, off

    def write_inputs(self, s: StepInputs) -> None:
        """Queue the step's inputs (a stream-ordered write of everything after the feed)."""
        n, r = s.n, int(s.rows.size)
        lay, size = self.layout(n, r)
        buf = np.zeros(size, np.uint8)

        def put(name, arr):
            off, shape = lay[name]
            a = np.ascontiguousarray(arr, np.int32).reshape(-1)
            buf[off:off + a.nbytes] = a.view(np.uint8)

        put("hid", s.ids)
        src = np.arange(n, dtype=np.int64) + self.feed // 4           # the host's id of each row ...
        if s.fed is not None:
            src = np.where(s.fed >= 0, s.fed, src)                     # ... or the feed's, on the device
        put("src", np.concatenate([src, src]))
        pos = np.zeros((n, self.C), np.int64)
        pos[:, :-1] = s.positions[:, None]                        # q and k chunks rotate, v stays (pos 0)
        put("pos", pos)
        put("slots", self.head_rows(s.slots))
        put("bt", s.tables)
        put("lens", s.lens)
        put("rows", s.rows if r else np.zeros(1, np.int64))
        self.lc.stream.write(self.act["inp"].ptr + self.feed, buf[self.feed:].tobytes())

    def head_rows(self, slots: np.ndarray) -> np.ndarray:
        """Scatter rows ``[N * W]`` of each row's q|k|v heads: keys and values to their slot, the query
        heads (and rows going nowhere) to row 0 of the null block."""
        hq, hkv, W = self.hq, self.hkv, self.W
        n = slots.size
        out = np.zeros((n, W), np.int64)
        ok = slots >= 0
        base = slots[ok, None] * hkv + np.arange(hkv)[None, :]
        out[ok, hq:hq + hkv] = base
        out[ok, hq + hkv:] = base + self.kv.value_row0
        return out.reshape(-1)

    # -------------------------------------------------------------- launches
    def forward(self, n: int, r: int) -> None:
        """Issue one forward pass of ``n`` rows, sampling ``r`` of them (only orders the device)."""
        cfg, lc, w, a = self.cfg, self.lc, self.rank.wd, self.act
        d, dh, ff, hq, hkv, W = cfg.d_model, cfg.head_dim, self.ff, self.hq, self.hkv, self.W
        lay, _ = self.layout(n, r)
        inp = a["inp"].ptr

        def field(name):
            off, shape = lay[name]
            return TensorDesc(inp + off, shape, "int32")

        x2, h2 = td(a["x2"], (2, n, d)), td(a["h2"], (2, n, d))
        h0, tmp = td(a["h2"], (n, d)), td(a["tmp"], (n, d))
        gu, f = td(a["gu"], (2, n, ff)), td(a["f"], (n, ff))
        gate, up = td(a["gu"], (n, ff)), td(a["gu"], (n, ff), n * ff * 4)
        st = td(a["st"], (n, W, dh))
        qkv2 = td(a["st"], (n, W * dh))
        rv = td(a["st"], (n, self.C, hkv, dh))
        rows = td(a["st"], (n * W, dh))
        att, att2 = td(a["att"], (n, hq, dh)), td(a["att"], (n, hq * dh))
        pos, slots, bt, lens = field("pos"), field("slots"), field("bt"), field("lens")
        eps = float(cfg.eps)
        rope = {"base": float(cfg.rope_base), "style": "interleaved"}
        pa = {"num_heads": hq, "num_key_value_heads": hkv}
        rk = self.rank
        lc("gather", [TensorDesc(inp, (self.feed // 4 + n,), "int32"), field("src")], [field("ids")])
        rk.embed(lc, field("ids"), x2)
        for i, kv in zip(self.rank.spec.layers, self.kv.layers):
            lc("rmsnorm", [x2, w[f"{i}.an"]], [h2], eps=eps)
            rk.linear(lc, h0, f"{i}.wqkv", qkv2)
            lc("rope", [rv, pos], [rv], **rope)
            lc("scatter_update", [rows, slots], [kv.rows])
            lc("paged_attention", [st, kv.keys, kv.values, bt, lens], [att], **pa)
            rk.linear(lc, att2, f"{i}.wo", tmp)
            self._all_reduce(a["tmp"], n * d)
            lc("add", [x2, tmp], [x2])
            lc("rmsnorm", [x2, w[f"{i}.fn"]], [h2], eps=eps)
            rk.gate_up(lc, h2, h0, f"{i}.wgu", gu)
            lc("swiglu", [gate, up], [f])
            rk.linear(lc, f, f"{i}.wd", tmp)
            self._all_reduce(a["tmp"], n * d)
            lc("add", [x2, tmp], [x2])
        if r:
            hsel, hf = td(a["hsel"], (r, d)), td(a["hf"], (r, d))
            lc("embedding", [td(a["x2"], (n, d)), field("rows")], [hsel])
            lc("rmsnorm", [hsel, w["out_norm"]], [hf], eps=eps)
            rk.linear(lc, hf, "head", td(a["logits"], (r, self.vr)))
            lc("argmax", [td(a["logits"], (r, self.vr))], [TensorDesc(inp, (r,), "int32")], axis=-1)

    def _all_reduce(self, t, count: int) -> None:
        comm = self.rank.comm
        if comm is not None:
            comm.all_reduce(t.view((count,)), t.view((count,)), op="sum", stream=self.lc.stream)

    def capture(self, b: int) -> None:
        """Capture the decode step of bucket ``b`` (recorded, not run)."""
        self.lc.block_dim = 1
        with self.lc.stream.capture() as cap:
            self.forward(b, b)
        self.graphs[b] = cap.graph

    def logits(self, r: int) -> np.ndarray:
        return self.act["logits"].view((r, self.vr)).numpy(self.lc.stream)

    def mark(self, r: int, parity: int) -> None:
        """Queue the copy of the step's greedy ids to slot ``parity`` and the event after it (orders only)."""
        st = self.lc.stream
        st.copy(self.act["out_ids"].ptr + parity * 4 * self.ecfg.max_num_seqs, self.act["inp"].ptr, 4 * r)
        self.done[parity].record(st)

    def ids(self, r: int, parity: int) -> np.ndarray:
        """The greedy ids of the step marked with ``parity``: waits for that step only, then reads them."""
        self.done[parity].synchronize()
        ptr = self.act["out_ids"].ptr + parity * 4 * self.ecfg.max_num_seqs
        return self.dev.memcpy_d2h(ptr, 4 * r).view(np.int32).astype(np.int64)

    def close(self) -> None:
        c = Closer()
        c.push(self.rank.close)
        c.push(self.act.free)
        if self.kv is not None:
            c.push(self.kv.free)
        for g in self.graphs.values():
            c.push(g.destroy)
        for ev in self.done:
            c.push(ev.destroy)
        self.done = []
        self.graphs = {}
        self.kv = None
        c.close()


class ModelRunner:
    """SmolLM2 on ``devices`` (tensor parallel when more than one): weights, KV caches, captured
    decode graphs.  ``gguf``: the loaded model (:func:`runtime.models.weights.load_gguf_cached`)."""

    def __init__(self, devices: list, gguf, cfg: LlamaConfig, ecfg: EngineConfig, name: str = "model"):
        self.cfg, self.ecfg = cfg, ecfg
        n = len(devices)
        if n > 1 and (cfg.n_kv_heads % n or cfg.n_heads % n or cfg.d_ff % n):
            raise InvalidParamError(f"tensor parallel degree {n} must divide the {cfg.n_kv_heads} KV heads, "
                                    f"the {cfg.n_heads} heads and the FFN width {cfg.d_ff}")
        self.devices = devices
        self.ranks: list[_Rank] = []
        self.comms: list = []
        self.captures = 0                        #: graphs captured over the runner's life
        try:
            comms = None
            if n > 1:
                comms = hccl.comm_init_all(devices, hccl.CommOptions(exec_timeout_s=HCCL_EXEC_TIMEOUT_S))
                self.comms = list(comms)
            host = host_weights(gguf, cfg)
            with stage(UPLOADING, f"{name} on {n} device(s)", total=n) as advance:
                for r, (dev, sp) in enumerate(zip(devices, rank_specs(cfg, "tp" if n > 1 else "none", n))):
                    lr = LlamaRank(dev, cfg, sp, host, comms[r] if comms else None, "tp" if n > 1 else "none")
                    try:
                        self.ranks.append(_Rank(lr, cfg, ecfg))
                    except BaseException:
                        lr.close()
                        raise
                    advance()
                self.num_blocks = self._size_cache()
                for rk in self.ranks:
                    rk.kv = KvCache(rk.dev, cfg.n_layers, self.num_blocks, ecfg.block_size, rk.hkv, cfg.head_dim)
            if ecfg.graphs:
                self._capture_all(name)
        except BaseException:
            self.close()
            raise

    def _capture_all(self, name: str) -> None:
        """Capture the decode step of every bucket on every rank (blocks while each is recorded)."""
        buckets = self.ecfg.decode_buckets
        with stage(CAPTURING, f"{name}: batch sizes {', '.join(map(str, buckets))}",
                   total=len(buckets) * len(self.ranks)) as advance:
            for b in buckets:
                for rk in self.ranks:
                    rk.capture(b)
                    self.captures += 1
                    advance()

    def _size_cache(self) -> int:
        e = self.ecfg
        if e.num_gpu_blocks_override is not None:
            return e.num_gpu_blocks_override
        fits = []
        for rk in self.ranks:
            rk.dev.empty_cache()            # memory the pool caches counts as free for the KV cache
            free, total = rk.dev.mem_info()
            budget = e.gpu_memory_utilization * total - (total - free)
            fits.append(int(budget // kv_bytes_per_block(self.cfg.n_layers, e.block_size, rk.hkv, self.cfg.head_dim)))
        nb = min(fits)
        if nb < 2:
            raise InvalidParamError(f"no HBM left for the KV cache: gpu_memory_utilization={e.gpu_memory_utilization} "
                                    f"of the device leaves room for {nb} block(s) after the weights")
        return nb

    @property
    def num_graphs(self) -> int:
        return sum(len(rk.graphs) for rk in self.ranks)

    def execute(self, s: StepInputs) -> np.ndarray | None:
        """Run one step; the logits ``[R, vocab]`` of its sampled rows (None when it samples none)."""
        r = self._queue(s)
        if not r:
            return None
        return self._gather_logits(r)

    def _queue(self, s: StepInputs) -> int:
        """Queue the step's input writes and its forward pass (a graph replay for a decode step) on every
        rank; its sampled row count.  Only orders the devices."""
        r = int(s.rows.size)
        b = None
        if s.decode and self.ecfg.graphs:
            b = self.ecfg.bucket(s.n)
            s = s.padded(b)
        for rk in self.ranks:
            rk.write_inputs(s)
        for rk in self.ranks:
            if b is not None:
                rk.graphs[b].execute_async(rk.lc.stream)
            else:
                rk.lc.block_dim = 0
                rk.forward(s.n, r)
        return r

    def _gather_logits(self, r: int) -> np.ndarray:
        parts = [rk.logits(r) for rk in self.ranks]
        return parts[0] if len(parts) == 1 else np.concatenate(parts, axis=1)

    @property
    def samples_on_device(self) -> bool:
        """Whether the device's greedy ids are the model's (one rank holds the whole vocabulary)."""
        return len(self.ranks) == 1

    def launch(self, s: StepInputs, parity: int) -> Launched:
        """Queue one step whose greedy ids go to slot ``parity`` (0/1: a step's parity must differ from
        the step queued before it while that one is not read yet; only with :attr:`samples_on_device`).
        Returns at once: only orders the devices."""
        r = self._queue(s)
        if r and self.samples_on_device:
            self.ranks[0].mark(r, parity)
        return Launched(r, parity)

    def ids(self, step: Launched) -> np.ndarray:
        """The greedy token ids ``[R]`` of a launched step (blocks until that step is done, not later ones;
        only with :attr:`samples_on_device`)."""
        return self.ranks[0].ids(step.r, step.parity) if step.r else np.zeros(0, np.int64)

    def logits(self, step: Launched) -> np.ndarray:
        """The logits ``[R, vocab]`` of a launched step; blocks until the stream is idle, so only for the
        last step queued."""
        return self._gather_logits(step.r)

    def synchronize(self) -> None:
        for rk in self.ranks:
            rk.lc.stream.synchronize()

    def clear_failure(self) -> None:
        """After a failed step: wait for every rank's stream and drop the error it reports (the failed step's:
        an event's wait reports a stream's error without taking it), so the next step starts clean.  Blocks
        the host until the streams are idle."""
        for rk in self.ranks:
            try:
                rk.lc.stream.synchronize()
            except AclError:
                pass

    def close(self) -> None:
        c = Closer()
        for dev in self.devices:            # last: what the ranks freed went to the pools; back to the driver
            c.push(dev.empty_cache)
        for comm in self.comms:
            c.push(comm.destroy)
        for rk in self.ranks:
            c.push(rk.close)
        for rk in self.ranks:
            def sync(rk=rk):
                try:
                    rk.lc.stream.synchronize()
                except AclError:
                    pass
            c.push(sync)
        self.ranks, self.comms = [], []
        c.close()
