"""`toolkit bench`: a perf_analyzer sweep with TTFT, ITL and tokens/s, written as CSV, JSON and plots."""

from __future__ import annotations

from pathlib import Path

import click
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from toolkit.bench.report import write_report
from toolkit.bench.sweep import (
    SweepResult,
    SweepStopped,
    default_metrics_url,
    parse_points,
    plan_sweep,
    run_sweep,
)
from toolkit.cli.breakdown import print_breakdowns
from toolkit.cli.options import (
    json_option,
    model_option,
    repo_option,
    timeout_option,
    triton_url_option,
)
from toolkit.cli.render import emit_json, note, stderr_console, stdout_console
from toolkit.errors import BenchError
from toolkit.repository import contract as c
from toolkit.serve.launcher import read_server_record


@click.command("bench")
@triton_url_option("-u", "--url", help="gRPC endpoint of the served repository (host:port).")
@model_option(
    "Model to load.", type=click.Choice([c.ENSEMBLE, c.BLS, c.ENGINE]), default=c.ENSEMBLE
)
@click.option(
    "-c", "--concurrency", default=None, help="Concurrency points, comma-separated (e.g. 1,2,4,8)."
)
@click.option(
    "--request-rate", default=None, help="Request-rate points in requests/s, comma-separated."
)
@click.option(
    "-i",
    "--input-tokens",
    type=click.IntRange(1),
    default=128,
    help="Prompt length in tokens (exact).",
)
@click.option(
    "-o",
    "--output-tokens",
    type=click.IntRange(1),
    default=64,
    help="Output length in tokens (forced).",
)
@click.option("--prompts", type=click.IntRange(1), default=16, help="Distinct prompts.")
@click.option(
    "--requests",
    type=click.IntRange(1),
    default=None,
    help="Requests per point [default: max(prompts, 8, 4 x load)].",
)
@repo_option(
    "The served repository (its tokenizer) [default: the one `toolkit serve` serves on --url]."
)
@click.option(
    "--tokenizer",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="tokenizer.json to use instead of the repository's.",
)
@click.option(
    "--metrics-url",
    default=None,
    help="Triton metrics endpoint [default: recorded, else http://HOST:8002/metrics].",
)
@click.option(
    "--out",
    "out_dir",
    type=click.Path(path_type=Path, file_okay=False),
    default=Path("bench-results"),
    help="Output folder.",
)
@click.option(
    "--breakdown",
    is_flag=True,
    help="Send the load through the OpenAI API (--api-url), each request traced, and break TTFT and "
    "inter-token time down by layer from the spans (--traces).",
)
@click.option(
    "--api-url",
    default=None,
    help="--breakdown: the OpenAI API's base URL [default: the one `toolkit serve` runs beside --url].",
)
@click.option(
    "--traces",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="--breakdown: the spans file `toolkit trace collect -o` writes while the stack exports to it.",
)
@timeout_option("Seconds one point may take.", default=600.0, minimum=1)
@click.option("--seed", type=int, default=0, help="Prompt sampling seed.")
@click.option(
    "--lora-mix",
    default=None,
    help="Spread the requests evenly over these LoRA adapters, comma-separated (`base`: the base model), "
    "e.g. a,b,base; reports each one's figures too.",
)
@json_option
def command(
    url,
    concurrency,
    request_rate,
    repo,
    metrics_url,
    out_dir,
    breakdown,
    api_url,
    traces,
    timeout,
    lora_mix,
    as_json,
    **workload,
) -> None:
    """Sweep load points with perf_analyzer (gRPC streaming) and report LLM latency and throughput."""
    points = parse_points(concurrency, request_rate)
    record = read_server_record(url) or {}
    repo = repo or (Path(record["repo"]) if record.get("repo") else None)
    if breakdown:
        model_source = click.get_current_context().get_parameter_source("model")
        if model_source is not click.core.ParameterSource.DEFAULT:
            raise BenchError(
                f"--model {workload['model']} is not used with --breakdown: the load goes through the "
                "OpenAI API, to the model it serves",
                hint="drop --model, or drop --breakdown to load that Triton model directly",
            )
        api_url = api_url or _recorded_api(record)
    elif api_url or traces:
        raise BenchError(
            "--api-url and --traces only serve --breakdown", hint="add --breakdown, or drop them"
        )
    # The workload options (model, token counts, prompts, requests, tokenizer, seed) are plan_sweep's.
    plan = plan_sweep(
        url,
        points,
        out_dir=out_dir.resolve(),
        repo=repo,
        metrics_url=metrics_url or record.get("metrics") or default_metrics_url(url),
        timeout_s=timeout,
        api_url=api_url if breakdown else None,
        traces=traces.resolve() if breakdown and traces else None,
        lora_mix=tuple(name.strip() for name in (lora_mix or "").split(",") if name.strip()),
        **workload,
    )
    try:
        result = write_report(_run_with_progress(plan))
    # A sweep that stops keeps and shows the points that finished, then says why it stopped.
    except SweepStopped as stopped:
        _report(write_report(stopped.partial), as_json)
        note(f"[yellow]{stopped}[/]; the finished points are kept in {plan.out_dir}")
        raise stopped.cause from None
    _report(result, as_json)


