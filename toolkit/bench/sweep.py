"""A perf_analyzer sweep: plan (points, prompts, files) -> execute (one perf_analyzer per point) -> record.

Each point runs perf_analyzer over gRPC streaming with a fixed request count, writes its profile
export, and is turned into LLM metrics (toolkit.bench.metrics) plus what Triton's metrics endpoint
showed during the run (toolkit.bench.scrape).
"""

from __future__ import annotations

import math
import socket
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from toolkit.bench.breakdown import PointBreakdown
from toolkit.bench.metrics import (
    PointMetrics,
    adapter_metrics,
    parse_profile_export,
    point_metrics,
)
from toolkit.bench.perf_analyzer import PerfAnalyzer, find_perf_analyzer, run_perf_analyzer
from toolkit.bench.prompts import make_prompts, write_input_data
from toolkit.bench.scrape import MetricsScraper, ScrapeSummary
from toolkit.errors import BenchError
from toolkit.repository import contract as c
from toolkit.repository.reader import Repository, open_repository


@dataclass(frozen=True)
class LoadPoint:
    mode: str  # "concurrency" or "request_rate"
    value: float

    @property
    def label(self) -> str:
        return f"concurrency{self.value:g}" if self.mode == "concurrency" else f"rate{self.value:g}"


@dataclass(frozen=True)
class Expected:
    """What the plan estimates for a concurrency point (toolkit.plan.estimate): the same requests in
    flight, the same prompt and output lengths, the whole engine."""

    concurrency: int
    ttft_ms: float
    tpot_ms: float
    output_tokens_per_s: float

    @classmethod
    def from_estimate(cls, estimate) -> Expected:
        return cls(
            estimate.concurrency, estimate.ttft_ms, estimate.tpot_ms, estimate.output_tokens_per_s
        )


@dataclass(frozen=True)
class SweepPlan:
    grpc_url: str
    model: str
    points: tuple[LoadPoint, ...]
    input_tokens: int
    output_tokens: int
    prompts: int
    requests: tuple[int, ...]  # per point
    out_dir: Path
    tokenizer: Path
    add_special_tokens: bool = False
    bos_id: int | None = None
    metrics_url: str | None = None
    expected: tuple[Expected | None, ...] = ()  # per point: the plan's estimate (GPU repositories)
    timeout_s: float = 600.0
    seed: int = 0
    # --breakdown: the load goes through the OpenAI API at api_url, traced, and the spans are read
    # from `traces` (a file toolkit trace collect writes) to break each point down by layer.
    api_url: str | None = None
    traces: Path | None = None

    @property
    def target(self) -> str:
        """What the load was sent to, for titles."""
        return f"OpenAI API {self.api_url}" if self.api_url else f"{self.model} @ {self.grpc_url}"

    # --lora-mix: (model id, LoRA task id) the requests are spread over; task 0 is the base model.
    lora_mix: tuple[tuple[str, int], ...] = ()

    def to_dict(self) -> dict:
        data = asdict(self)
        data["out_dir"], data["tokenizer"] = str(self.out_dir), str(self.tokenizer)
        data["traces"] = None if self.traces is None else str(self.traces)
        return data


@dataclass(frozen=True)
class PointResult:
    point: LoadPoint
    metrics: PointMetrics
    server: ScrapeSummary
    export_file: Path
    expected: Expected | None = None
    # measured / expected: output tokens/s, mean inter-token latency / TPOT, mean TTFT / TTFT
    tokens_per_s_of_expected: float | None = None
    itl_of_expected: float | None = None
    ttft_of_expected: float | None = None
    breakdown: PointBreakdown | None = None  # --breakdown: where TTFT and ITL went, by layer
    # --lora-mix: each adapter's (and the base model's) requests, by model id, over the point's duration.
    adapters: dict[str, PointMetrics] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {
            "point": asdict(self.point),
            "metrics": self.metrics.to_dict(),
            "adapters": {name: m.to_dict() for name, m in self.adapters.items()},
            "server": self.server.to_dict(),
            "export_file": str(self.export_file),
            "expected": None if self.expected is None else asdict(self.expected),
            "tokens_per_s_of_expected": self.tokens_per_s_of_expected,
            "itl_of_expected": self.itl_of_expected,
            "ttft_of_expected": self.ttft_of_expected,
            "breakdown": None if self.breakdown is None else self.breakdown.to_dict(),
        }


