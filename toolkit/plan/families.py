"""What a model family changes in a memory plan beyond its shapes: routed experts, windows, stored precision.

toolkit.plan.memory asks this module how many expert bytes a decode step leaves unread and what the plan
should say in words; the arithmetic of each family (toolkit.model.architectures) stays there.
"""

from __future__ import annotations

from toolkit.model.facts import ModelFacts


def expert_share_read(facts: ModelFacts, batch: int) -> float:
    """The share of the expert weights a decode step of `batch` tokens reads: with uniform routing a layer
    touches E * (1 - (1 - k/E)^batch) of its E experts (Mixtral, k=2 of 8: 25% at batch 1, 90% at 8)."""
    if not facts.num_experts:
        return 1.0
    k_over_e = facts.experts_per_token / facts.num_experts
    return 1.0 - (1.0 - k_over_e) ** max(1, batch)


def unread_expert_bytes(
    facts: ModelFacts, linear_bytes: float, tp: int, layers: int, batch: int
) -> float:
    """Bytes of experts on one GPU (`layers` of its stage, a 1/tp shard) that a `batch`-token decode step
    does not touch; 0 for a dense model."""
    experts, routed = facts.num_experts, facts.experts_per_token
    if not experts or routed >= experts:
        return 0.0
    split = facts.family.split(facts)
    # linear - routed_linear = layers x (E - k) experts, so the experts of all layers are that x E / (E - k).
    all_experts = (split.linear - split.routed_linear) * experts / (experts - routed)
    unread = all_experts * (1.0 - expert_share_read(facts, batch))
    return unread / facts.num_layers * layers * linear_bytes / tp


def plan_notes(facts: ModelFacts, max_seq_len: int, running: int) -> tuple[str, ...]:
    """What the plan assumes that a reader could not guess from its numbers."""
    notes = []
    if facts.num_experts:
        notes.append(
            f"MoE: memory holds all {facts.num_experts} experts of each layer ({facts.parameter_count / 1e9:.1f}B "
            f"parameters); decode reads only the {facts.experts_per_token} routed per token "
            f"({facts.active_parameter_count / 1e9:.1f}B active at batch 1; "
            f"{expert_share_read(facts, running):.0%} of the experts at {running} running requests)"
        )
    windows = facts.family.attention_windows(facts, max_seq_len)
    if windows:
        local = sum(facts.sliding_layers)
        notes.append(
            f"sliding window: {local} of {facts.num_layers} layers attend to the last {min(windows)} tokens "
            "(max_attention_window_size); the KV pool is sized as if every layer were global, as "
            "TensorRT-LLM 0.20 sizes it"
        )
    if facts.quantization is not None:
        notes.append(
            f"pre-quantized checkpoint ({facts.quantization.description}): planned with its stored precision"
        )
    return tuple(notes)
