"""The serving engines, testable without HTTP: :class:`GenerateEngine` (continuous batching over a
paged KV cache in device HBM: :mod:`.scheduler`, :mod:`.block_manager`, :mod:`.kv_cache`,
:mod:`.runner`) and :class:`EmbedEngine` (dynamic batching)."""
from .config import EngineConfig
from .embed_engine import EmbedEngine
from .errors import InvalidRequest, ModelNotFound, QueueFull, ServeError, Unavailable
from .llm_engine import EngineSnapshot, GenerateEngine
from .request import RequestHandle, RequestOutput, SamplingParams

__all__ = ["EmbedEngine", "EngineConfig", "EngineSnapshot", "GenerateEngine", "InvalidRequest", "ModelNotFound",
           "QueueFull", "RequestHandle", "RequestOutput", "SamplingParams", "ServeError", "Unavailable"]