@dataclass(frozen=True)
class SweepResult:
    plan: SweepPlan
    points: tuple[PointResult, ...]
    started: str
    perf_analyzer: str
    wall_s: float = 0.0
    files: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {
            "plan": self.plan.to_dict(),
            "started": self.started,
            "perf_analyzer": self.perf_analyzer,
            "wall_s": self.wall_s,
            "points": [p.to_dict() for p in self.points],
            "files": self.files,
        }


def parse_points(concurrency: str | None, request_rate: str | None) -> tuple[LoadPoint, ...]:
    """'1,2,4' -> concurrency points; request rates (requests/s) may be fractional."""
    points = [
        LoadPoint("concurrency", v) for v in _numbers(concurrency, "--concurrency", integer=True)
    ]
    points += [
        LoadPoint("request_rate", v)
        for v in _numbers(request_rate, "--request-rate", integer=False)
    ]
    if not points:
        raise BenchError(
            "no load points: pass --concurrency 1,2,4 and/or --request-rate 0.5,1",
            hint="e.g. --concurrency 1,4,16",
        )
    return tuple(points)


def _numbers(text: str | None, flag: str, integer: bool) -> list[float]:
    if not text:
        return []
    values = []
    for part in text.split(","):
        try:
            value = int(part) if integer else float(part)
        except ValueError:
            raise BenchError(
                f"{flag}={text!r}: {part!r} is not a {'whole ' if integer else ''}number",
                hint=f"e.g. {flag} 1,2,4",
            ) from None
        if value <= 0 or not math.isfinite(value):
            raise BenchError(
                f"{flag}={text!r}: {part!r} must be positive", hint=f"e.g. {flag} 1,2,4"
            )
        values.append(float(value))
    return values


def default_request_count(point: LoadPoint, prompts: int) -> int:
    """Enough requests that every point sees each concurrent slot refilled a few times."""
    return max(prompts, 8, math.ceil(4 * point.value))


def plan_sweep(
    grpc_url: str,
    points: tuple[LoadPoint, ...],
    *,
    input_tokens: int,
    output_tokens: int,
    out_dir: Path,
    model: str = c.ENSEMBLE,
    prompts: int = 16,
    requests: int | None = None,
    repo: Path | None = None,
    tokenizer: Path | None = None,
    metrics_url: str | None = None,
    timeout_s: float = 600.0,
    seed: int = 0,
    api_url: str | None = None,
    traces: Path | None = None,
    lora_mix: tuple[str, ...] = (),
) -> SweepPlan:
    """The sweep: prompts are made with the served repository's tokenizer, encoded the way its preprocessing encodes.
    With `api_url` and `traces` (--breakdown) the load goes through the OpenAI API, traced."""
    if (api_url is None) != (traces is None):
        raise BenchError(
            "--breakdown needs both the OpenAI API (--api-url) and the spans of the run (--traces)",
            hint="serve with --openai-port and --trace-rate 1, collect with `toolkit trace collect -o "
            "spans.jsonl`, then pass --breakdown --api-url http://HOST:PORT --traces spans.jsonl",
        )
    if api_url is not None and lora_mix:
        raise BenchError(
            "--breakdown sends every request to the served model: it cannot spread them over --lora-mix",
            hint="run --lora-mix without --breakdown (perf_analyzer reports each adapter), or "
            "--breakdown without --lora-mix",
        )
    if api_url is not None and any(p.mode != "concurrency" for p in points):
        raise BenchError(
            "--breakdown runs concurrency points only (its client keeps N requests in flight)",
            hint="pass --concurrency 1,16 without --request-rate",
        )
    repository = open_repository(repo) if repo is not None else None
    if repository is not None and not repository.capabilities.streaming:
        raise BenchError(
            f"{repo}: {repository.capabilities.refusal('streaming')}: its models answer each request with "
            "one response, so time to first token and inter-token latency cannot be measured",
            hint="bench a repository built without --no-decoupled (the default); request latency of this "
            "one: perf_analyzer -m ensemble -i grpc",
        )
    if tokenizer is None:
        if repository is None:
            raise BenchError(
                "no tokenizer: pass --repo DIR (the served repository) or --tokenizer PATH",
                hint="--repo ./model_repository, or start the server with toolkit serve (bench finds what it serves)",
            )
        tokenizer = repository.tokenizer_json
    if not tokenizer.is_file():
        raise BenchError(
            f"tokenizer {tokenizer} does not exist", hint="pass --tokenizer PATH/tokenizer.json"
        )
    if requests is not None and requests < 1:
        raise BenchError(
            f"--requests={requests} must be at least 1",
            hint="or leave it out for an automatic count",
        )
    mix = resolve_lora_mix(lora_mix, repository)
    counts = tuple(requests or default_request_count(p, prompts * max(len(mix), 1)) for p in points)
    tokens = repository.tokens if repository is not None else None
    expected = expectations(repository, points, input_tokens, output_tokens) if repository else ()
    return SweepPlan(
        grpc_url=grpc_url,
        model=model,
        points=points,
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        prompts=prompts,
        requests=counts,
        out_dir=out_dir,
        tokenizer=tokenizer,
        add_special_tokens=tokens.add_special_tokens if tokens else False,
        bos_id=tokens.bos_id if tokens else None,
        metrics_url=metrics_url,
        expected=expected,
        timeout_s=timeout_s,
        seed=seed,
        api_url=api_url.rstrip("/") if api_url else None,
        traces=traces,
        lora_mix=mix,
    )


