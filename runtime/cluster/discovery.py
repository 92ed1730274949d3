"""Where the vnpu cluster is: its state directory, token, Ray address and device actors.

State lives in ``$VNPU_HOME`` (default ``~/.vnpu``): ``cluster.json`` (Ray address, devices, temp dir),
``token`` (the cluster token, mode 0600: the cluster's secret and the admin's credential),
``revoked.json`` (revoked tenant credentials, read by devices when they start) and ``kernels/`` (the
kernel packages installed on this node, loaded by devices when they start).  Discovery goes through
Ray (named actors ``npu<id>`` in the ``vnpu`` namespace); after that every call is gRPC straight to the
device actors.

Which credential a runtime presents (:func:`load_token`): a tenant credential when it is given one
(``$VNPU_TENANT_TOKEN``, or ``$VNPU_TOKEN`` holding a tenant credential), else the cluster token.
"""
from __future__ import annotations

import json
import os
import secrets
from pathlib import Path

from devices.errors import ACL_ERROR_RT_NO_DEVICE, AclError
from driver.credentials import is_credential
from driver.host import ACTOR_PREFIX, NAMESPACE

from . import rayenv
from .rayenv import LOOPBACK


def state_dir() -> Path:
    return Path(os.environ.get("VNPU_HOME", "~/.vnpu")).expanduser()


def state_file() -> Path:
    return state_dir() / "cluster.json"


def token_file() -> Path:
    return state_dir() / "token"


def new_token() -> str:
    d = state_dir()
    d.mkdir(mode=0o700, parents=True, exist_ok=True)
    tok = secrets.token_urlsafe(32)
    fd = os.open(token_file(), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(tok)
    os.chmod(token_file(), 0o600)
    return tok


def revocations_file() -> Path:
    return state_dir() / "revoked.json"


def kernel_dir() -> Path:
    """This node's kernel package directory (``vnpu kernels install``; every device started here loads it)."""
    return state_dir() / "kernels"


def load_token() -> str:
    """The credential this process presents to devices: ``$VNPU_TENANT_TOKEN``, else ``$VNPU_TOKEN`` (a
    tenant credential or the cluster token), else the cluster token of the local cluster's state."""
    tok = os.environ.get("VNPU_TENANT_TOKEN") or os.environ.get("VNPU_TOKEN")
    if tok:
        return tok
    return admin_token()


def tenant_credential() -> str | None:
    """The tenant credential this process presents (``$VNPU_TENANT_TOKEN``, or ``$VNPU_TOKEN`` holding one),
    or None: it acts as the cluster's admin."""
    tok = os.environ.get("VNPU_TENANT_TOKEN")
    if tok:
        return tok
    tok = os.environ.get("VNPU_TOKEN")
    return tok if tok and is_credential(tok) else None


def admin_token() -> str:
    """The cluster token (what mints and revokes tenant credentials): ``$VNPU_TOKEN`` unless it holds a
    tenant credential, else the local cluster's token file."""
    tok = os.environ.get("VNPU_TOKEN")
    if tok and not is_credential(tok):
        return tok
    try:
        return token_file().read_text().strip()
    except FileNotFoundError:
        raise AclError("no cluster token: is a vnpu cluster up? (vnpu up)", code=ACL_ERROR_RT_NO_DEVICE) from None


def read_state() -> dict | None:
    try:
        return json.loads(state_file().read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def attach_ray() -> None:
    """Connect this process to the vnpu cluster's Ray (no-op inside a Ray worker)."""
    rayenv.prepare()
    import ray
    if ray.is_initialized():
        return
    st = read_state()
    if st is None:
        raise AclError("no vnpu cluster is up: run `vnpu up` (or use the embedded default)",
                       code=ACL_ERROR_RT_NO_DEVICE)
    ray.init(address=st["ray_address"], namespace=NAMESPACE, logging_level="ERROR",
             log_to_driver=False, _node_ip_address=LOOPBACK)


def discover() -> list[dict]:
    """Where every device actor of the cluster is (sorted by physical id)."""
    rayenv.prepare()
    import ray
    names = [a["name"] if isinstance(a, dict) else a
             for a in ray.util.list_named_actors(all_namespaces=True)
             if not isinstance(a, dict) or a.get("namespace") == NAMESPACE]
    names = sorted(n for n in names if n.startswith(ACTOR_PREFIX) and n[len(ACTOR_PREFIX):].isdigit())
    handles = [ray.get_actor(n, namespace=NAMESPACE) for n in names]
    where = ray.get([h.where.remote() for h in handles], timeout=60)
    return sorted(where, key=lambda w: w["device_id"])


def running_devices() -> list[dict]:
    """The running devices an admin command reaches: from Ray when this process is attached to the cluster,
    else from the local cluster's state (``[]`` when none is up)."""
    import sys
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        return discover()
    return list((read_state() or {}).get("where", []))


def push(where: list[dict], secret: str, client_id: str, call) -> list[tuple[dict, AclError]]:
    """Admin: ``call(device)`` on each device of ``where`` (a :class:`driver.client.RemoteDevice` per device,
    presenting ``secret``, closed after the call; host-blocking, 10 s per call at most).  Returns the devices
    not reached, with their errors."""
    from driver.client import RemoteDevice
    failed = []
    for w in where:
        try:
            d = RemoteDevice(w["address"], secret, int(w["device_id"]), timeout_s=10.0, same_node=False,
                             client_id=client_id)
            try:
                call(d)
            finally:
                d.close()
        except AclError as e:
            failed.append((w, e))
    return failed
