"""The cluster side of the runtime: where the devices are and how they are kept working.

- :mod:`.discovery`: the cluster's state directory, token and device actors;
- :mod:`.remote`: the cluster backend (driver clients of device actors);
- :mod:`.local`: lifecycle of the local cluster (``vnpu up``/``down``) and of embedded ones;
- :mod:`.failover`: logical -> physical device binding, health, spares, CPU fallback;
- :mod:`.jobrunner`: exactly-once request replay over a device pool;
- :mod:`.chaos`: seeded fault campaigns;
- :mod:`.rayenv`: what a process sets up before it imports Ray (every import of Ray follows its ``prepare``).
"""
from .discovery import attach_ray, discover, load_token, read_state, state_dir
from .local import (ClusterSpec, LocalCluster, cluster_down, cluster_runtime, cluster_up, remove_segments,
                    running_state, spec_from_yaml, start_devices, stop_devices)

__all__ = ["ClusterSpec", "LocalCluster", "attach_ray", "cluster_down", "cluster_runtime", "cluster_up",
           "discover", "load_token", "read_state", "remove_segments", "running_state", "spec_from_yaml", "start_devices",
           "state_dir", "stop_devices"]
