"""Which ``acl.*`` names a corpus of pyACL programs uses, and which of them vnpu's ``runtime.acl`` lacks.

    python scripts/pyacl_coverage.py DIR [--json]

Reads every ``*.py`` under DIR that imports ``acl`` (``import acl`` at the start of a line), collects the
dotted names ``acl.x`` / ``acl.x.y`` it uses (not the namespaces themselves), and looks each up in
``runtime.acl``.  Prints the counts and the missing names by namespace; exit 0.  Used for the public
Ascend/samples corpus (issue 32's note).
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

NAME = re.compile(r"\bacl(?:\.[a-z_][a-z0-9_]*)+\b")
IMPORT = re.compile(r"^\s*import acl\b", re.M)
NAMESPACES = ("rt", "mdl", "op", "util", "prof", "media")


def used_names(root: Path) -> tuple[int, set[str]]:
    files, names = 0, set()
    for p in sorted(root.rglob("*.py")):
        text = p.read_text(errors="replace")
        if not IMPORT.search(text):
            continue
        files += 1
        names |= set(NAME.findall(text))
    return files, {n for n in names if n.split(".", 1)[1] not in NAMESPACES}


def missing(names: set[str]) -> list[str]:
    from runtime import acl
    out = []
    for n in sorted(names):
        obj = acl
        for part in n.split(".")[1:]:
            obj = getattr(obj, part, None)
            if obj is None:
                out.append(n)
                break
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("root")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    root = Path(a.root)
    if not root.is_dir():
        print(f"pyacl_coverage: {a.root} is not a directory", file=sys.stderr)
        return 2
    files, names = used_names(root)
    miss = missing(names)
    if a.json:
        print(json.dumps({"files": files, "names": len(names), "missing": miss}, indent=1))
        return 0
    print(f"{files} programs import acl; they use {len(names)} distinct acl.* names; vnpu has "
          f"{len(names) - len(miss)}, lacks {len(miss)}")
    by_ns: dict[str, list[str]] = {}
    for n in miss:
        by_ns.setdefault(n.rsplit(".", 1)[0], []).append(n.rsplit(".", 1)[1])
    for ns, ms in sorted(by_ns.items()):
        print(f"  {ns} ({len(ms)}): {', '.join(ms)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
