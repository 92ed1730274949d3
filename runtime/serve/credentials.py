"""THE place where the server's device credential is configured.

A server is ONE tenant of the devices: every device call it (or one of its Ray Serve replicas) makes
carries this credential; its own HTTP clients are told apart by the server itself
(:mod:`runtime.serve.tenants`), never by the devices.

The credential is a tenant credential (:mod:`driver.credentials`; ``vnpu token create --tenant serve``)
given to the server as ``VNPU_TENANT_TOKEN`` -- the devices then account everything the server allocates
to that tenant, check its quotas and release what it holds if it dies -- or, when none is given, the
cluster token (the admin's: fine on a developer's own cluster, not what a shared one should run with).
It is what :func:`runtime.cluster.discovery.load_token` returns, i.e. the same credential the server's own
runtime presents; :func:`replica_env` hands it to Ray Serve replicas (in the replicas' ``runtime_env``, as
the embedded cluster hands the cluster token to its workers).  Nothing else in ``runtime/serve`` reads a
credential.
"""
from __future__ import annotations

#: the environment variables a process reads its device credential from (tenant credential / cluster token)
TENANT_ENV, CLUSTER_ENV = "VNPU_TENANT_TOKEN", "VNPU_TOKEN"


def device_credential() -> str:
    """The credential this server presents to the devices (raises the runtime's no-device error when there
    is no cluster to talk to)."""
    from runtime.cluster.discovery import load_token
    return load_token()


def is_tenant_credential(cred: str) -> bool:
    from driver.credentials import is_credential
    return is_credential(cred)


def replica_env() -> dict[str, str]:
    """Environment variables that give a Ray Serve replica the server's device credential."""
    cred = device_credential()
    return {TENANT_ENV: cred} if is_tenant_credential(cred) else {CLUSTER_ENV: cred}
