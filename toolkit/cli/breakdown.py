"""`toolkit bench --breakdown`'s tables: per load point, each layer's share of TTFT and inter-token time."""

from __future__ import annotations

from rich.table import Table

from toolkit.bench.breakdown import ITL_LAYERS, TTFT_LAYERS, PercentileBreakdown
from toolkit.bench.sweep import SweepResult
from toolkit.cli.render import note, stdout_console


def print_breakdowns(result: SweepResult) -> None:
    for p in result.points:
        b = p.breakdown
        if b is None:
            continue
        table = Table(
            title=f"c{p.point.value:g}: where the time went ({b.requests} traced requests)",
            title_justify="left",
        )
        table.add_column("layer")
        for kind, rows in (("TTFT", b.ttft), ("ITL", b.itl)):
            for row in rows:
                table.add_column(f"{kind} p{row.percentile}\nms", justify="right")
        for layer in dict.fromkeys(TTFT_LAYERS + ITL_LAYERS):
            cells = [_cell(row, layer) for row in (*b.ttft, *b.itl)]
            if any(cells):
                table.add_row(layer, *cells)
        table.add_row("total", *[f"{row.total_ms:.2f}" for row in (*b.ttft, *b.itl)])
        table.add_row("dominant", *[row.dominant for row in (*b.ttft, *b.itl)])
        stdout_console.print(table)
        if b.engine_step_ms is not None:
            note(f"engine step (its iteration counter): {b.engine_step_ms:.2f} ms")
        if b.untraced:
            note(f"[yellow]{b.untraced} requests left out: their spans did not all arrive[/]")
        for line in b.notes:
            note(line)


def _cell(row: PercentileBreakdown, layer: str) -> str:
    value = row.layers.get(layer)
    if value is None:
        return ""
    share = value / row.total_ms if row.total_ms else 0.0
    return f"{value:.2f} ({share:.0%})"
