"""``vnpu bench ...``: one subcommand per module of :mod:`runtime.bench`."""
from __future__ import annotations

import importlib

from runtime.bench import BENCHMARKS


def register(sub) -> None:
    b = sub.add_parser("bench", help="benchmarks against baselines measured in the same run",
                       example=("vnpu bench memcpy", "vnpu bench hccl --devices 4", "vnpu bench <benchmark> --help"))
    bs = b.add_subparsers(dest="bench", required=True)
    for name in BENCHMARKS:
        importlib.import_module(f"runtime.bench.{name.replace('-', '_')}").register(bs)
