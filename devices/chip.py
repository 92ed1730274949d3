"""Chip specs and the roofline cost model that gives every task a modeled device duration.

Nothing here blocks or touches memory: it is arithmetic over a frozen :class:`ChipSpec`.

Sources and assumptions for ``ASCEND_910B3`` (an Ascend 910B-class training part):
- 20 AI Cores (Cube) and 40 Vector cores: the 910B3 configuration reported by ``npu-smi`` / DCMI
  (``ACL_DEV_ATTR_AICORE_CORE_NUM`` / ``VECTOR_CORE_NUM``); 24 on 910B2.
- Cube throughput: ~313 TFLOP/s fp16 dense is the public figure for the 910B family; fp32 matmuls run
  through the Cube at a quarter of that (assumption, as HF32-off fp32 on comparable cubes).
- Cube INT8 throughput: twice the fp16 rate.  Huawei's Hot Chips 31 (2019) talk on the Da Vinci core gives
  the Cube as 4096 fp16 MACs + 8192 int8 MACs per cycle, and the Ascend 910 as 256 TFLOPS fp16 / 512 TOPS
  int8 (huawei.com product page of the time); the 910B-class and 310P figures keep that 2:1 ratio
  (assumption).  Weight-quantized matmuls (int8 per-channel, GGUF Q8_0 / Q4_1 / Q4_K) are priced at this
  rate over the bytes of their quantized weights.
- Vector throughput: assumed 1/16 of fp16 Cube (a Vector core does 128 fp16 lanes/cycle at ~1.8 GHz).
- HBM: 64 GB HBM2e at ~1.6 TB/s (four stacks), per public datasheets; the emulated arena is smaller.
- Host link: PCIe Gen5 x16, ~64 GB/s raw, ~50 GB/s effective for copies (assumption).
- Device link: HCCS, 7 links x 56 GB/s on an 8-card board (public figure); one peer link modeled.
- Launch: ~5 us device-side per kernel (the host-side runtime cost of ~12-15 us is what the launch
  benchmark measures for real; this is only the device's own dispatch).
- Power/thermal: 400 W TDP, ~90 W idle, ambient 35 C, +0.12 C/W at steady state (assumptions that land
  the idle/busy readings near the npu-smi samples in the reference).
- Thermal limits (``temp_throttle_c`` / ``temp_alarm_c`` / ``temp_critical_c``): 85 / 95 / 105 C.
  Huawei publishes no die-temperature limits for the 910B; these follow the shape of public accelerator
  datasheets (Cambricon MLU290-M5 product manual 4.3.4.2: power reduced in steps from 97 C, THERMTRIP
  shutdown at 100 C; ``nvidia-smi -q`` likewise lists a "Slowdown Temp" below the "Shutdown Temp") with
  85 C as the point the part is run throttled (also the ``thermal`` trigger of the serve config's
  self-healing example) and 95 / 105 C as npu-smi's Alarm / Critical health (assumptions).
- DVPP (the media engine: JPEG decoder, VPC, JPEG encoder, PNG decoder) is priced by its own pixel rate,
  not AI Core time.  CANN's "Performance Specifications" of media data processing (hiascend.com, CANN
  8.0.0 aclcppdevg_03_0356 JPEGD and aclcppdevg_03_0338 VPC; CANN 8.5 aclpythondevg_01_0430 VPC): one
  JPEGD channel decodes 1080p at 128 FPS (Atlas 200/300/500 = Ascend 310, and per channel on the Atlas
  training and inference series), one VPC channel processes 1080p -> 1080p YUV420SP at 360 FPS.  One
  stream is one channel here: ``dvpp_jpegd_px_s`` = 1920 x 1080 x 128, ``dvpp_vpc_px_s`` = 1920 x 1080 x
  360 pixels/s.  JPEGE and PNGD have no figure beside those: JPEGE is taken at the JPEGD rate, PNGD
  (software-like decode on the device's CPU) at 1/8 of it (assumptions).  VDEC: one channel decodes
  1080p H.264 / H.265 at 240 FPS (CANN 8.5 aclcppdevg_03_0687, Atlas inference products, n x 240 FPS for
  n <= 12 channels); VENC is taken at 1080p 60 FPS per channel (assumption: no per-channel figure found).
- Saturation: ``saturation_util_pct`` = 90 % AI Core busy -- the point where an M/M/1 queue's wait is
  9x the service time (rho / (1 - rho)); above it latency grows faster than load (queueing theory, not a
  datasheet figure).
"""
from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class ChipSpec:
    """Static description of one NPU model."""
    name: str                      #: SoC name as ``acl.get_soc_name()`` reports it
    short_name: str                #: npu-smi "Name" column
    ai_cores: int                  #: AI Core (Cube) count: also the emulator's worker-thread count
    vector_cores: int
    cube_flops_fp16: float         #: FLOP/s, whole chip
    cube_flops_fp32: float
    cube_ops_int8: float           #: OP/s, whole chip (weight-quantized matmuls)
    vector_flops: float            #: FLOP/s, whole chip
    hbm_bytes: int                 #: nominal HBM of the real part (the arena is configured separately)
    hbm_bandwidth: float           #: B/s
    pcie_bandwidth: float          #: B/s, host <-> device copies
    link_bandwidth: float          #: B/s, device <-> device (HCCS) per peer
    link_latency_s: float          #: per message
    launch_cost_s: float           #: device-side dispatch per task
    tdp_w: float
    idle_w: float
    ambient_c: float
    c_per_w: float
    max_streams: int = 1984
    max_events: int = 65536
    temp_throttle_c: float = 85.0  #: die temperature from which the part is run throttled
    temp_alarm_c: float = 95.0     #: npu-smi health Alarm at or above this
    temp_critical_c: float = 105.0  #: npu-smi health Critical at or above this
    saturation_util_pct: float = 90.0  #: AI Core utilization (%) from which queueing dominates latency
    dvpp_jpegd_px_s: float = 1920 * 1080 * 128.0   #: JPEG decode, output pixels/s per channel (see above)
    dvpp_jpege_px_s: float = 1920 * 1080 * 128.0   #: JPEG encode, input pixels/s (assumption: the JPEGD rate)
    dvpp_vpc_px_s: float = 1920 * 1080 * 360.0     #: VPC resize/crop/convert, pixels/s of the larger picture
    dvpp_pngd_px_s: float = 1920 * 1080 * 16.0     #: PNG decode, output pixels/s (assumption)
    dvpp_vdec_px_s: float = 1920 * 1080 * 240.0    #: video decode, pixels/s per channel (see above)
    dvpp_venc_px_s: float = 1920 * 1080 * 60.0     #: video encode, pixels/s per channel (assumption)


