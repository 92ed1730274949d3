"""Findings and how they read: compute-sanitizer's text (``=========``-prefixed blocks, an ERROR SUMMARY)
and a JSON document for tools.

A :class:`Finding` is one error: a hazard between two call sites, an uninitialised read, a refused bad
access, or leaked resources of one kind from one call site.  Its text is made when it is found (sites
are resolved then); ``count`` grows when the same error happens again (the JSON has it, the text shows it
in the summary only).  :func:`summary_lines` works on the JSON form, so ``vnpu sanitize`` can sum the
reports of several processes.
"""
from __future__ import annotations

from dataclasses import dataclass, field

PREFIX = "========= "
#: JSON report format version
FORMAT = 1


@dataclass
class Finding:
    tool: str                           #: memcheck | racecheck | initcheck | leakcheck
    kind: str                           #: RAW | WAR | WAW | uninitialized-read | bad-access | leak-<resource>
    message: str                        #: the headline
    details: list[str] = field(default_factory=list)
    data: dict = field(default_factory=dict)
    count: int = 1

    def text(self) -> str:
        lines = [PREFIX + self.message] + [PREFIX + "    " + d for d in self.details] + [PREFIX.rstrip()]
        return "\n".join(lines) + "\n"

    def as_dict(self) -> dict:
        return {"tool": self.tool, "kind": self.kind, "message": self.message, "count": self.count,
                "details": list(self.details), **self.data}


def site_block(title: str, site) -> list[str]:
    """``title`` then the site's API entry and host frames, indented."""
    return [title] + ["    " + ln for ln in site.lines()]


def summary_lines(findings: list[dict], tools: tuple[str, ...] | list[str]) -> list[str]:
    """The closing lines (prefixed) for findings in their JSON form."""
    out = []
    if "leakcheck" in tools:
        leaks = [f for f in findings if f["tool"] == "leakcheck"]
        nbytes = sum(f.get("bytes", 0) for f in leaks if f["kind"] == "leak-allocation")
        nalloc = sum(f.get("resources", 0) for f in leaks if f["kind"] == "leak-allocation")
        other = {k: sum(f.get("resources", 0) for f in leaks if f["kind"] == f"leak-{k}")
                 for k in ("host-buffer", "stream", "event", "graph")}
        extra = ", ".join(f"{n} {k}{'s' if n != 1 else ''}" for k, n in other.items() if n)
        out.append(f"LEAK SUMMARY: {nbytes} bytes leaked in {nalloc} allocations" + (f"; also {extra}" if extra else ""))
    if "racecheck" in tools:
        n = sum(1 for f in findings if f["tool"] == "racecheck")
        hz = sum(f.get("count", 1) for f in findings if f["tool"] == "racecheck")
        out.append(f"RACECHECK SUMMARY: {n} hazard{'s' if n != 1 else ''} displayed ({n} error{'s' if n != 1 else ''}, "
                   f"0 warnings; {hz} occurrence{'s' if hz != 1 else ''})")
    n = len(findings)
    out.append(f"ERROR SUMMARY: {n} error{'s' if n != 1 else ''}")
    return [PREFIX + ln for ln in out]
