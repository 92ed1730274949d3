"""What a process sets up before it imports Ray: :func:`prepare`, called before every ``import ray`` of the
product (``tests/tools/test_layering.py`` checks that), and by ``vnpu``'s ``main``.

Ray reads its environment once, when it is first imported in a process, so whatever may be the first to
import it prepares first; nothing happens when a module is imported (``import runtime.atc`` sets nothing
and starts nothing).  A program that imports Ray itself before vnpu does calls :func:`prepare` first.
"""
from __future__ import annotations

import os

from devices.errors import AclError

from runtime import sanitize

#: the address a local cluster binds (VNPU_BIND unset): loopback
LOOPBACK = "127.0.0.1"


def prepare() -> None:
    """Set Ray's import-time environment unless the caller's environment says otherwise, and start the
    sanitizer that ``VNPU_SANITIZE`` asks for before Ray registers its exit handler.  Cheap; every call
    after the first changes nothing.  Blocks the host for nothing.

    - ``RAY_AUTH_MODE=token``: Ray protects its GCS with a token (``~/.ray/auth_token``), but a client
      connecting to an explicit address only sends it when token mode is set explicitly.
    - ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` when the cluster binds loopback (``VNPU_BIND`` unset or
      127.0.0.1): Ray resolves a 127.0.0.1 node address to the machine's external one unless it runs
      single-node, and then its GCS, raylet and workers listen on every interface.  (Multi-node clusters
      set ``VNPU_BIND=node``.)
    - the sanitizer (:func:`runtime.sanitize.from_environment`): its exit handler (leak check, report,
      error exit code) is registered before Ray's, so it runs after it, last.  A bad ``VNPU_SANITIZE``
      is reported when a runtime is made, not here.
    """
    os.environ.setdefault("RAY_AUTH_MODE", "token")
    if os.environ.get("VNPU_BIND", LOOPBACK) == LOOPBACK:
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    try:
        sanitize.from_environment()
    except AclError:
        pass