ASCEND_910B3 = ChipSpec(
    name="Ascend910B3", short_name="910B3", ai_cores=20, vector_cores=40,
    cube_flops_fp16=313e12, cube_flops_fp32=313e12 / 4, cube_ops_int8=2 * 313e12, vector_flops=313e12 / 16,
    hbm_bytes=64 << 30, hbm_bandwidth=1.6e12, pcie_bandwidth=50e9, link_bandwidth=56e9,
    link_latency_s=2e-6, launch_cost_s=5e-6, tdp_w=400.0, idle_w=90.0, ambient_c=35.0, c_per_w=0.12,
)

#: A smaller inference part (Atlas 300I-class); figures scaled from public 310P3 numbers (assumption).
ASCEND_310P3 = ChipSpec(
    name="Ascend310P3", short_name="310P3", ai_cores=8, vector_cores=7,
    cube_flops_fp16=140e12, cube_flops_fp32=140e12 / 4, cube_ops_int8=2 * 140e12, vector_flops=140e12 / 16,
    hbm_bytes=24 << 30, hbm_bandwidth=204.8e9, pcie_bandwidth=25e9, link_bandwidth=25e9,
    link_latency_s=5e-6, launch_cost_s=8e-6, tdp_w=72.0, idle_w=15.0, ambient_c=35.0, c_per_w=0.35,
    max_streams=1024, max_events=1023,
)

CHIPS: dict[str, ChipSpec] = {c.name: c for c in (ASCEND_910B3, ASCEND_310P3)}


def chip_by_name(name: str) -> ChipSpec:
    """Look a spec up by SoC name (``Ascend910B3``) or short name (``910B3``)."""
    for spec in CHIPS.values():
        if name in (spec.name, spec.short_name):
            return spec
    raise KeyError(f"unknown chip {name!r}; known: {sorted(CHIPS)}")


