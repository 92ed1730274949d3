"""The model compiler behind ``vnpu atc``: ONNX in, a :class:`CompiledModel` (an ``.om``) out.

Per batch gear (one gear for a static model; one per ``--dynamic_batch_size`` entry otherwise, like
ATC's multi-batch models) the pipeline is: instantiate the ONNX graph at concrete input shapes
(:mod:`.onnx_import`), infer shapes and fold constants (:mod:`.fold`), fuse operator patterns
(:mod:`.fuse`), lower to device kernels (:mod:`.lower`, through the op table of :mod:`.ops`) and plan
the workspace (:mod:`.memplan`).  The unfused graph is lowered too, only to report what fusion saved.
Constants of all gears are packed once into the weights blob (identical arrays are stored once).

The manifest (JSON, see :mod:`.om` for the container) holds::

    format, version, producer, name, soc_version, source {framework, file, opset, bytes}
    inputs  [{name, dtype, dims (-1: the dynamic batch axis), format}]   (+ ascend_mbatch_shape_data)
    outputs [{name, dtype, dims}]
    dynamic_batch [gears]  (empty for a static model)
    weights {size, tensors [{name, offset, shape, dtype}]}
    workspace_size  (the largest gear's plan)
    gears [{batch, workspace_size,
            inputs  [[region, offset, shape, dtype]]      model inputs staged in the workspace
            outputs [[region, offset, shape, dtype]]      where each output is after the steps
            buffers [[offset, nbytes, first, last]]       the memory plan (step lifetimes)
            steps   [{kernel, inputs, outputs, attrs, block_dim, node, modeled_us}],
                     (block_dim: the tiling for the SoC's cores that modeled_us is priced with)
            stats {...}}]
    report {...}

A view is ``[region, offset, shape, dtype]`` with region ``"ws"`` (the workspace allocation) or ``"w"``
(the weights allocation).
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from devices.errors import ACL_ERROR_GE_INTERNAL_ERROR, ACL_ERROR_GE_PARAM_INVALID, AclError, AtcError

from . import aipp, fold, fuse, lower, memplan, om
from .onnx_import import OnnxSource, instantiate, load_onnx, resolve_shapes
from .options import DYNAMIC_INPUT_NAME, CompileOptions
from .program import WEIGHT, Program

PRODUCER = "vnpu atc 0.1"
FRAMEWORK_ONNX = 5


@dataclass
class GearBuild:
    batch: int | None
    program: Program
    plan: memplan.MemoryPlan
    before: dict                      #: launches / intermediate bytes of the unfused graph
    folded: int
    pruned: int
    fused: dict


@dataclass
class CompiledModel:
    manifest: dict
    weights: bytes
    gears: list[GearBuild] = field(default_factory=list)

    @property
    def report(self) -> dict:
        return self.manifest["report"]

    def to_bytes(self) -> bytes:
        return om.write_om(self.manifest, self.weights)

    def save(self, path: str | Path) -> Path:
        """Write the .om (to a temporary name first, so a failed write leaves no partial file)."""
        p = Path(path)
        tmp = p.with_name(p.name + ".tmp")
        tmp.write_bytes(self.to_bytes())
        tmp.replace(p)
        return p


# ---------------------------------------------------------------------------------------------- gears
def _gear_shapes(src: OnnxSource, opts: CompileOptions) -> tuple[dict, list]:
    given = opts.shapes()
    shapes = resolve_shapes(src, given)
    dyn = []
    for name, dims in shapes.items():
        if -1 in dims[1:]:
            raise AtcError("E10018", ACL_ERROR_GE_PARAM_INVALID, shape=",".join(map(str, dims)), index=name)
        if dims and dims[0] == -1:
            dyn.append(name)
    if opts.dynamic_batch and not dyn:
        raise AtcError("E10031", ACL_ERROR_GE_PARAM_INVALID)
    if dyn and not opts.dynamic_batch:
        raise AtcError("E10011", ACL_ERROR_GE_PARAM_INVALID, shape=f"{dyn[0]}:{','.join(map(str, shapes[dyn[0]]))}",
                       result=-1)
    return shapes, dyn


def _build_gear(src: OnnxSource, shapes: dict, batch: int | None, opts: CompileOptions) -> GearBuild:
    concrete = {n: tuple(batch if (i == 0 and d == -1) else d for i, d in enumerate(dims))
                for n, dims in shapes.items()}
    g = instantiate(src, concrete)
    counts = fold.propagate(g, opts.fold_limit)
    unfused = lower.lower_graph(g, opts.soc_version, opts.quant)
    fused = {}
    prog = unfused
    if opts.fuse:
        fused = fuse.fuse(g)
        prog = lower.lower_graph(g, opts.soc_version, opts.quant)
    before = {"launches": unfused.launches, "intermediate_bytes": unfused.intermediate_bytes,
              "modeled_us": round(unfused.modeled_s * 1e6, 3)}
    return GearBuild(batch, prog, memplan.plan_memory(prog, opts.reuse_memory), before, counts["folded"],
                     counts["pruned"], fused)


# ---------------------------------------------------------------------------------------------- weights
class _WeightPack:
    """The weights blob: each distinct constant once, 64-byte aligned."""

    def __init__(self):
        self.parts: list[bytes] = []
        self.size = 0
        self.index: dict[tuple, int] = {}
        self.tensors: list[dict] = []
        self._by_id: dict[int, tuple[np.ndarray, int]] = {}     # arrays shared by the gears: hashed once

    def add(self, arr: np.ndarray, name: str) -> int:
        seen = self._by_id.get(id(arr))
        if seen is not None and seen[0] is arr:
            return seen[1]
        off = self._add(arr, name)
        self._by_id[id(arr)] = (arr, off)
        return off

    def _add(self, arr: np.ndarray, name: str) -> int:
        a = np.asarray(arr, order="C")
        key = (a.dtype.name, a.shape, hashlib.blake2b(a.tobytes(), digest_size=16).digest())
        off = self.index.get(key)
        if off is None:
            pad = -self.size % om.ALIGN
            if pad:
                self.parts.append(b"\0" * pad)
                self.size += pad
            off = self.size
            raw = a.astype(a.dtype.newbyteorder("<"), copy=False).tobytes()
            self.parts.append(raw)
            self.size += len(raw)
            self.index[key] = off
            self.tensors.append({"name": name, "offset": off, "shape": list(a.shape), "dtype": a.dtype.name})
        return off

    def blob(self) -> bytes:
        return b"".join(self.parts)


def _jsonable(v):
    if isinstance(v, (tuple, list)):
        return [_jsonable(x) for x in v]
    if isinstance(v, np.generic):
        return v.item()
    return v


def _gear_manifest(gb: GearBuild, pack: _WeightPack) -> dict:
    prog, plan = gb.program, gb.plan
    woff = {bid: pack.add(arr, prog.buffers[bid].name) for bid, arr in prog.weights.items()}

    def view(v):
        kind = prog.buffers[v.buf].kind
        base = woff[v.buf] if kind == WEIGHT else plan.offset(v.buf)
        return ["w" if kind == WEIGHT else "ws", base + v.offset, list(v.shape), v.dtype]

    steps = [{"kernel": s.kernel, "inputs": [view(v) for v in s.inputs], "outputs": [view(v) for v in s.outputs],
              "attrs": {k: _jsonable(a) for k, a in s.attrs.items()}, "block_dim": s.block_dim, "node": s.node,
              "modeled_us": round(s.modeled_s * 1e6, 3)} for s in prog.steps]
    buffers = [[p.offset, p.nbytes, p.first, p.last] for p in sorted(plan.placements.values(), key=lambda p: p.buf)]
    stats = {
        "launches_before_fusion": gb.before["launches"], "launches": prog.launches,
        "intermediate_bytes_before_fusion": gb.before["intermediate_bytes"],
        "intermediate_bytes": prog.intermediate_bytes,
        "plan_peak_bytes": plan.size, "plan_no_reuse_bytes": plan.naive,
        "folded_nodes": gb.folded, "pruned_nodes": gb.pruned, "fused": gb.fused,
        "modeled_us_before_fusion": gb.before["modeled_us"], "modeled_us": round(prog.modeled_s * 1e6, 3),
        "kernels": prog.kernel_counts(),
    }
    return {"batch": gb.batch, "workspace_size": plan.size, "inputs": [view(v) for v in prog.inputs],
            "outputs": [view(v) for v in prog.outputs], "buffers": buffers, "steps": steps, "stats": stats}


def _io_dims(per_gear: list[tuple], dynamic: bool) -> list[int]:
    first = per_gear[0]
    if not dynamic:
        return list(first)
    return [d if all(s[i] == d for s in per_gear) else -1 for i, d in enumerate(first)]


# ---------------------------------------------------------------------------------------------- entry point
def compile_model(source, options: CompileOptions | None = None) -> CompiledModel:
    """Convert an ONNX model (path, bytes or ModelProto) with ``options``; raises :class:`AtcError`
    (an unexpected failure inside the compiler is E19999 / 545000, never a bare exception)."""
    try:
        return _compile(source, options or CompileOptions())
    except AclError:
        raise
    except Exception as e:  # noqa: BLE001
        raise AtcError("E19999", ACL_ERROR_GE_INTERNAL_ERROR, reason=f"{type(e).__name__}: {e}") from None


def _compile(source, opts: CompileOptions) -> CompiledModel:
    src = load_onnx(source)
    shapes, dyn = _gear_shapes(src, opts)
    aipp_entries: list = []
    if opts.aipp:
        src, shapes, aipp_entries = aipp.apply(src, shapes, opts.aipp, bool(opts.dynamic_batch))
    batches = list(opts.dynamic_batch) or [None]
    builds = [_build_gear(src, shapes, b, opts) for b in batches]
    pack = _WeightPack()
    gears = [_gear_manifest(gb, pack) for gb in builds]
    dynamic = bool(opts.dynamic_batch)
    inputs = []
    for i, name in enumerate(src.inputs):
        dims = list(shapes[name.name]) if not dynamic else [(-1 if name.name in dyn and j == 0 else d)
                                                            for j, d in enumerate(shapes[name.name])]
        inputs.append({"name": name.name, "dtype": name.dtype, "dims": dims,
                       "format": "NCHW" if len(dims) == 4 else "ND"})
    if dynamic:
        inputs.append({"name": DYNAMIC_INPUT_NAME, "dtype": "uint64", "dims": [1], "format": "ND"})
    outputs = []
    for i, name in enumerate(src.outputs):
        per = [tuple(g["outputs"][i][2]) for g in gears]
        outputs.append({"name": name, "dtype": gears[0]["outputs"][i][3], "dims": _io_dims(per, dynamic),
                        "format": "NCHW" if len(per[0]) == 4 else "ND"})
    g0 = builds[-1]
    report = {
        "soc_version": opts.soc_version, "gears": [g["batch"] for g in gears],
        "launches_before_fusion": g0.before["launches"], "launches_after_fusion": g0.program.launches,
        "intermediate_bytes_before_fusion": g0.before["intermediate_bytes"],
        "intermediate_bytes_after_fusion": g0.program.intermediate_bytes,
        "plan_peak_bytes": g0.plan.size, "plan_no_reuse_bytes": g0.plan.naive,
        "workspace_bytes": max(g["workspace_size"] for g in gears), "weights_bytes": pack.size,
        "folded_nodes": g0.folded, "fused": g0.fused,
        "modeled_us": gears[-1]["stats"]["modeled_us"], "modeled_us_before_fusion": g0.before["modeled_us"],
    }
    manifest = {
        "format": "vnpu-om", "version": om.FORMAT_VERSION, "producer": PRODUCER, "name": src.name,
        "soc_version": opts.soc_version,
        "source": {"framework": FRAMEWORK_ONNX, "file": Path(src.origin).name, "opset": src.opset,
                   "bytes": src.nbytes},
        "inputs": inputs, "outputs": outputs, "dynamic_batch": list(opts.dynamic_batch),
        "weights": {"size": pack.size, "tensors": pack.tensors},
        "workspace_size": max(g["workspace_size"] for g in gears),
        "gears": gears, "report": report,
    }
    if aipp_entries:
        manifest["aipp"] = aipp_entries
    return CompiledModel(manifest, pack.blob(), builds)
