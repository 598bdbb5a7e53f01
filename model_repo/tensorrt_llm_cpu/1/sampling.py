"""Per-request seeded sampling for transformers' continuous batching.

Continuous batching draws every sampled request's token from one shared RNG, so a request's
tokens would depend on which other requests share its batch. For a request that names a seed,
this processor (the last in the chain, after temperature / top-k / top-p) draws the token from a
generator seeded with (seed, step) and masks every other token, so the manager's own draw can only
pick that one: the same seed gives the same text under any load. Every sampled request has a seed
(TensorRT-LLM's default is 0: model.py fills it in); greedy requests (top_k 1) pass through untouched.
"""

from __future__ import annotations

import hashlib

import torch
from transformers.generation.continuous_batching.cb_logits_processors import (
    ContinuousBatchingLogitsProcessor,
)

NO_SEED = 0


def step_seed(seed: int, step: int) -> int:
    """A non-zero 31-bit generator seed for (request seed, decode step); 0 means 'no seed'."""
    digest = hashlib.blake2b(f"{seed}:{step}".encode(), digest_size=4).digest()
    return (int.from_bytes(digest, "little") & 0x7FFFFFFF) | 1


class SeededSampler(ContinuousBatchingLogitsProcessor):
    supported_kwargs = {"seed": int}
    ignored_kwargs = ()

    def fill_defaults(self, int32_tensor: torch.Tensor) -> None:
        int32_tensor.fill_(NO_SEED)

    def prepare_tensor_args(self, requests_with_new_token) -> torch.Tensor:
        seeds = []
        for future in requests_with_new_token:
            state = future.state
            seed = state.logit_processor_kwargs.get("seed")
            seeds.append(NO_SEED if seed is None else step_seed(seed, len(state.generated_tokens)))
        return torch.tensor(seeds, dtype=torch.int32)

    def __call__(self, scores: torch.Tensor, tensor_arg: torch.Tensor) -> torch.Tensor:
        seeds = tensor_arg[: scores.size(0)].tolist()
        if not any(seeds):
            return scores
        for row, seed in enumerate(seeds):
            if seed == NO_SEED:
                continue
            generator = torch.Generator().manual_seed(int(seed))
            probs = torch.softmax(scores[row].float(), dim=-1)
            if not (torch.isfinite(probs).all() and probs.sum() > 0):
                # NaN or infinite logits: a broken checkpoint (temperatures that would overflow them are
                # decoded greedily upstream). Failing the step fails the requests in it, and the engine
                # restarts its loop; a made-up token would be a silent wrong answer.
                raise ValueError(
                    "the model produced nan or infinite logits; the sampling step cannot draw a token"
                )
            choice = torch.multinomial(probs, 1, generator=generator)
            masked = torch.full_like(scores[row], float("-inf"))
            masked[choice] = 0.0
            scores[row] = masked
        return scores


def install_seeded_sampler(manager) -> None:
    """Append the sampler to a manager's processor list; call before manager.start()."""
    processors = manager.logit_processor
    processors.logits_processor.append(SeededSampler())
    processors.tensors_required += 1
    processors._retrieve_processors_kwargs()
    processors.do_processing = True
