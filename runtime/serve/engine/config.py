"""Engine limits (vLLM's scheduler and cache knobs, same names and meaning)."""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from devices.errors import InvalidParamError
from runtime.models.weights import QUANTIZATIONS

from .modes import ModeConfig
from .policies import POLICIES, make_policy

#: what a running engine takes between two steps (:meth:`runtime.serve.engine.LLMEngine.set_limits`):
#: the batch and step budget up to what it was built with, the queue bound, the scheduling policy, async
#: scheduling
LIVE_FIELDS = ("max_num_seqs", "max_num_batched_tokens", "max_queued_requests", "scheduling_policy",
               "priority_aging_s", "async_scheduling")


@dataclass(frozen=True)
class EngineConfig:
    """What one generation engine may do per step and hold at once.

    ``max_num_seqs``: sequences in the running batch; ``max_num_batched_tokens``: tokens per step
    (decodes first, prompts prefilled in chunks into what is left; must be >= ``max_num_seqs``);
    ``block_size``: tokens per KV block; ``max_model_len``: prompt + generated tokens of one request;
    ``num_gpu_blocks_override``: KV blocks to allocate (else as many as ``gpu_memory_utilization`` of
    the device's HBM leaves after weights and activations); ``max_queued_requests``: waiting requests
    beyond which new ones are refused (503); ``graphs``: decode steps replay captured graphs (one per
    batch-size bucket); ``scheduling_policy``: a name in :data:`runtime.serve.engine.policies.POLICIES`
    (``fcfs`` or ``priority``); ``priority_aging_s``: under ``priority``, seconds of waiting that make a
    request one class more urgent (``inf``: no aging); ``mode``: the scheduler mode and its knobs
    (:class:`runtime.serve.engine.modes.ModeConfig`): per step it narrows ``max_num_seqs`` /
    ``max_num_batched_tokens`` and may hold a step for more arrivals; ``enable_prefix_caching``: full KV
    blocks are cached by content and reused by later requests with the same prefix (vLLM's automatic
    prefix caching, on by default as in vLLM V1; :mod:`runtime.serve.engine.block_manager`);
    ``quantization``: how the GGUF weights sit in HBM (vLLM's ``--quantization``): ``none`` dequantised
    to float32 at load, ``gguf`` the file's Q8_0 / Q4_1 / Q4_K blocks as they are (5.6x fewer bytes for
    SmolLM2), computed on by the weight-quantized kernels;
    ``async_scheduling``: the engine thread queues the next step behind the one the device computes and
    samples greedy requests on the device (vLLM's ``async_scheduling``; :mod:`runtime.serve.engine.overlap`)."""
    max_num_seqs: int = 16
    max_num_batched_tokens: int = 256
    block_size: int = 16
    max_model_len: int = 1024
    num_gpu_blocks_override: int | None = None
    gpu_memory_utilization: float = 0.9
    max_queued_requests: int = 64
    graphs: bool = True
    scheduling_policy: str = "fcfs"
    priority_aging_s: float = 10.0
    mode: ModeConfig = field(default_factory=ModeConfig)
    enable_prefix_caching: bool = True
    quantization: str = "none"
    async_scheduling: bool = True

    def __post_init__(self):
        for k in ("max_num_seqs", "max_num_batched_tokens", "block_size", "max_model_len", "max_queued_requests"):
            v = getattr(self, k)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise InvalidParamError(f"{k} must be a positive integer, got {v!r}")
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise InvalidParamError(f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be >= "
                                    f"max_num_seqs ({self.max_num_seqs})")
        o = self.num_gpu_blocks_override
        if o is not None and (not isinstance(o, int) or isinstance(o, bool) or o < 2):
            raise InvalidParamError(f"num_gpu_blocks_override must be an integer >= 2 (block 0 is the null "
                                    f"block), got {o!r}")
        if self.scheduling_policy not in POLICIES:
            raise InvalidParamError(f"scheduling_policy {self.scheduling_policy!r} is unknown (known: "
                                    f"{', '.join(POLICIES)})")
        a = self.priority_aging_s
        if not isinstance(a, (int, float)) or isinstance(a, bool) or not (a > 0 or math.isinf(a)):
            raise InvalidParamError(f"priority_aging_s must be > 0 (inf: no aging), got {a!r}")
        if not isinstance(self.mode, ModeConfig):
            raise InvalidParamError(f"mode must be a ModeConfig, got {self.mode!r}")
        for k in ("enable_prefix_caching", "async_scheduling"):
            if not isinstance(getattr(self, k), bool):
                raise InvalidParamError(f"{k} must be true or false, got {getattr(self, k)!r}")
        if self.quantization not in QUANTIZATIONS:
            raise InvalidParamError(f"quantization must be one of {', '.join(QUANTIZATIONS)}, got {self.quantization!r}")
        u = self.gpu_memory_utilization
        if not isinstance(u, (int, float)) or isinstance(u, bool) or not 0 < u <= 1:
            raise InvalidParamError(f"gpu_memory_utilization must be in (0, 1], got {u!r}")

    def live_diff(self, other: "EngineConfig") -> tuple[list[str], list[str]]:
        """(fields that may change while the engine runs, fields that need a restart) in which ``other``
        differs from this config (``mode`` apart: :meth:`runtime.serve.engine.LLMEngine.set_mode`)."""
        diff = [f.name for f in dataclasses.fields(self) if f.name != "mode" and getattr(self, f.name) != getattr(other, f.name)]
        return [k for k in diff if k in LIVE_FIELDS], [k for k in diff if k not in LIVE_FIELDS]

    def policy(self):
        """The scheduling policy object (:mod:`.policies`)."""
        return make_policy(self.scheduling_policy, self.priority_aging_s)

    @property
    def decode_buckets(self) -> tuple[int, ...]:
        """Batch sizes a decode graph is captured for: powers of two below ``max_num_seqs``, and it."""
        out, b = [], 1
        while b < self.max_num_seqs:
            out.append(b)
            b *= 2
        return tuple(out + [self.max_num_seqs])

    def bucket(self, n: int) -> int:
        """The smallest decode bucket holding ``n`` sequences."""
        for b in self.decode_buckets:
            if b >= n:
                return b
        raise InvalidParamError(f"{n} sequences exceed max_num_seqs={self.max_num_seqs}")
