import os as _os

# Ray 2.60 protects its GCS with a token (~/.ray/auth_token) but a client connecting to an explicit
# address only sends it when token mode is set explicitly, and Ray reads the mode once, when it is first
# imported: set it before any of our modules can import ray.
_os.environ.setdefault("RAY_AUTH_MODE", "token")
