"""What ``vnpu run`` and ``vnpu serve`` check before they start a cluster or load weights, so that a job
that cannot run fails in a second, not after the cluster started: that the model splits over the devices
asked for (its shape from the weights' header, :func:`runtime.models.model_splits`), that those devices
exist where the job will run, and that the server's port is free.  Each failure is a usage error (exit 2,
one line) that says what to do instead.

Blocking: reads a model header (milliseconds), one TCP connect to the running cluster's Ray (at most 1 s),
one throw-away socket bind.
"""
from __future__ import annotations

import errno
import os
import socket

from runtime.cliargs import fail


def _either(values) -> str:
    """``3``, ``2 or 4``, ``2, 3 or 6``."""
    v = [str(x) for x in values]
    return v[0] if len(v) == 1 else f"{', '.join(v[:-1])} or {v[-1]}"


def devices_available() -> tuple[int, str] | None:
    """(device count, where) of the devices a job will find when that is fixed before it starts: the
    in-process devices (``VNPU_BACKEND=local``) or the running cluster's; None when the job starts an
    embedded cluster of the size it asks for."""
    if os.environ.get("VNPU_BACKEND", "") == "local":
        try:
            return int(os.environ.get("VNPU_DEVICES", "4")), "the in-process devices (VNPU_BACKEND=local, VNPU_DEVICES)"
        except ValueError:
            return None                        # the backend reports a bad VNPU_DEVICES itself
    from runtime.cluster import running_state
    st = running_state()
    if st is None:
        return None
    return int(st["devices"]), f"the running cluster at {st['ray_address']} (vnpu up)"


def check_split(model: str, parallel: str, n: int, prog: str, modes: tuple[str, ...]) -> None:
    """A usage error unless ``model`` splits ``parallel``-wise over ``n`` devices; it names the device
    counts that work, and those of the other ``modes`` (``--parallel`` values) that work with ``n``."""
    from runtime.models import model_splits
    s = model_splits(model)
    problem = s.problem(parallel, n)
    if problem is None:
        return
    if parallel == "tp":
        ways = [f"--devices {_either(s.tp_degrees())}"] if s.tp_degrees() else []
    elif parallel == "pp":
        ways = [f"--devices {s.layers} or fewer"]
    else:
        ways = ["--devices 1"]
    ways += [f"--parallel {m}" for m in modes if m != parallel and s.problem(m, n) is None]
    fail(f"argument --devices: {problem}: use {(', or ' if ' or ' in ways[0] else ' or ').join(ways)}", prog)


def check_device_count(n: int, prog: str) -> None:
    """A usage error when the job's devices are fixed already (:func:`devices_available`) and fewer than
    ``n``."""
    have = devices_available()
    if have is not None and have[0] < n:
        fail(f"argument --devices: {n} devices asked, only {have[0]} on {have[1]}: use --devices {have[0]} or fewer",
             prog)


def check_serve_placement(models, need: int, replicas: int, prog: str) -> None:
    """A usage error (naming the serve.yaml line or the flag of the model) unless every generation model's
    placements split its weights evenly (tensor parallel over each one's devices) and every device a
    model names exists: on the running cluster or the in-process devices, else on the embedded cluster of
    ``need`` devices the server would start."""
    from devices.errors import AclError
    from runtime.models import model_splits
    from runtime.serve.config import place
    for m in models:
        if m.kind != "generate":
            continue
        tps = [len(m.devices) if m.devices is not None else m.device_count] + [p.tp for p in m.fallback if not p.cpu]
        s = model_splits(m.name)
        for n in tps:
            problem = s.problem("tp", n)
            if problem:
                fail(f"{m.origin or '--tp'}: {problem}: give it {_either([1] + s.tp_degrees())} devices (tp)", prog)
    have = devices_available()
    count, where = have if have is not None else (need, "the embedded cluster (--devices)")
    if replicas > 1:
        if count < need:
            fail(f"{replicas} replicas need {need} devices, {where} has {count}", prog)
        return
    try:
        place(tuple(models), count)
    except AclError as e:
        fail(f"{e.detail} on {where}", prog)


def check_port_free(host: str, port: int, prog: str, flag: str = "--port") -> None:
    """A usage error when the server could not bind ``host:port`` -- another process listens there, or
    the port is privileged -- found by binding a throw-away socket as uvicorn will (SO_REUSEADDR).  Port 0
    (any free port) always binds."""
    if port == 0:
        return
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as e:
            why = "is in use (another server listens there)" if e.errno == errno.EADDRINUSE else \
                f"cannot be bound: {e.strerror or e}"
            fail(f"argument {flag}: {host}:{port} {why}: stop that server, or pick another port "
                 f"({flag} 0: any free one)", prog)


def check_compiled_placement(repos, models, need: int, prog: str) -> None:
    """A usage error unless the compiled models of ``repos`` have distinct names (from each other and from
    ``models``) and their instances fit the devices (as :func:`check_serve_placement` counts them) beside
    ``models``."""
    from devices.errors import AclError
    from runtime.serve.config import place
    from runtime.serve.omserve import compiled_needs, place_compiled
    names = [m.name for m in models] + [m.name for r in repos for m in r.models]
    dup = next((n for n in names if names.count(n) > 1), None)
    if dup:
        fail(f"model {dup} is given twice (a compiled model is named after its file or directory)", prog)
    have = devices_available()
    count, where = have if have is not None else (need, "the embedded cluster (--devices)")
    try:
        compiled = [m for r in repos for m in r.models]
        place_compiled(compiled, place(tuple(models), count, compiled_needs(compiled)[0]), count)
    except AclError as e:
        fail(f"{e.detail} on {where}", prog)


__all__ = ["check_compiled_placement", "check_device_count", "check_port_free", "check_serve_placement", "check_split",
           "devices_available"]