@dataclass(frozen=True)
class Work:
    """What a task does, for the cost model: floating-point ops and HBM bytes moved."""
    flops: float = 0.0
    bytes: float = 0.0
    unit: str = "vector"           #: "cube" | "vector" | "dma" | "host" | "link" | a DVPP engine (DVPP_UNITS)
    fp16: bool = False
    pixels: float = 0.0            #: pixels a DVPP engine processes (its units only)
    int8: bool = False             #: a cube task on quantized weights: priced at the INT8 rate


#: the DVPP engines a kernel may run on (:attr:`KernelDef.unit` / :attr:`Work.unit`), each with its own
#: pixel rate in :class:`ChipSpec`
DVPP_UNITS = ("dvpp_jpegd", "dvpp_jpege", "dvpp_vpc", "dvpp_pngd", "dvpp_vdec", "dvpp_venc")


class CostModel:
    """Roofline durations in seconds of modeled device time."""

    def __init__(self, spec: ChipSpec):
        self.spec = spec

    def kernel(self, work: Work, block_dim: int) -> float:
        """A kernel of ``block_dim`` blocks: launch + max(compute on the used cores, HBM traffic)."""
        s = self.spec
        if work.unit in DVPP_UNITS:
            return self.dvpp(work)
        used = max(1, min(block_dim, s.ai_cores))
        waves = math.ceil(max(1, block_dim) / s.ai_cores)
        if work.unit == "cube":
            tput = s.cube_ops_int8 if work.int8 else s.cube_flops_fp16 if work.fp16 else s.cube_flops_fp32
        else:
            tput = s.vector_flops
        per_core = tput / s.ai_cores
        t_compute = work.flops / (per_core * used) if work.flops else 0.0
        # with fewer blocks than cores, the kernel also gets only part of the bandwidth
        t_mem = work.bytes / (s.hbm_bandwidth * min(1.0, used / s.ai_cores * 2)) if work.bytes else 0.0
        return s.launch_cost_s + max(t_compute, t_mem) * (waves if block_dim > s.ai_cores else 1)

    def dvpp(self, work: Work) -> float:
        """A DVPP task: launch + its pixels at its engine's rate (the AI Cores are not used)."""
        rate = getattr(self.spec, work.unit + "_px_s")
        return self.spec.launch_cost_s + work.pixels / rate

    def host_copy(self, nbytes: int) -> float:
        """H2D or D2H over PCIe."""
        return self.spec.launch_cost_s + nbytes / self.spec.pcie_bandwidth

    def device_copy(self, nbytes: int) -> float:
        """D2D inside one device's HBM (read + write)."""
        return self.spec.launch_cost_s + 2 * nbytes / self.spec.hbm_bandwidth

    def collective(self, op: str, algo: str, n: int, nbytes: int) -> float:
        """Alpha-beta model of one collective over ``n`` ranks (``nbytes`` as HCCL counts the buffer).

        Bandwidth terms follow nccl-tests' bus-bandwidth factors; latency terms count the algorithm's
        sequential steps (ring: 2(n-1) for AllReduce, hd: 2 log2 n, mesh: 2 rounds)."""
        s = self.spec
        if n <= 1:
            return s.launch_cost_s
        alpha, bw = s.link_latency_s, s.link_bandwidth
        log = max(1, (n - 1).bit_length())
        steps = {"ring": n - 1, "hd": log, "mesh": 1}.get(algo, n - 1)
        if op == "allreduce":
            factor, steps = 2 * (n - 1) / n, 2 * steps
        elif op in ("allgather", "reducescatter", "alltoall"):
            factor = (n - 1) / n * (n if op == "allgather" else 1)
        elif op in ("broadcast", "reduce", "send", "recv"):
            factor, steps = 1.0, 1
        else:   # barrier
            factor, steps = 0.0, 2
        if algo == "mesh":   # every peer link is used at once
            bw = bw * (n - 1) if op not in ("send", "recv") else bw
            factor = factor if op != "allreduce" else 2 * (n - 1) / n
        return s.launch_cost_s + steps * alpha + factor * nbytes / bw

    def link_transfer(self, nbytes: int) -> float:
        """One message over a device-to-device link (alpha-beta)."""
        return self.spec.link_latency_s + nbytes / self.spec.link_bandwidth
