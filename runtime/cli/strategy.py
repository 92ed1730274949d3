"""``vnpu share-strategy`` and ``vnpu strategy``: shared strategies, a tuned config fragment with its
metadata and the evidence it was tuned on, in ``$VNPU_HOME/strategies/NAME/`` (:mod:`runtime.serve.strategies`,
the bundle format).

    vnpu share-strategy --name ecommerce_peak_guard --config runtime_config.yaml --tags ecommerce,peak \\
        --description "held p99 through black_friday_2024" --license apache-2.0 --evidence stress_report.html
    vnpu strategy list
    vnpu strategy apply ecommerce_peak_guard                 (over the running server, live)
    vnpu strategy apply ecommerce_peak_guard --dry-run --config serve.yaml   (print the merged config)
"""
from __future__ import annotations

import json
import os
import sys

from runtime.cliargs import fail, text_file


def register(sub) -> None:
    from runtime.serve.strategies import LICENSES
    s = sub.add_parser("share-strategy", help="write a strategy bundle (config fragment, metadata, evidence) into "
                                              "the local strategy directory",
                       example=("vnpu share-strategy --name ecommerce_peak_guard --config serve.yaml --tags "
                                "ecommerce,peak --description 'peak guard' --license apache-2.0",))
    s.add_argument("--name", required=True, help="the strategy's name (lower-case letters, digits, _.-)")
    s.add_argument("--config", type=text_file, default=None,
                   help="the tuned serve.yaml or runtime_config.yaml (default: $VNPU_CONFIG)")
    s.add_argument("--tags", default="", help="comma-separated tags")
    s.add_argument("--description", default="", help="one line on what it is for")
    s.add_argument("--license", default="apache-2.0", help=f"an SPDX id among {', '.join(LICENSES)}")
    s.add_argument("--evidence", action="append", default=[], metavar="FILE",
                   help="a stress-test or postmortem report it was tuned on (repeatable)")
    s.add_argument("--force", action="store_true", help="replace a bundle of the same name")
    s.set_defaults(fn=_share)
    st = sub.add_parser("strategy", help="list and apply shared strategies",
                        example=("vnpu strategy list", "vnpu strategy apply ecommerce_peak_guard --dry-run"))
    ops = st.add_subparsers(dest="op", required=True, metavar="{list,show,apply}")
    ls = ops.add_parser("list", help="the strategies in the local strategy directory",
                        example=("vnpu strategy list", "vnpu strategy list --json"))
    ls.add_argument("--json", action="store_true", help="print them as JSON")
    ls.set_defaults(fn=_list)
    sh = ops.add_parser("show", help="a strategy's metadata and config fragment",
                        example=("vnpu strategy show ecommerce_peak_guard",))
    sh.add_argument("name", help="the strategy's name")
    sh.set_defaults(fn=_show)
    ap = ops.add_parser("apply", help="set a strategy's config fragment over the running server (live) or "
                                      "print it merged over --config (--dry-run)",
                        example=("vnpu strategy apply ecommerce_peak_guard",
                                 "vnpu strategy apply ecommerce_peak_guard --dry-run --config serve.yaml"))
    ap.add_argument("name", help="the strategy's name")
    ap.add_argument("--dry-run", action="store_true", help="print the merged config instead of applying it")
    ap.add_argument("--config", type=text_file, default=None, help="with --dry-run: the config to merge over")
    ap.add_argument("--url", default=None, help="the server (default: the one in $VNPU_HOME/serve/server.json)")
    ap.add_argument("--api-key", default=None, help="an admin key (default: $VNPU_API_KEY)")
    ap.set_defaults(fn=_apply)


def _root():
    from runtime.cluster.discovery import state_dir
    from runtime.serve.strategies import home
    return home(state_dir())


def _share(a) -> int:
    from runtime.serve.strategies import StrategyError, write
    prog = "vnpu share-strategy"
    path = a.config or os.environ.get("VNPU_CONFIG")
    if not path:
        fail("which config? give --config FILE (the tuned serve.yaml or runtime_config.yaml)", prog)
    try:
        st = write(_root(), a.name, path, description=a.description, tags=a.tags.split(","), license=a.license,
                   evidence=a.evidence, force=a.force)
    except (StrategyError, OSError) as e:
        fail(str(e), prog)
    print(f"{prog}: {st.name} -> {st.path} (sections {', '.join(st.config)}; {len(st.evidence)} evidence file(s))")
    return 0


def _read(name: str, prog: str):
    from runtime.serve.strategies import StrategyError, read
    try:
        return read(_root(), name)
    except StrategyError as e:
        fail(str(e), prog)


def _list(a) -> int:
    from runtime.serve.strategies import listing
    sts = listing(_root())
    if a.json:
        print(json.dumps([{"name": s.name, "description": s.description, "tags": list(s.tags), "license": s.license,
                           "created": s.created, "sections": list(s.config)} for s in sts], indent=1))
    elif not sts:
        print(f"no strategies in {_root()}")
    for s in sts if not a.json else ():
        print(f"{s.name:<28} {s.license:<12} {s.created}  [{','.join(s.tags)}]  {s.description}")
    return 0


def _show(a) -> int:
    import yaml
    s = _read(a.name, "vnpu strategy show")
    print(f"# {s.name} ({s.license}, {s.created}; from {s.source}): {s.description}")
    print(f"# tags: {', '.join(s.tags) or '-'}; evidence: {', '.join(e['file'] for e in s.evidence) or '-'}")
    sys.stdout.write(yaml.safe_dump(s.config, sort_keys=False, allow_unicode=True, width=110))
    return 0


def _apply(a) -> int:
    prog = "vnpu strategy apply"
    s = _read(a.name, prog)
    if a.dry_run:
        return _dry_run(a, s, prog)
    if a.config:
        fail("--config goes with --dry-run (a running server applies the fragment over its own config)", prog)
    import argparse

    from runtime.cli.serve import run_reconfigure
    from runtime.serve.strategies import settings
    ns = argparse.Namespace(url=a.url, api_key=a.api_key, set=settings(s.config), file=None, memory_pool_size=None,
                            json=False, reconfigure_prog=prog)
    return run_reconfigure(ns)


def _dry_run(a, s, prog: str) -> int:
    import yaml

    from devices.errors import AclError
    from runtime.serve.canonical import canonical, render
    from runtime.serve.config import load_config, parse_config
    from runtime.serve.strategies import merged
    base: dict = {}
    if a.config:
        try:
            base = canonical(load_config(a.config))
        except AclError as e:
            fail(str(getattr(e, "detail", e)), prog)
    text = yaml.safe_dump(merged(base, s.config), sort_keys=False, allow_unicode=True, width=110)
    try:
        cfg = parse_config(text, f"{a.config or 'the defaults'} + strategy {s.name}")
    except AclError as e:
        fail(str(getattr(e, "detail", e)), prog)
    sys.stdout.write(render(cfg))
    return 0
