"""Issue 19's benchmark: the CPU engine at 16 streams with half the requests on a LoRA adapter and half on the base
model, against the base model alone, in the same run, through the OpenAI API.

    python perf/lora_mix.py [--streams 16] [--tokens 64] [--repeats 3] [--rank 16]
                            [--out perf/results/lora_mix]

It makes a LoRA adapter of the embedded default (SmolLM2-135M) with peft (rank --rank on every linear layer of
every block, random weights, B scaled small so the text stays text), builds the CPU repository with it
(--lora tuned=PATH), serves it on free ports with the API beside it, and runs rounds of --streams concurrent
chat completions of --tokens each (min_tokens = max_tokens: every answer is that long): base-only (every
stream on the base model) and mixed (every other stream on `tuned`), the two in turn (which goes first
alternates between rounds). Reported: tokens/s of each arm (median of rounds), the median per-round ratio
mixed / base-only (target >= 0.7), and each arm's median time to first token.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
from pathlib import Path

from bench_support import (
    BENCH_MODEL,
    Comparison,
    chat_body,
    run_arm,
    serve_with_api,
)

ADAPTER = "tuned"
PROMPTS = [
    "Tell me about the history of bridges.",
    "Describe how a river shapes a valley.",
    "Explain why the sky changes colour at dusk.",
    "Write a short story about a lighthouse keeper.",
]
LORA_MIX = Comparison(
    script="lora_mix.py",
    title="# LoRA: half the streams on an adapter vs the base model alone (CPU engine, same run, OpenAI API)",
    arms={"base_only": ("base-only", "base only"), "mixed": ("mixed", "half on the adapter")},
    ratio="mixed / base-only",
    target=0.7,
    goal="mixed (half on a LoRA adapter) >= 70% of base-only tokens/s at 16 streams",
)
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


async def arm(url: str, models: list[str], tokens: int) -> dict:
    """One request per entry of `models` (its model id), all at once, each exactly `tokens` long."""
    return await run_arm(
        url,
        [
            chat_body(model, PROMPTS[i % len(PROMPTS)], tokens, min_tokens=tokens)
            for i, model in enumerate(models)
        ],
    )


def make_adapter(checkpoint: Path, folder: Path, rank: int) -> Path:
    """A random LoRA adapter of the checkpoint on every linear layer (B scaled so the answers stay text)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32)
    config = LoraConfig(
        r=rank, lora_alpha=2 * rank, target_modules=TARGETS, init_lora_weights=False
    )
    model = get_peft_model(base, config)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.mul_(0.05)
    model.save_pretrained(folder)
    return folder


def serve(workdir: Path, rank: int):
    from toolkit.model.sources import resolve_model

    checkpoint = resolve_model(BENCH_MODEL, progress=False).path
    adapter = make_adapter(checkpoint, workdir / "adapter", rank)
    return serve_with_api(workdir, lora=((ADAPTER, str(adapter)),))


def main() -> int:
    parser = LORA_MIX.parser(__doc__)
    parser.add_argument("--rank", type=int, default=16)
    args = parser.parse_args()
    server, api = serve(Path(tempfile.mkdtemp(prefix="lora-mix-bench-")), args.rank)
    try:
        import httpx

        base = httpx.get(f"{api.url}/v1/models").json()["data"][0]["id"]
        asyncio.run(arm(api.url, [base, ADAPTER], 8))  # warm-up, both paths
        arms = {
            "base_only": [base] * args.streams,
            "mixed": [ADAPTER if i % 2 else base for i in range(args.streams)],
        }
        rounds = LORA_MIX.rounds(
            args.repeats, lambda _index, key: asyncio.run(arm(api.url, arms[key], args.tokens))
        )
    finally:
        api.stop()
        server.stop()
    result = LORA_MIX.result(args, rounds, workload={"adapter_rank": args.rank})
    LORA_MIX.write(args.out, result, setup=f"adapter rank {args.rank} on every linear layer, ")
    return 0


if __name__ == "__main__":
    sys.exit(main())
