"""Plain-text tables for the ``lltm`` command: ``lltm info`` and ``lltm bench`` both print them."""

from __future__ import annotations


def table(rows: list[list], header: list[str]) -> str:
    """Left-aligned columns as wide as their widest cell, a dashed rule under the header, indented by two."""
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    lines = [fmt.format(*header), fmt.format(*("-" * w for w in widths))]
    lines += [fmt.format(*map(str, r)) for r in rows]
    return "\n".join("  " + line.rstrip() for line in lines)
