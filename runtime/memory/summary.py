"""``memory_summary()``: the pool's statistics as a table, laid out like ``torch.cuda.memory_summary()``
(torch_npu's wording for the NPU rows: "NPU OOMs", "NPU reserved memory")."""
from __future__ import annotations

_W = 75     #: inner width of the table

#: (stat key, row label, formatter kind) in PyTorch's order
ROWS = (("allocated_bytes", "Allocated memory", "size"), ("active_bytes", "Active memory", "size"),
        ("requested_bytes", "Requested memory", "size"), ("reserved_bytes", "NPU reserved memory", "size"),
        ("inactive_split_bytes", "Non-releasable memory", "size"), ("allocation", "Allocations", "count"),
        ("active", "Active allocs", "count"), ("segment", "NPU reserved segments", "count"),
        ("inactive_split", "Non-releasable allocs", "count"))
OVERSIZE_ROWS = (("oversize_allocations", "Oversize allocations"), ("oversize_segments", "Oversize NPU segments"))


def format_size(n: int, ref: int) -> str:
    """``n`` in the unit ``ref`` calls for (B, KiB, MiB ...: the next unit once ``ref`` reaches 768 of it)."""
    unit = "B  "
    for u in ("KiB", "MiB", "GiB", "TiB"):
        if ref < 768 * 1024:
            break
        unit, n, ref = u, n // 1024, ref / 1024
    return f"{n:6d} {unit}"


def format_count(n: int, ref: int) -> str:
    unit = " "
    for u in ("K", "M"):
        if ref < 750 * 1000:
            break
        unit, n, ref = u, n // 1000, ref / 1000
    return f"{n:7d} {unit} "


def _fmt(kind: str, n: int, ref: int) -> str:
    return format_size(n, ref) if kind == "size" else format_count(n, ref)


def render(stats: dict, device: int = 0, abbreviated: bool = False) -> str:
    """The table for a ``memory_stats()`` dict."""
    line = "|" + "-" * _W + "|"
    dline = "|" + "=" * _W + "|"
    out = [dline, "|" + f" vNPU caching allocator memory summary, device ID {device:<3d}".center(_W) + "|", line]
    half = (_W - 1) // 2
    left = f"NPU OOMs: {stats['num_ooms']}".center(half)
    right = f"aclrtMalloc retries: {stats['num_alloc_retries']}".center(_W - 1 - half)
    out += ["|" + left + "|" + right + "|", dline,
            "|" + "        Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  " + "|", line]
    pools = (("all", ""),) if abbreviated else (("all", ""), ("large_pool", "      from large pool"),
                                                ("small_pool", "      from small pool"))
    for key, label, kind in ROWS:
        for pool, sub in pools:
            vals = [stats[f"{key}.{pool}.{m}"] for m in ("current", "peak", "allocated", "freed")]
            ref = [vals[0], vals[1], vals[2], vals[3]]
            cells = " | ".join(_fmt(kind, v, r) for v, r in zip(vals, ref))
            out.append("| " + f"{sub or label:<21}" + " | " + cells + " |")
        out.append(line)
    for key, label in OVERSIZE_ROWS:
        vals = [stats[f"{key}.{m}"] for m in ("current", "peak", "allocated", "freed")]
        out.append("| " + f"{label:<21}" + " | " + " | ".join(format_count(v, v) for v in vals) + " |")
    out.append(line)
    free, big = stats["inactive_bytes"], stats["largest_free_block"]
    frag = (f"Pool fragmentation {stats['fragmentation']:.3f}: largest free block "
            f"{format_size(big, big).strip()} of {format_size(free, free).strip()} cached")
    moved = (f"Defragmentations {stats['num_defragmentations']}: {stats['defrag_blocks_moved']} blocks, "
             f"{format_size(stats['defrag_bytes_moved'], stats['defrag_bytes_moved']).strip()} moved")
    other = (f"Cross-stream reuses {stats['num_cross_stream_reuse']}, GC releases {stats['num_gc_releases']}, "
             f"driver mallocs {stats['num_device_alloc']} / frees {stats['num_device_free']}")
    for text in (frag, moved, other):
        out.append("| " + f"{text[:_W - 2]:<{_W - 2}}" + " |")
    out.append(dline)
    return "\n".join(out)