def _report(result: SweepResult, as_json: bool) -> None:
    if as_json:
        emit_json(result.to_dict())
        return
    _print_summary(result)
    if result.plan.api_url is not None:  # a traced sweep (--breakdown)
        print_breakdowns(result)
    files = ", ".join(Path(path).name for path in result.files.values())
    note(f"results in {result.plan.out_dir}: {files}")


def _recorded_api(record: dict) -> str:
    """The OpenAI API `toolkit serve --openai-port --background` recorded beside this Triton."""
    url = record.get("openai")
    if not url:
        raise BenchError(
            "--breakdown needs the OpenAI API: pass --api-url, or serve with toolkit serve --openai-port",
            hint="e.g. --api-url http://127.0.0.1:9000",
        )
    return str(url).removesuffix("/v1")


def _run_with_progress(plan) -> SweepResult:
    columns = (
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total} points"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=stderr_console, transient=True) as progress:
        task = progress.add_task("sweep", total=len(plan.points))

        def on_point(index, point, result):
            if result is None:
                progress.update(
                    task,
                    description=f"{point.mode} {point.value:g} ({plan.requests[index]} requests)",
                )
            else:
                progress.advance(task)

        return run_sweep(plan, on_point)


def _print_summary(result: SweepResult) -> None:
    """One row per load point; compact enough for 80 columns (rich wraps cells rather than cut them)."""
    plan = result.plan
    table = Table(
        title=f"{plan.target} ({plan.input_tokens} in / {plan.output_tokens} out)",
        title_justify="left",
    )
    for header in (
        "load",
        "req",
        "tok/s",
        "req/s",
        "TTFT ms\np50/p99",
        "ITL ms\np50/p99",
        "latency ms\np50/p99",
    ):
        table.add_column(header, justify="right")
    # A GPU repository's plan estimates each concurrency point: measured tokens/s over it.
    with_expected = any(p.tokens_per_s_of_expected is not None for p in result.points)
    if with_expected:
        table.add_column("of\nplan", justify="right")
    for p in result.points:
        load = f"{'c' if p.point.mode == 'concurrency' else 'r'}{p.point.value:g}"
        row = _summary_cells(load, p.metrics)
        if with_expected:
            fraction = p.tokens_per_s_of_expected
            row.append("-" if fraction is None else f"{fraction:.0%}")
        table.add_row(*row)
        for name, metrics in p.adapters.items():  # --lora-mix: each adapter's share of the point
            table.add_row(*_summary_cells(f"  {name}", metrics), *([""] if with_expected else []))
    stdout_console.print(table)


def _summary_cells(load: str, m) -> list[str]:
    return [
        load,
        str(m.requests),
        f"{m.output_tokens_per_s:,.0f}",
        f"{m.requests_per_s:.2f}",
        f"{m.ttft_ms.p50:.0f}/{m.ttft_ms.p99:.0f}",
        f"{m.itl_ms.p50:.1f}/{m.itl_ms.p99:.1f}",
        f"{m.latency_ms.p50:.0f}/{m.latency_ms.p99:.0f}",
    ]
