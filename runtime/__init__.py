import os as _os

# Ray 2.60 protects its GCS with a token (~/.ray/auth_token) but a client connecting to an explicit
# address only sends it when token mode is set explicitly, and Ray reads the mode once, when it is first
# imported: set it before any of our modules can import ray.
_os.environ.setdefault("RAY_AUTH_MODE", "token")

# A local cluster binds loopback (VNPU_BIND unset or 127.0.0.1): Ray resolves a 127.0.0.1 node address to the
# machine's external one unless it runs single-node, and then its GCS, raylet and workers listen on every
# interface.  Ray reads this once, at import, like the auth mode.  (Multi-node clusters set VNPU_BIND=node.)
if _os.environ.get("VNPU_BIND", "127.0.0.1") == "127.0.0.1":
    _os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

# A sanitizer asked for in the environment (VNPU_SANITIZE, see runtime.sanitize) is set up when the runtime
# package is first imported, before Ray or anything else registers exit handlers: its own exit handler
# (leak check, report, error exit code) then runs last.  A bad value is reported when a runtime is made.
if _os.environ.get("VNPU_SANITIZE", "").strip() not in ("", "0"):
    from devices.errors import AclError as _AclError

    from .sanitize import from_environment as _sanitizer_from_environment
    try:
        _sanitizer_from_environment()
    except _AclError:
        pass
