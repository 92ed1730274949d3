"""What a loaded offline model looks like from outside: its inputs and outputs (names, dims, dtypes,
formats, sizes) and its gears -- the facts behind pyACL's ``aclmdlDesc`` getters.

A gear is keyed by its batch size (``--dynamic_batch_size``), its (height, width) (``--dynamic_image_size``)
or None (a static model's one gear).  Sizes are those of the LARGEST gear (``aclmdlGetInputSizeByIndex``
on a model with gears: the buffers an application allocates once hold any gear); input dims show -1 on
the dynamic axes; output dims are those of the largest gear, and ``dims_at(gear)`` gives any gear's
(``aclmdlGetCurOutputDims``).  A model with gears has one more input, last: ``ascend_mbatch_shape_data``
(uint64 [1]: the batch size, or [2]: height and width) that carries the gear, as ATC adds it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from devices.kernel import ACL_DTYPE
from runtime.atc.om import gear_key

#: aclDataType of every dtype a model description can show (uint64: the dynamic-gear input)
ACL_DTYPES = dict(ACL_DTYPE, uint64=10)
#: aclFormat
ACL_FORMATS = {"NCHW": 0, "NHWC": 1, "ND": 2}

Gear = int | tuple[int, int] | None


@dataclass(frozen=True)
class IOSpec:
    name: str
    dtype: str
    dims: tuple[int, ...]
    format: str
    size: int                                       #: bytes at the largest gear
    gear_dims: tuple[tuple[Gear, tuple[int, ...]], ...]

    @property
    def acl_dtype(self) -> int:
        return ACL_DTYPES[self.dtype]

    @property
    def acl_format(self) -> int:
        return ACL_FORMATS.get(self.format, ACL_FORMATS["ND"])

    def dims_at(self, gear: Gear) -> tuple[int, ...]:
        for g, dims in self.gear_dims:
            if g == gear:
                return dims
        return self.gear_dims[-1][1]

    def nbytes_at(self, gear: Gear) -> int:
        return int(math.prod(self.dims_at(gear))) * np.dtype(self.dtype).itemsize


@dataclass(frozen=True)
class ModelDesc:
    name: str
    soc_version: str
    inputs: tuple[IOSpec, ...]
    outputs: tuple[IOSpec, ...]
    dynamic_batch: tuple[int, ...]                  #: batch gears; () for a static or image-size model
    dynamic_hw: tuple[tuple[int, int], ...] = ()    #: (height, width) gears; () otherwise

    @property
    def gears(self) -> tuple[Gear, ...]:
        """The gear keys (``(None,)`` for a static model)."""
        return self.dynamic_batch or self.dynamic_hw or (None,)

    @property
    def dynamic(self) -> bool:
        return bool(self.dynamic_batch or self.dynamic_hw)

    @property
    def dynamic_input(self) -> int | None:
        """Index of ``ascend_mbatch_shape_data`` (the last input) on a model with gears."""
        return len(self.inputs) - 1 if self.dynamic else None

    @property
    def max_batch(self) -> int | None:
        return max(self.dynamic_batch) if self.dynamic_batch else None

    @property
    def largest_gear(self) -> Gear:
        """The gear with the most elements: the largest batch, the largest h*w (the first of equals)."""
        return max(self.gears, key=_gear_size) if self.dynamic else None

    def input_index(self, name: str) -> int | None:
        return next((i for i, s in enumerate(self.inputs) if s.name == name), None)

    def output_index(self, name: str) -> int | None:
        return next((i for i, s in enumerate(self.outputs) if s.name == name), None)

    @classmethod
    def from_manifest(cls, m: dict) -> "ModelDesc":
        gears = m["gears"]
        keys = [gear_key(g) for g in gears]
        hw = tuple((int(h), int(w)) for h, w in m.get("dynamic_hw") or ())
        dynamic = bool(m["dynamic_batch"] or hw)
        big = keys.index(max(keys, key=_gear_size)) if dynamic else len(gears) - 1

        def spec(io: dict, per_gear: list, shown: tuple) -> IOSpec:
            size = max(int(np.prod(d, dtype=np.int64)) for d in per_gear) * np.dtype(io["dtype"]).itemsize
            return IOSpec(io["name"], io["dtype"], shown, io.get("format", "ND"), size, tuple(zip(keys, per_gear)))
        ins = []
        for i, io in enumerate(m["inputs"]):
            if dynamic and i == len(m["inputs"]) - 1:
                per = [tuple(io["dims"])] * len(gears)
            else:
                per = [tuple(g["inputs"][i][2]) for g in gears]
            ins.append(spec(io, per, tuple(io["dims"])))
        outs = []
        for i, io in enumerate(m["outputs"]):
            per = [tuple(g["outputs"][i][2]) for g in gears]
            outs.append(spec(io, per, tuple(gears[big]["outputs"][i][2])))
        return cls(m["name"], m["soc_version"], tuple(ins), tuple(outs), tuple(m["dynamic_batch"]), hw)


def _gear_size(g: Gear) -> int:
    return g[0] * g[1] if isinstance(g, tuple) else (g or 0)
