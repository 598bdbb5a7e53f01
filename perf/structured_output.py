"""Issue 18's benchmark: structured output on the CPU engine at 16 streams against unconstrained output, in the
same run, through the OpenAI API; guide compile time per schema, and the cache hit rate on repeated schemas.

    python perf/structured_output.py [--streams 16] [--tokens 64] [--repeats 3] [--schemas 8]
                                     [--out perf/results/structured_output]

It builds the embedded default's (SmolLM2-135M) CPU repository, serves it on free ports with the API beside it,
and runs rounds of `--streams` concurrent chat completions, each --tokens long: unconstrained (min_tokens =
max_tokens) and guided by a JSON schema whose instances are longer than --tokens (every answer runs to
max_tokens), the two in turn (which goes first alternates between rounds). A guided round uses --schemas
distinct schemas, each sent --streams / --schemas times, so each schema is compiled once and then reused.
Reported: tokens/s of each arm (median of rounds), the median per-round ratio guided / unconstrained (target
>= 0.8), the engine's compile time per schema and cache hit rate (its toolkit_engine_guide* counters), and
the API's time to first token.
"""

from __future__ import annotations

import asyncio
import re
import sys
import tempfile
import urllib.request
from pathlib import Path

from bench_support import (
    Comparison,
    chat_body,
    run_arm,
    serve_with_api,
)

STRUCTURED = Comparison(
    script="structured_output.py",
    title="# Structured output vs unconstrained on the CPU engine (same run, through the OpenAI API)",
    arms={
        "unconstrained": ("unconstrained", "unconstrained"),
        "guided": ("guided", "guided (JSON schema)"),
    },
    ratio="guided / unconstrained",
    target=0.8,
    goal="guided >= 80% of unconstrained tokens/s at 16 streams",
)
PROMPTS = [
    "List some fruits with a score for each.",
    "Give me names of cities and a number for each.",
    "Make up a list of products and their ratings.",
    "Write an inventory of tools with counts.",
]


def schema(variant: int) -> dict:
    """A schema whose instances run past any --tokens: a long list of records (distinct per variant)."""
    return {
        "type": "object",
        "properties": {
            "items": {
                "type": "array",
                "minItems": 200,
                "items": {
                    "type": "object",
                    "properties": {
                        "name": {"type": "string", "maxLength": 12},
                        f"score_{variant}": {"type": "integer", "minimum": 0, "maximum": 100},
                    },
                    "required": ["name", f"score_{variant}"],
                    "additionalProperties": False,
                },
            }
        },
        "required": ["items"],
        "additionalProperties": False,
    }


def guided(guide: dict | None, tokens: int) -> dict:
    """An unconstrained request runs to max_tokens by min_tokens; a guided one by its schema's length."""
    if guide is None:
        return {"min_tokens": tokens}
    return {
        "response_format": {"type": "json_schema", "json_schema": {"name": "r", "schema": guide}}
    }


async def arm(url: str, model: str, streams: int, tokens: int, guides: list | None) -> dict:
    bodies = [
        chat_body(
            model,
            PROMPTS[i % len(PROMPTS)],
            tokens,
            **guided(None if guides is None else guides[i % len(guides)], tokens),
        )
        for i in range(streams)
    ]
    return await run_arm(url, bodies)


def engine_counters(metrics_url: str) -> dict[str, float]:
    text = urllib.request.urlopen(metrics_url, timeout=10).read().decode()
    found = {}
    for name in ("compiled", "reused", "compile_seconds"):
        family = f"toolkit_engine_guide{'s' if name != 'compile_seconds' else ''}_{name}_total"
        values = re.findall(rf"^{family}(?:{{[^}}]*}})? (\S+)$", text, re.M)
        found[name] = sum(float(v) for v in values)
    return found


def main() -> int:
    parser = STRUCTURED.parser(__doc__)
    parser.add_argument("--schemas", type=int, default=8)
    args = parser.parse_args()
    server, api = serve_with_api(Path(tempfile.mkdtemp(prefix="structured-bench-")))
    try:
        import httpx

        model = httpx.get(f"{api.url}/v1/models").json()["data"][0]["id"]
        asyncio.run(arm(api.url, model, 2, 8, None))  # warm-up
        before = engine_counters(server.metrics_url)

        def run(index: int, key: str) -> dict:
            # New schemas each round (compiled once, then reused within it).
            guides = [schema(index * args.schemas + v) for v in range(args.schemas)]
            chosen = guides if key == "guided" else None
            return asyncio.run(arm(api.url, model, args.streams, args.tokens, chosen))

        rounds = STRUCTURED.rounds(args.repeats, run)
        after = engine_counters(server.metrics_url)
    finally:
        api.stop()
        server.stop()
    compiled = after["compiled"] - before["compiled"]
    reused = after["reused"] - before["reused"]
    result = STRUCTURED.result(
        args,
        rounds,
        workload={"schemas_per_round": args.schemas},
        measured={
            "compile_ms_per_schema": 1000
            * (after["compile_seconds"] - before["compile_seconds"])
            / max(compiled, 1),
            "schemas_compiled": compiled,
            "cache_hit_rate": reused / max(compiled + reused, 1),
        },
    )
    guide_line = (
        f"Guide compile time: {result['compile_ms_per_schema']:.2f} ms per schema "
        f"({result['schemas_compiled']:.0f} compiled); cache hit rate on repeated schemas "
        f"{100 * result['cache_hit_rate']:.0f} %."
    )
    STRUCTURED.write(args.out, result, notes=("", guide_line))
    return 0


if __name__ == "__main__":
    sys.exit(main())
