"""Compiled models to serve: a model repository in Triton's layout (``DIR/<name>/<version>/model.om`` plus
an optional ``DIR/<name>/config.yaml``) or a single ``.om``, each model's configuration (Triton's model
configuration fields for platform ``vnpu_om``, plus vnpu's ``min_batch`` and ``fallback``) completed from
and checked against its ``.om``.

- :mod:`.spec`: the configuration as frozen dataclasses (:class:`ModelConfig`, :class:`DynamicBatching`,
  :class:`QueuePolicy`, :class:`InstanceGroup`, :class:`VersionPolicy`, :class:`TensorSpec`);
- :mod:`.config`: ``config.yaml`` read key by key (errors name the file and line);
- :mod:`.omfile`: what an ``.om`` says about serving it; auto-complete of a configuration from it;
- :mod:`.repository`: the scan (versions, READY/UNAVAILABLE with the reason, the repository index);
- :mod:`.datatypes`: the v2 / Triton / numpy names of tensor types.

Nothing here touches a device; scanning reads the files.
"""
from .config import CONFIG_FILE, ParsedConfig, load_model_config, parse_model_config
from .datatypes import triton_data_type, v2_datatype
from .omfile import OmInfo, batch_gears, complete, derive, read_om_info
from .repository import (MODEL_FILE, READY, UNAVAILABLE, IndexEntry, ModelVersion, Repository, RepoModel,
                         scan_model, scan_repository, single_model)
from .spec import (DynamicBatching, InstanceGroup, ModelConfig, ModelConfigError, QueuePolicy, TensorSpec,
                   VersionPolicy)

__all__ = ["CONFIG_FILE", "DynamicBatching", "IndexEntry", "InstanceGroup", "MODEL_FILE", "ModelConfig",
           "ModelConfigError", "ModelVersion", "OmInfo", "ParsedConfig", "QueuePolicy", "READY", "Repository",
           "RepoModel", "TensorSpec", "UNAVAILABLE", "VersionPolicy", "batch_gears", "complete", "derive",
           "load_model_config", "parse_model_config", "read_om_info", "scan_model", "scan_repository",
           "single_model", "triton_data_type", "v2_datatype"]