BASE_IN_MIX = "base"


def resolve_lora_mix(
    names: tuple[str, ...], repository: Repository | None
) -> tuple[tuple[str, int], ...]:
    """--lora-mix a,b,base -> ((a, 1), (b, 2), (base, 0)) by the repository's adapters (`base`, or the base
    model's id: the base model)."""
    if not names:
        return ()
    if repository is None:
        raise BenchError(
            "--lora-mix needs the served repository (its adapters' task ids)",
            hint="pass --repo DIR, or bench the server toolkit serve started",
        )
    tasks = {adapter.name: adapter.task_id for adapter in repository.adapters}
    tasks.update({BASE_IN_MIX: 0, repository.served_model_name: 0})
    unknown = [name for name in names if name not in tasks]
    if unknown:
        valid = ", ".join([BASE_IN_MIX, *(a.name for a in repository.adapters)])
        raise BenchError(
            f"--lora-mix: {', '.join(unknown)} is not a LoRA adapter of this repository (valid: {valid})",
            hint="name the adapters built with --lora NAME=PATH, and base for the base model",
        )
    return tuple((name, tasks[name]) for name in names)


def expectations(
    repository: Repository, points: tuple[LoadPoint, ...], input_tokens: int, output_tokens: int
) -> tuple[Expected | None, ...]:
    """Per point, the estimate of the repository's planned engine at that concurrency and these lengths
    (a GPU repository's manifest records its plan; request-rate points have no fixed concurrency)."""
    from toolkit.plan.estimate import estimate_for_plan

    memory = repository.memory_plan
    if memory is None:
        return tuple(None for _ in points)
    facts = repository.manifest.model.facts
    return tuple(
        Expected.from_estimate(
            estimate_for_plan(facts, memory, int(p.value), input_tokens, output_tokens)
        )
        if p.mode == "concurrency"
        else None
        for p in points
    )


def perf_analyzer_args(
    plan: SweepPlan, point: LoadPoint, requests: int, input_file: Path, export_file: Path
) -> list[str]:
    # A rate as start:end: perf_analyzer 2.51 reads a lone rate under 1 ("0.5") as a range of several
    # values and then refuses --request-count ("not supported with multiple request-rate values").
    load = (
        ["--concurrency-range", f"{int(point.value)}"]
        if point.mode == "concurrency"
        else ["--request-rate-range", f"{point.value:g}:{point.value:g}"]
    )
    return [
        "-m",
        plan.model,
        "-i",
        "grpc",
        "--streaming",
        "-u",
        plan.grpc_url,
        "--async",
        "--input-data",
        str(input_file),
        *load,
        # A fixed request count, and no stability search: every request of the point is measured.
        "--request-count",
        str(requests),
        "--measurement-interval",
        str(int(plan.timeout_s * 1000)),
        "--stability-percentage",
        "999",
        "--profile-export-file",
        str(export_file),
    ]


