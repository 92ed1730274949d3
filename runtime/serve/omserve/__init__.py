"""Serving compiled models (``vnpu atc`` ``.om`` files) over the Open Inference Protocol: the model
repository's models loaded as instances of the compiled-model engine
(:class:`runtime.serve.engine.om_engine.OmEngine`), routed, reloaded and counted.

- :mod:`.placement`: where each instance runs (instance groups, the next free device, the fallback chain);
- :mod:`.instances`: one model version's instances and the least-loaded router in front of them;
- :mod:`.stats`: Triton's statistics of a model version;
- :mod:`.records`: a model's configuration as the protocol's records;
- :mod:`.view`: :class:`CompiledModels`, the :class:`~runtime.serve.v2.repository.ModelRepositoryView` the
  server serves (index, metadata, config, readiness, inference, hot load and unload, statistics).
"""
from .placement import InstancePlacement, compiled_needs, place_compiled
from .stats import VersionStats
from .view import CompiledModels

__all__ = ["CompiledModels", "InstancePlacement", "VersionStats", "compiled_needs", "place_compiled"]
