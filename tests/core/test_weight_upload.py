"""Weights joined in their device slot (runtime.models.common.Joined): q|k|v rows and gate|up stacks are
written part by part at their offsets of one allocation, so the host never builds the joined array.

- the slot holds exactly np.concatenate / np.stack of the parts (read back bit-equal), beside a plain
  array in the same block, and the block is ONE allocation of the pool;
- parts that do not join (dtype, trailing shape, stack shapes) are refused with the CANN parameter code
  before anything is allocated;
- an upload that fails half-way (an uncorrectable ECC error under the second part's bytes) raises the
  device's code and frees its block: the pool's allocated bytes are back where they were.

In-process device, a few KiB: well under a second.
"""
from __future__ import annotations

import numpy as np
import pytest

from devices.arena import ptr_offset
from devices.device import DeviceConfig
from devices.errors import ACL_ERROR_RT_HBM_MULTI_BIT_ECC_ERROR, AclError, InvalidParamError
from runtime.api import Runtime
from runtime.backend import LocalBackend
from runtime.models.common import Joined, upload_block


@pytest.fixture(scope="module")
def dev():
    rt = Runtime(LocalBackend(1, DeviceConfig(arena_bytes=16 << 20)))
    try:
        yield rt.device(0)
    finally:
        rt.close()


def parts(seed: int):
    r = np.random.default_rng(seed)
    return [r.standard_normal((n, 24)).astype(np.float32) for n in (8, 3, 3)]


def test_joined_slots_hold_the_concatenation_and_the_stack(dev):
    q, k, v = parts(1)
    g, u = parts(2)[:1] * 2
    u = u + 1.0
    norm = np.arange(24, dtype=np.float32)
    before, n0 = dev.memory_allocated(), dev.memory_stats()["allocation.all.current"]
    b = upload_block(dev, {"an": norm, "wqkv": Joined.rows([q, k, v]), "wgu": Joined.stack([g, u])})
    try:
        assert b["wqkv"].shape == (14, 24) and b["wgu"].shape == (2, 8, 24)
        assert b.size == 128 + 14 * 96 + 2 * 8 * 96     # entries 64-byte aligned (norm: 96 -> 128 B), nothing else
        assert dev.memory_stats()["allocation.all.current"] == n0 + 1   # one allocation for the block
        assert dev.memory_allocated() - before >= b.size
        assert b["wqkv"].numpy().tobytes() == np.concatenate([q, k, v]).tobytes()
        assert b["wgu"].numpy().tobytes() == np.stack([g, u]).tobytes()
        assert b["an"].numpy().tobytes() == norm.tobytes()
    finally:
        b.free()
    assert dev.memory_allocated() == before


@pytest.mark.parametrize("make", [
    lambda: Joined.rows([np.zeros((2, 4), np.float32), np.zeros((2, 4), np.uint8)]),
    lambda: Joined.rows([np.zeros((2, 4), np.float32), np.zeros((2, 5), np.float32)]),
    lambda: Joined.stack([np.zeros((2, 4), np.float32), np.zeros((3, 4), np.float32)]),
    lambda: Joined.rows([]),
])
def test_parts_that_do_not_join_are_refused_before_any_allocation(dev, make):
    before = dev.memory_allocated()
    with pytest.raises(InvalidParamError) as ei:
        upload_block(dev, {"w": make()})
    assert "parts" in str(ei.value)
    assert dev.memory_allocated() == before


def test_an_upload_failing_half_way_frees_its_block(dev):
    q, k, v = parts(3)
    arrays = {"wqkv": Joined.rows([q, k, v])}
    before = dev.memory_allocated()
    probe = upload_block(dev, arrays)             # where the pool puts this block (it caches the segment)
    at = ptr_offset(probe["wqkv"].ptr) + q.nbytes  # the first byte of part k
    probe.free()
    h = dev.handle
    h.inject_fault("ecc", offset=at, length=4)
    try:
        with pytest.raises(AclError) as ei:
            upload_block(dev, arrays)
        assert ei.value.code == ACL_ERROR_RT_HBM_MULTI_BIT_ECC_ERROR
        assert dev.memory_allocated() == before
    finally:
        h.clear_fault("ecc")
    b = upload_block(dev, arrays)                 # the same slot uploads whole once the range is clean
    try:
        assert b["wqkv"].numpy().tobytes() == np.concatenate([q, k, v]).tobytes()
    finally:
        b.free()
    assert dev.memory_allocated() == before
