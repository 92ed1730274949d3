"""What ``vnpu bench serve-om`` serves and measures against: the default model (a small CNN it writes as
ONNX and compiles with ``vnpu atc`` into an ``.om`` with dynamic batch gears), the inputs its clients send
and the references their answers are checked against, and the in-process bound -- the same batches
executed with no server around them, by onnxruntime on one thread (one per device) and by the ``.om``'s own
kernel graph in numpy (:class:`runtime.atc.hostrun.HostRun`: what the compiled-model engine's device replay
executes, without the runtime).

Blocking: :func:`build_default` runs ``vnpu atc`` in a subprocess; :class:`Bound` times executions on the
calling thread.  Host-only.
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
    import onnx
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
    m = helper.make_model(helper.make_graph(nodes, "bench_cnn", [x], [y], inits),
                          opset_imports=[helper.make_opsetid("", 17)], producer_name="vnpu-bench")
    m.ir_version = 8
    onnx.checker.check_model(m)
    onnx.save(m, str(path))
    return path


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


@dataclass(frozen=True)
class Tensor:
    name: str
    dtype: str
    dims: tuple[int, ...]          #: without the batch axis


def samples(inputs: list[Tensor], n: int, seed: int = 0) -> list[dict[str, np.ndarray]]:
    """``n`` one-row requests' inputs: floats from a normal distribution; integers in 1000..29999 (token
    ids of a BERT vocabulary), and ones for an ``attention_mask``."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        d = {}
        for t in inputs:
            shape = (1, *t.dims)
            if np.dtype(t.dtype).kind == "f":
                d[t.name] = rng.standard_normal(shape).astype(t.dtype)
            elif t.name == "attention_mask":
                d[t.name] = np.ones(shape, t.dtype)
            else:
                d[t.name] = rng.integers(1000, 30000, shape).astype(t.dtype)
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
    median on a loaded 2-core machine swings 2-10x between runs of a few ms)."""

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

    def gear(self, rows: int) -> int:
        return next((g for g in self.gears if g >= rows), rows)

    def _time(self, fn) -> float:
        fn()                                          # warm up (first-touch of buffers, ORT's allocations)
        times, t_end = [], time.perf_counter() + self.min_s
        while len(times) < 3 or time.perf_counter() < t_end and len(times) < 50:
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return min(times)

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
                self._t[key] = self._time(lambda: self._ort.run(None, feeds))
            else:
                hr = self._host.get(g)
                if hr is None:
                    hr = self._host[g] = self._HostRun(self.manifest, self.weights, g if self.gears else None)
                self._t[key] = self._time(lambda: hr.run(xs))
        return self._t[key]

    def rows_per_s(self, engine: str, batches: dict[int, int]) -> float | None:
        """Rows per second of executing ``batches`` (rows -> executions) back to back by ``engine``."""
        total = 0.0
        for rows, n in batches.items():
            s = self.seconds(engine, rows)
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


__all__ = ["Bound", "DEFAULT_GEARS", "Tensor", "atc", "build_default", "cnn_onnx", "samples", "stack"]