OnPoint = Callable[[int, LoadPoint, "PointResult | None"], None]


def run_sweep(
    plan: SweepPlan,
    on_point: OnPoint = lambda i, p, r: None,
    pa: PerfAnalyzer | None = None,
    spans=None,
) -> SweepResult:
    """Every point in turn. `spans`: where --breakdown reads spans (default: the plan's traces file)."""
    if plan.api_url is not None:
        return _run_traced_sweep(plan, on_point, spans)
    pa = pa or find_perf_analyzer()
    plan.out_dir.mkdir(parents=True, exist_ok=True)
    clock = _started()
    input_file = write_input_data(
        plan.out_dir / "inputs.json",
        _plan_prompts(plan),
        plan.output_tokens,
        plan.model,
        lora_tasks=tuple(task for _, task in plan.lora_mix),
    )
    return _run_points(
        plan,
        on_point,
        lambda point, requests, expected: run_point(
            pa, plan, point, requests, input_file, expected
        ),
        str(pa.executable),
        clock,
    )


def _started() -> tuple[str, float]:
    """When a sweep started: the UTC time it records, and the monotonic clock its duration runs from."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), time.monotonic()


def _run_points(
    plan: SweepPlan, on_point: OnPoint, run_one, client: str, clock: tuple[str, float]
) -> SweepResult:
    """Each point in turn through `run_one(point, requests, expected)`; a sweep that stops (a failed
    point, Ctrl-C, SIGTERM) after one finished raises SweepStopped with the finished ones."""
    started, t0 = clock
    results: list[PointResult] = []
    try:
        for index, (point, requests) in enumerate(zip(plan.points, plan.requests, strict=True)):
            on_point(index, point, None)
            expected = plan.expected[index] if index < len(plan.expected) else None
            results.append(run_one(point, requests, expected))
            on_point(index, point, results[-1])
    except BaseException as exc:  # what finished is still a result
        if not results:
            raise
        partial = SweepResult(plan, tuple(results), started, client, time.monotonic() - t0)
        raise SweepStopped(partial, exc) from exc
    return SweepResult(plan, tuple(results), started, client, time.monotonic() - t0)


def _plan_prompts(plan: SweepPlan):
    """The sweep's prompts: plan.prompts of exactly plan.input_tokens, encoded as its preprocessing does."""
    return make_prompts(
        plan.tokenizer,
        plan.prompts,
        plan.input_tokens,
        add_special_tokens=plan.add_special_tokens,
        bos_id=plan.bos_id,
        seed=plan.seed,
    )


def _run_traced_sweep(plan: SweepPlan, on_point: OnPoint, spans) -> SweepResult:
    from toolkit.bench.traced_load import file_spans, served_model

    if plan.api_url is None or plan.traces is None:
        raise BenchError("a traced sweep needs --api-url and --traces", hint="pass both")
    if spans is None and not plan.traces.is_file():
        raise BenchError(
            f"--traces {plan.traces} does not exist: no receiver writes the stack's spans there",
            hint=f"start `toolkit trace collect -o {plan.traces}` and serve with --trace-rate 1 "
            "--otlp-endpoint pointing at it, then run the sweep",
        )
    plan.out_dir.mkdir(parents=True, exist_ok=True)
    clock = _started()
    model = served_model(plan.api_url)
    prompts = _plan_prompts(plan).prompts
    source = spans or file_spans(plan.traces)
    return _run_points(
        plan,
        on_point,
        lambda point, requests, expected: run_traced_point(
            plan, point, requests, model, prompts, source, expected
        ),
        f"toolkit traced client over the OpenAI API at {plan.api_url}",
        clock,
    )


