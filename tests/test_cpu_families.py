"""The CPU target's decision per family, against what transformers' continuous batching (the CPU engine's
manager) actually does: for each family it accepts, continuous batching's greedy tokens equal generate()'s on a
tiny random checkpoint (prompts past the sliding window included); for Gemma 2, which it refuses, they differ
once the attention-logit cap bites (paged attention drops the cap)."""

from __future__ import annotations

import pytest

from toolkit.errors import UnsupportedModelError
from toolkit.model.facts import facts_from_config
from toolkit.targets.cpu import check_model

BASE = dict(
    vocab_size=128,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=0,
)
WINDOW = 8  # shorter than the first prompt: windowed layers really drop tokens
PROMPTS = [list(range(5, 17)), [20, 21, 22]]
FAMILIES = {
    "Qwen3ForCausalLM": ("Qwen3Config", {"head_dim": 32}),
    "Phi3ForCausalLM": ("Phi3Config", {"sliding_window": None}),
    "MixtralForCausalLM": (
        "MixtralConfig",
        {"num_local_experts": 4, "num_experts_per_tok": 2, "sliding_window": WINDOW},
    ),
    "Gemma3ForCausalLM": (
        "Gemma3TextConfig",
        {
            "head_dim": 32,
            "sliding_window": WINDOW,
            "layer_types": ["sliding_attention", "sliding_attention", "full_attention"],
            "query_pre_attn_scalar": 32,
        },
    ),
    "Gemma2ForCausalLM": (
        "Gemma2Config",
        {
            "head_dim": 32,
            "sliding_window": WINDOW,
            "attn_logit_softcapping": 1.0,
            "final_logit_softcapping": None,
            "query_pre_attn_scalar": 32,
        },
    ),
}


def _model(architecture: str):
    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    config_class, extra = FAMILIES[architecture]
    config = getattr(transformers, config_class)(**{**BASE, **extra})
    torch.manual_seed(0)
    attention = "eager" if architecture == "Gemma2ForCausalLM" else "sdpa"  # Gemma 2 has no sdpa
    model = AutoModelForCausalLM.from_config(
        config, dtype=torch.float32, attn_implementation=attention
    )
    with torch.no_grad():  # scores far past a cap of 1.0, so that capping changes the answer
        for name, weight in model.named_parameters():
            if name.endswith(("q_proj.weight", "k_proj.weight")):
                weight.mul_(8.0)
    return model.eval(), config


def _tokens(model) -> tuple[list[list[int]], list[list[int]]]:
    import torch
    from transformers import GenerationConfig
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    with torch.no_grad():
        reference = [
            model.generate(torch.tensor([p]), max_new_tokens=10, do_sample=False, eos_token_id=-1)[
                0
            ][len(p) :].tolist()
            for p in PROMPTS
        ]
    batching = ContinuousBatchingConfig(num_blocks=16, page_size=8, max_batch_tokens=32)
    config = GenerationConfig(max_new_tokens=10, do_sample=False, eos_token_id=-1)
    out = model.generate_batch(
        inputs=PROMPTS, generation_config=config, continuous_batching_config=batching
    )
    by_prompt = {tuple(result.prompt_ids): result.generated_tokens for result in out.values()}
    return reference, [by_prompt[tuple(p)] for p in PROMPTS]


@pytest.mark.parametrize("architecture", list(FAMILIES))
def test_the_cpu_target_accepts_exactly_what_continuous_batching_runs_as_generate_does(
    architecture,
):
    model, config = _model(architecture)
    facts = facts_from_config({**config.to_dict(), "architectures": [architecture]})
    reference, batched = _tokens(model)
    try:
        check_model(facts)
    except UnsupportedModelError as refused:
        assert "attn_logit_softcapping" in refused.message
        assert batched != reference  # what the CPU engine would have served: a different model
    else:
        assert batched == reference
