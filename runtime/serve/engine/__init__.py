"""The serving engines, testable without HTTP, on one engine lifecycle (:mod:`.lifecycle`: thread,
fallback chain, re-binds, admission, shutdown): :class:`GenerateEngine` (continuous batching over a paged
KV cache in device HBM: :mod:`.scheduler`, :mod:`.block_manager`, :mod:`.kv_cache`, :mod:`.runner`; its
requests checked by :mod:`.prompts`, sampled by :mod:`.sampling`, turned into outputs by :mod:`.output`)
and :class:`EmbedEngine` (dynamic batching)."""
from .config import EngineConfig
from .embed_engine import EmbedEngine
from .errors import InvalidRequest, ModelNotFound, QueueFull, ServeError, Unavailable
from .llm_engine import EngineSnapshot, GenerateEngine
from .lifecycle import EngineLifecycle
from .request import RequestHandle, RequestOutput
from .sampling import SamplingParams

__all__ = ["EmbedEngine", "EngineConfig", "EngineLifecycle", "EngineSnapshot", "GenerateEngine", "InvalidRequest",
           "ModelNotFound", "QueueFull", "RequestHandle", "RequestOutput", "SamplingParams", "ServeError", "Unavailable"]
