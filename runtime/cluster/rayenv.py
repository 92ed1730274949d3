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


def ensure_token() -> None:
    """Make sure Ray's cluster token exists, readable by this user only, before a GCS starts.

    :func:`prepare` runs Ray in token mode and a GCS without a token dies at start.  ``ray.init()`` makes
    ``~/.ray/auth_token`` when there is none, with the process umask (0644 on most machines: every user
    of the machine could read the secret that lets a client into the cluster); ``ray.cluster_utils``
    does not make one at all.  So every vnpu cluster start makes it here first, as Ray would but mode
    0600 in a 0700 directory, and narrows an existing token's mode to 0600 (its contents stay).  Nothing
    happens when token mode is off.  Blocks the host for one small file write."""
    prepare()
    if os.environ.get("RAY_AUTH_MODE") != "token":
        return
    from ray._private.authentication.authentication_token_generator import generate_new_authentication_token
    path = os.path.join(os.path.expanduser("~"), ".ray", "auth_token")
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        st = os.stat(path)
        if st.st_uid == os.getuid() and st.st_mode & 0o077:
            os.chmod(path, 0o600)
        return
    with os.fdopen(fd, "w") as f:
        f.write(generate_new_authentication_token())
