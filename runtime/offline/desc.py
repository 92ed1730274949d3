"""What a loaded offline model looks like from outside: its inputs and outputs (names, dims, dtypes,
formats, sizes) and its dynamic batch gears -- the facts behind pyACL's ``aclmdlDesc`` getters.

Sizes are those of the LARGEST gear (``aclmdlGetInputSizeByIndex`` on a dynamic-batch model); input dims
show -1 on the dynamic batch axis; output dims are those of the largest gear, and ``dims_at(batch)``
gives any gear's (``aclmdlGetCurOutputDims``).  A dynamic-batch model has one more input, last:
``ascend_mbatch_shape_data`` (uint64 [1]) that carries the batch size, as ATC adds it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from devices.kernel import ACL_DTYPE

#: aclDataType of every dtype a model description can show (uint64: the dynamic-batch input)
ACL_DTYPES = dict(ACL_DTYPE, uint64=10)
#: aclFormat
ACL_FORMATS = {"NCHW": 0, "NHWC": 1, "ND": 2}


@dataclass(frozen=True)
class IOSpec:
    name: str
    dtype: str
    dims: tuple[int, ...]
    format: str
    size: int                                       #: bytes at the largest gear
    gear_dims: tuple[tuple[int | None, tuple[int, ...]], ...]

    @property
    def acl_dtype(self) -> int:
        return ACL_DTYPES[self.dtype]

    @property
    def acl_format(self) -> int:
        return ACL_FORMATS.get(self.format, ACL_FORMATS["ND"])

    def dims_at(self, batch: int | None) -> tuple[int, ...]:
        for b, dims in self.gear_dims:
            if b == batch:
                return dims
        return self.gear_dims[-1][1]

    def nbytes_at(self, batch: int | None) -> int:
        return int(math.prod(self.dims_at(batch))) * np.dtype(self.dtype).itemsize


@dataclass(frozen=True)
class ModelDesc:
    name: str
    soc_version: str
    inputs: tuple[IOSpec, ...]
    outputs: tuple[IOSpec, ...]
    dynamic_batch: tuple[int, ...]                  #: () for a static model

    @property
    def dynamic_input(self) -> int | None:
        """Index of ``ascend_mbatch_shape_data`` (the last input) on a dynamic-batch model."""
        return len(self.inputs) - 1 if self.dynamic_batch else None

    @property
    def max_batch(self) -> int | None:
        return max(self.dynamic_batch) if self.dynamic_batch else None

    def input_index(self, name: str) -> int | None:
        return next((i for i, s in enumerate(self.inputs) if s.name == name), None)

    def output_index(self, name: str) -> int | None:
        return next((i for i, s in enumerate(self.outputs) if s.name == name), None)

    @classmethod
    def from_manifest(cls, m: dict) -> "ModelDesc":
        gears = m["gears"]
        batches = [g["batch"] for g in gears]
        big = gears[-1] if not m["dynamic_batch"] else gears[batches.index(max(m["dynamic_batch"]))]

        def spec(io: dict, per_gear: list, shown: tuple) -> IOSpec:
            gd = tuple(zip(batches, per_gear))
            dims_big = dict(gd).get(big["batch"], per_gear[-1])
            return IOSpec(io["name"], io["dtype"], shown, io.get("format", "ND"),
                          int(np.prod(dims_big, dtype=np.int64)) * np.dtype(io["dtype"]).itemsize, gd)
        ins = []
        for i, io in enumerate(m["inputs"]):
            if m["dynamic_batch"] and i == len(m["inputs"]) - 1:
                per = [tuple(io["dims"])] * len(gears)
            else:
                per = [tuple(g["inputs"][i][2]) for g in gears]
            ins.append(spec(io, per, tuple(io["dims"])))
        outs = []
        for i, io in enumerate(m["outputs"]):
            per = [tuple(g["outputs"][i][2]) for g in gears]
            outs.append(spec(io, per, tuple(big["outputs"][i][2])))
        return cls(m["name"], m["soc_version"], tuple(ins), tuple(outs), tuple(m["dynamic_batch"]))
