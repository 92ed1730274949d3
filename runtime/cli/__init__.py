"""The ``vnpu`` command line.  One module per command group, each with ``register(subparsers)``;
commands that need devices use the running cluster (``vnpu up``) or start an embedded one for their own
run."""
from __future__ import annotations

import argparse
import importlib
import os
import sys

from devices.errors import AclError

#: command groups, in the order ``vnpu --help`` lists them
COMMANDS = ("cluster", "token", "smi", "demo", "run", "serve", "atc", "chaos", "bench")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="vnpu", description="virtual NPU cluster (CANN-style) on Ray")
    sub = p.add_subparsers(dest="cmd", required=True)
    for name in COMMANDS:
        importlib.import_module(f"runtime.cli.{name}").register(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    a = build_parser().parse_args(argv)
    try:
        return a.fn(a) or 0
    except AclError as e:
        print(f"vnpu: error {e.code} {e.name}: {e.detail}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
