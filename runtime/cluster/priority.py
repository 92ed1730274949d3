"""The CPU priority (niceness) the device processes of a cluster run at.

Ray starts every worker process at niceness 15 (its ``worker_niceness`` setting, default 15: the core
worker calls ``nice(15)`` when it starts), so a device actor -- the process that runs every kernel --
would get the CPU only after everything else on the machine.  vnpu's clusters run their device
processes at niceness :data:`DEFAULT_NICENESS` (0, the priority of the process that started the cluster)
unless told otherwise:

- ``ClusterSpec(device_niceness=N)``, ``metadata: {vnpu: {device_niceness: N}}`` in cluster.yaml, or the
  environment variable ``VNPU_DEVICE_NICENESS=N`` of the process that starts the cluster (in that order);
- ``N`` in ``[0, 19]`` (absolute): a higher number yields the CPU to other processes.  Below 0 (more
  than normal priority) needs ``CAP_SYS_NICE`` and is refused here.

How: the raylet passes ``RAY_worker_niceness=K`` on to the workers it starts (Ray reads its settings from
``RAY_<name>`` variables), so the worker's own ``nice()`` call adds K (N less the starting process's own
niceness) instead of 15 -- unprivileged, since it never lowers niceness below the raylet's.  A device started in a Ray that vnpu did not start (one
the process was already connected to, ``ray start`` nodes) then sets its own priority when it starts
(:func:`driver.host`), which can only raise niceness unless the process holds ``CAP_SYS_NICE``; what a
device really runs at is in its ``where()`` (``niceness``, read from ``/proc``: :func:`devices.procstat.niceness`).

Plain arithmetic on the environment; blocks nothing.
"""
from __future__ import annotations

import os

from devices.errors import InvalidParamError

#: niceness of a device process unless configured (the starting process's own priority)
DEFAULT_NICENESS = 0
#: the environment variable that configures it
ENV = "VNPU_DEVICE_NICENESS"
#: the Ray setting (read from the environment by every Ray process) that the raylet's workers apply
RAY_ENV = "RAY_worker_niceness"


def check(n, where: str = "device_niceness") -> int:
    """``n`` as a niceness a device may be configured to (InvalidParamError naming ``where`` otherwise)."""
    if isinstance(n, bool) or not isinstance(n, int):
        try:
            n = int(str(n).strip())
        except ValueError:
            raise InvalidParamError(f"{where} must be an integer niceness in [0, 19], got {n!r}") from None
    if not 0 <= n <= 19:
        raise InvalidParamError(f"{where} must be in [0, 19] (below 0 needs CAP_SYS_NICE), got {n}")
    return n


def resolve(n: int | None) -> int:
    """The niceness to run devices at: ``n`` when given, else ``$VNPU_DEVICE_NICENESS``, else 0."""
    if n is not None:
        return check(n)
    env = os.environ.get(ENV, "").strip()
    return check(env, ENV) if env else DEFAULT_NICENESS


def raylet_env(n: int) -> dict[str, str]:
    """The environment a raylet started by this process needs so that the workers it starts run at
    niceness ``n`` (its workers inherit this process's niceness, then add the setting)."""
    return {RAY_ENV: str(max(0, check(n) - os.getpriority(os.PRIO_PROCESS, 0)))}


__all__ = ["DEFAULT_NICENESS", "ENV", "RAY_ENV", "check", "resolve", "raylet_env"]
