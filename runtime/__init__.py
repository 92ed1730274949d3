import os as _os

# Ray 2.60 protects its GCS with a token (~/.ray/auth_token) but a client connecting to an explicit
# address only sends it when token mode is set explicitly, and Ray reads the mode once, when it is first
# imported: set it before any of our modules can import ray.
_os.environ.setdefault("RAY_AUTH_MODE", "token")

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
