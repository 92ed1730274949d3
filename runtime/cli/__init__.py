"""The ``vnpu`` command line.  One module per command group, each with ``register(subparsers)``;
commands that need devices use the running cluster (``vnpu up``) or start an embedded one for their own
run.  Every command checks its arguments before doing work (:mod:`runtime.cliargs`), and the caching
pool's ``VNPU_ALLOC_CONF`` with them: a bad one exits 2 with one line on stderr."""
from __future__ import annotations

import argparse
import importlib
import os
import sys

from devices.errors import AclError
from runtime.cliargs import Parser, UsageError, report
from runtime.cluster import rayenv
from runtime.memory import AllocConfig

#: command groups, in the order ``vnpu --help`` lists them
COMMANDS = ("cluster", "token", "kernels", "smi", "demo", "run", "serve", "atc", "chaos", "sanitize", "prof",
            "bench", "monitor", "diagnose", "postmortem", "event", "stress", "strategy")


def version() -> str:
    """vnpu's version: the installed package's metadata, else ``pyproject.toml``'s (a source checkout that was
    never installed), else "unknown"."""
    import importlib.metadata as md
    try:
        return md.version("vnpu")
    except md.PackageNotFoundError:
        pass
    import tomllib
    from pathlib import Path
    try:
        with open(Path(__file__).resolve().parents[2] / "pyproject.toml", "rb") as f:
            return str(tomllib.load(f)["project"]["version"])
    except (OSError, KeyError, tomllib.TOMLDecodeError):
        return "unknown"


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="vnpu", description="virtual NPU cluster (CANN-style) on Ray",
               example=("vnpu up --devices 4 && vnpu smi && vnpu run generate --prompt 'What is an NPU?'",
                        "vnpu <command> --help"))
    p.add_argument("--version", action="version", version=f"vnpu {version()}", help="print vnpu's version and exit")
    sub = p.add_subparsers(dest="cmd", required=True)
    for name in COMMANDS:
        importlib.import_module(f"runtime.cli.{name}").register(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    rayenv.prepare()                     # Ray's environment, and a VNPU_SANITIZE sanitizer, before any work
    try:
        a = build_parser().parse_args(argv)
    except SystemExit as e:              # --help (0) or a bad argument (2, its one line already printed)
        return e.code if isinstance(e.code, int) else 2
    try:
        AllocConfig.from_env()           # a bad VNPU_ALLOC_CONF fails here, before any work, not mid-run
        return a.fn(a) or 0
    except UsageError as e:
        return report(e)
    except AclError as e:
        print(f"vnpu: error {e.code} {e.name}: {e.detail}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