def run_traced_point(
    plan: SweepPlan,
    point: LoadPoint,
    requests: int,
    model: str,
    prompts: tuple[str, ...],
    spans,
    expected: Expected | None = None,
) -> PointResult:
    """One point through the API, traced; its metrics from the client's stamps, its breakdown from the spans."""
    from toolkit.bench.traced_load import (
        breakdown_of,
        experiment,
        run_traced_load,
        write_client_records,
    )

    if plan.api_url is None:
        raise BenchError("a traced point needs --api-url", hint="pass --api-url")
    with MetricsScraper(plan.metrics_url) as scraper:
        done = run_traced_load(
            plan.api_url,
            model,
            prompts,
            plan.output_tokens,
            int(point.value),
            requests,
            timeout_s=plan.timeout_s,
        )
    export = write_client_records(plan.out_dir / "points" / f"{point.label}.client.json", done)
    metrics = point_metrics(experiment(point.value, done))
    server = scraper.summary()
    breakdown = breakdown_of(done, spans, server.engine_step_ms)
    if done and not breakdown.requests:
        raise BenchError(
            f"point {point.label}: none of its {len(done)} requests was traced: their spans never "
            f"arrived in {plan.traces}",
            hint="is `toolkit trace collect` writing that file, and does the stack export to it "
            "(toolkit serve --trace-rate 1 --otlp-endpoint http://HOST:PORT of the receiver)?",
        )
    return compared(
        replace(PointResult(point, metrics, server, export), breakdown=breakdown), expected
    )


class SweepStopped(Exception):
    """A sweep ended before its last point: `partial` holds the points that finished, `cause` why."""

    def __init__(self, partial: SweepResult, cause: BaseException):
        super().__init__(
            f"the sweep stopped after {len(partial.points)} of {len(partial.plan.points)} points"
        )
        self.partial = partial
        self.cause = cause


EXPORT_ATTEMPTS = 3


def run_point(
    pa: PerfAnalyzer,
    plan: SweepPlan,
    point: LoadPoint,
    requests: int,
    input_file: Path,
    expected: Expected | None = None,
) -> PointResult:
    """One perf_analyzer run; rerun when its profile export comes back cut short.

    perf_analyzer 2.51 sometimes exits 0 before its profile export is fully written (the file
    ends at a 64 KiB boundary, mid-record); a rerun of the point gets a whole one.
    """
    folder = plan.out_dir / "points"
    export_file = folder / f"{point.label}.profile_export.json"
    log_file = folder / f"{point.label}.perf_analyzer.log"
    args = perf_analyzer_args(plan, point, requests, input_file, export_file)
    for attempt in range(1, EXPORT_ATTEMPTS + 1):
        export_file.unlink(missing_ok=True)
        with MetricsScraper(plan.metrics_url) as scraper:
            run_perf_analyzer(
                pa, args, log_file, plan.timeout_s + 60, lambda: port_answers(plan.grpc_url)
            )
        if not export_file.is_file():
            raise BenchError(
                f"perf_analyzer wrote no profile export at {export_file}", hint=f"read {log_file}"
            )
        try:
            experiments = parse_profile_export(export_file)
            break
        except BenchError:
            if attempt == EXPORT_ATTEMPTS:
                raise
    if not experiments:
        raise BenchError(f"{export_file} holds no experiment", hint=f"read {log_file}")
    metrics = point_metrics(experiments[-1])
    names = {task: name for name, task in plan.lora_mix}
    adapters = adapter_metrics(experiments[-1], names) if names else {}
    result = PointResult(point, metrics, scraper.summary(), export_file, adapters=adapters)
    return compared(result, expected)


def compared(result: PointResult, expected: Expected | None) -> PointResult:
    """`result` with what it measured over what the plan expected at its concurrency."""
    if expected is None:
        return result
    m = result.metrics
    return replace(
        result,
        expected=expected,
        tokens_per_s_of_expected=m.output_tokens_per_s / expected.output_tokens_per_s,
        itl_of_expected=_ratio(m.itl_ms.mean, expected.tpot_ms),
        ttft_of_expected=_ratio(m.ttft_ms.mean, expected.ttft_ms),
    )


def _ratio(measured: float, expected: float) -> float | None:
    return measured / expected if measured and math.isfinite(measured) and expected else None


def port_answers(url: str) -> bool:
    """Whether something accepts TCP connections at HOST:PORT (a dead server refuses at once)."""
    host, _, port = url.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]") or "127.0.0.1", int(port)), timeout=2):
            return True
    except (OSError, ValueError):
        return False


def default_metrics_url(grpc_url: str) -> str:
    host = grpc_url.rsplit(":", 1)[0] if ":" in grpc_url else grpc_url
    return f"http://{host}:8002/metrics"
