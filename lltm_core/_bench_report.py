"""``lltm bench``'s output: the two tables, and the bar chart."""

from __future__ import annotations

import os

from ._bench_groups import Result
from ._format import table

def check_plot_target(path: str) -> None:
    """Fail before measuring, not after: no such folder, matplotlib missing, a format it cannot write."""
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise SystemExit(f"lltm bench: --plot {path}: no such folder {folder}")
    try:
        import matplotlib

        matplotlib.use("Agg")
        from matplotlib.figure import Figure
    except ImportError:
        raise SystemExit("lltm bench --plot needs matplotlib: pip install matplotlib (or pip install 'lltm-core[plot]')") from None
    suffix = os.path.splitext(path)[1].lstrip(".").lower()
    formats = Figure().canvas.get_supported_filetypes()
    if suffix and suffix not in formats:
        raise SystemExit(f"lltm bench: --plot {path}: matplotlib cannot write .{suffix} (it writes {', '.join(sorted(formats))})")


def _fmt_us(d: dict) -> str:
    return f"{d['median']:.1f} ({d['mean']:.1f})" if d else "-"


def _fmt_x(d: dict, second: str = "backward") -> str:
    return f"{d['forward']:.2f}x / {d[second]:.2f}x" if d else "-"


def format_table(results: list[Result]) -> str:
    """The cell table's rows of ``results`` (see format_sequence_table for the other)."""
    return _format_rows(
        [r for r in results if r.table == "cell"],
        ["forward us: median (mean)", "backward us: median (mean)", "speed-up vs eager fwd / bwd",
         "vs torch.compile fwd / bwd"],
        lambda r: [_fmt_us(r.forward_us), _fmt_us(r.backward_us), _fmt_x(r.speedup_vs_eager),
                   _fmt_x(r.speedup_vs_compile)])


def format_sequence_table(results: list[Result]) -> str:
    return _format_rows(
        [r for r in results if r.table == "sequence"],
        ["forward (no_grad) us: median (mean)", "forward+backward us: median (mean)",
         "speed-up vs nn.LSTM fwd / fwd+bwd"],
        lambda r: [_fmt_us(r.forward_us), _fmt_us(r.forward_backward_us),
                   _fmt_x(r.speedup_vs_lstm, "forward_backward")])


def _format_rows(results: list[Result], measured: list[str], cells) -> str:
    # A FAILED or SKIPPED row says why in a column of its own, added only when there is one.
    notes = any(r.status != "ok" for r in results)
    rows = []
    for r in results:
        if r.status != "ok":
            rows.append([r.candidate, r.device, r.dtype, r.size, r.status.upper(), *["-"] * (len(measured) - 1), r.detail])
        else:
            rows.append([r.candidate, r.device, r.dtype, r.size, *cells(r)] + ([""] if notes else []))
    return table(rows, ["candidate", "device", "dtype", "size", *measured] + (["why not timed"] if notes else []))


def plot(results: list[Result], path: str) -> None:
    check_plot_target(path)
    import matplotlib.pyplot as plt

    ok = [r for r in results if r.status == "ok"]
    groups = sorted({(r.table, r.device, r.dtype, r.size) for r in ok})
    fig, axes = plt.subplots(1, len(groups), figsize=(6 * len(groups), 4.5), squeeze=False)
    for ax, group in zip(axes[0], groups):
        rows = [r for r in ok if (r.table, r.device, r.dtype, r.size) == group]
        names = [r.candidate.replace(" (", "\n(") for r in rows]
        sequence = group[0] == "sequence"
        bars = (("forward (no_grad)", "forward_us"), ("forward+backward", "forward_backward_us")) if sequence else \
            (("forward", "forward_us"), ("backward", "backward_us"))
        xs = range(len(rows))
        for offset, (label, attr) in zip((-0.2, 0.2), bars):
            ax.bar([i + offset for i in xs], [getattr(r, attr)["median"] for r in rows], width=0.4, label=label)
        ax.set_xticks(list(xs), names, fontsize=8)
        ax.set_ylabel("median time per call (us)")
        ax.set_title(f"LLTM {'sequence ' if sequence else ''}{group[3]}, {group[1]} {group[2]}")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
