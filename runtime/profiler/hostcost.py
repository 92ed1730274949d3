"""The host side of the stack on the modeled clock: what each runtime call costs on the reference chip.

The device's cost model (:mod:`devices.chip`) prices tasks; this prices the host work around them, so
that the modeled clock shows where a real program's time goes (launch, alloc, copies, sync, compute).
Like ``devices/chip.py``, every constant names its source; "assumption" marks a figure chosen where the
sources give only a range or a qualitative statement.  Pure arithmetic over a frozen spec: nothing here
blocks or touches memory.

Sources:
- [L] issue 16 / DESIGN.md ("Launch path"): on a real chip an ACL call costs 12-15 us -- parameter
  packing, queueing, doorbell -- the figure the launch path is measured against (``vnpu bench launch``).
- [M] CANN aclrtMalloc / aclrtMallocHost docs (runtimeapi aclcppdevg_03_0101 and the aclrtMalloc page):
  frequent malloc/free "causes performance deterioration; allocate in advance or manage memory
  yourself" -- each call goes to the driver (page tables, a device round trip).  PyTorch's caching
  allocator exists for the same reason (cudaMalloc/cudaFree cost tens of us and synchronize).
- [P] CANN cann_api.md S2: aclrtMemcpyAsync with pinned (aclrtMallocHost) memory is truly asynchronous;
  with pageable memory it returns only after the copy is done.  NVIDIA's "How to Optimize Data
  Transfers in CUDA" and the cudaf/malloc-test measurement: pageable copies are staged through a pinned
  bounce buffer; 208.9 ms pageable vs 86.1 ms pinned for the same transfer = 2.43x.
- [C] devices/chip.py ASCEND_910B3: PCIe Gen5 x16, ~50 GB/s effective for (pinned) copies.
"""
from __future__ import annotations

from dataclasses import dataclass

from devices.chip import ASCEND_910B3


@dataclass(frozen=True)
class HostCostSpec:
    """Host-side costs in seconds (bandwidths in B/s) of one runtime on one host."""
    #: [L] 13.5 us (the middle of 12-15 us) per launch = packing + queueing/doorbell; the split 4.5 us
    #: packing (per launch, also inside a batch) / 9 us queue + doorbell (per submitted batch) is an
    #: assumption (a task descriptor is a few hundred bytes to fill; the doorbell is an MMIO write plus
    #: the queue's lock and a completion-queue check)
    launch_pack_s: float = 4.5e-6
    submit_s: float = 9.0e-6
    #: [M] a driver allocation or free (aclrtMalloc / aclrtFree): 10 us each (assumption inside [M]'s
    #: "tens of us" for a malloc/free pair)
    malloc_s: float = 10.0e-6
    free_s: float = 10.0e-6
    #: [L] any other ACL call (create stream/event, query ...): the packing part of a call
    call_s: float = 4.5e-6
    #: a synchronize that finds the work done: the ACL call plus the completion interrupt / poll; 4 us
    #: (assumption: packing-sized call + ~0 wait; the wait itself is the device's time)
    sync_s: float = 4.0e-6
    #: [L] a memcpy call's own cost (argument checks, DMA descriptor) before the bytes move: one ACL call
    copy_call_s: float = 13.5e-6
    #: [C] pinned host memory over PCIe
    pinned_bandwidth: float = ASCEND_910B3.pcie_bandwidth
    #: [P] pageable memory: staged through a bounce buffer, 2.43x slower than pinned
    pageable_bandwidth: float = ASCEND_910B3.pcie_bandwidth / 2.43

    def launch(self) -> float:
        """One kernel launch call (its packing; the batch's doorbell is :meth:`submit`)."""
        return self.launch_pack_s

    def submit(self) -> float:
        """One batch handed to the device (queue + doorbell)."""
        return self.submit_s

    def alloc(self, name: str) -> float:
        return self.free_s if "free" in name.lower() else self.malloc_s

    def copy(self, nbytes: int, pinned: bool, asynchronous: bool) -> float:
        """A host<->device copy call: pinned async copies cost only the call (the device's copy task
        moves the bytes); synchronous or pageable ones hold the host for the transfer."""
        if pinned and asynchronous:
            return self.copy_call_s
        bw = self.pinned_bandwidth if pinned else self.pageable_bandwidth
        return self.copy_call_s + nbytes / bw

    def sync(self) -> float:
        return self.sync_s

    def call(self) -> float:
        return self.call_s


REFERENCE = HostCostSpec()
