"""THE place where the server's device credential is configured.

A server is ONE tenant of the devices: every device call it (or one of its Ray Serve replicas) makes
carries this credential; its own HTTP clients are told apart by the server itself
(:mod:`runtime.serve.tenants`), never by the devices.

Today the credential is the cluster token (``VNPU_TOKEN``, or the token file of ``vnpu up`` -- what
:func:`runtime.cluster.discovery.load_token` reads).  When per-tenant device credentials land (issue 11:
tenant credentials for device clients in ``driver/`` and ``runtime/cluster/remote.py``), this module is
what changes: :func:`device_credential` returns the server's own tenant credential and
:func:`replica_env` hands it to replicas; nothing else in ``runtime/serve`` reads a token.
"""
from __future__ import annotations

#: the environment variable a replica process reads its device credential from
CREDENTIAL_ENV = "VNPU_TOKEN"


def device_credential() -> str:
    """The credential this server presents to the devices (raises the runtime's no-device error when there
    is no cluster to talk to)."""
    from runtime.cluster.discovery import load_token
    return load_token()


def replica_env() -> dict[str, str]:
    """Environment variables that give a Ray Serve replica the server's device credential."""
    return {CREDENTIAL_ENV: device_credential()}
