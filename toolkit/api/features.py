"""The engine-contract side of the request features beyond sampling: guided decoding, log probs, n, and the
outputs they come back in.

Inputs are the backend's own where it has them (guided_decoding_guide_type / guided_decoding_guide,
return_log_probs, num_return_sequences, return_perf_metrics for the KV blocks reused, lora_task_id for a
LoRA adapter the body's `model` names); top log probs come
from the Python engines' own `num_top_logprobs` input and `top_logprob_ids` / `top_logprobs` outputs, or,
on a GPU engine built with --gather-generation-logits, from the raw generation logits, reduced here.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from toolkit.repository import contract as c


@dataclass(frozen=True)
class Guide:
    """A guided-decoding request in the backend's terms."""

    type: str  # one of contract.GUIDE_TYPES' values: json, json_schema, regex, ebnf_grammar
    text: str | None  # the guide (none for json)


@dataclass(frozen=True)
class Features:
    guide: Guide | None = None
    logprobs: bool = False  # each generated token's log prob
    top_logprobs: int = 0  # and this many alternatives'
    top_from_logits: bool = False  # the alternatives from generation logits (a GPU engine's)
    n: int = 1  # choices, generated as the engine's num_return_sequences
    cached_tokens: bool = True  # ask for the KV blocks the prefix cache gave (return_perf_metrics)
    lora_task_id: int = 0  # the LoRA adapter the body's model names (0: the base model)

    def tensors(self, names: dict[str, str]) -> list[tuple[str, np.ndarray, str]]:
        """The Triton inputs (name, [1, 1] array, dtype) these features add to an engine request."""
        out = []
        if self.guide is not None:
            out.append(_text("guided_decoding_guide_type", self.guide.type))
            if self.guide.text is not None:
                out.append(_text("guided_decoding_guide", self.guide.text))
        if self.logprobs:
            out.append(("return_log_probs", np.array([[True]], bool), "BOOL"))
            if self.top_logprobs and self.top_from_logits:
                out.append(("return_generation_logits", np.array([[True]], bool), "BOOL"))
            elif self.top_logprobs:
                out.append(("num_top_logprobs", np.array([[self.top_logprobs]], np.int32), "INT32"))
        if self.n > 1:
            out.append(("num_return_sequences", np.array([[self.n]], np.int32), "INT32"))
        if self.cached_tokens:
            name = names.get("return_perf_metrics", "return_perf_metrics")
            out.append((name, np.array([[True]], bool), "BOOL"))
        if self.lora_task_id:
            out.append(("lora_task_id", np.array([[self.lora_task_id]], np.uint64), "UINT64"))
        return out

    def outputs(self) -> list[str]:
        """The engine outputs to ask for, besides output_ids and sequence_length."""
        names = []
        if self.logprobs:
            names.append("output_log_probs")
            if self.top_logprobs:
                names += (
                    ["generation_logits"]
                    if self.top_from_logits
                    else [t.name for t in c.OWN_ENGINE_OUTPUTS]
                )
        if self.n > 1:
            names.append("sequence_index")
        if self.cached_tokens:
            names.append("kv_cache_reused_blocks")
        return names


def _text(name: str, value: str) -> tuple[str, np.ndarray, str]:
    return name, np.array([[value.encode("utf-8")]], dtype=object), "BYTES"


@dataclass(frozen=True)
class TokenLogprob:
    """One generated token's log prob and its most likely alternatives (id, log prob), best first."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


def token_logprobs(outputs: dict[str, np.ndarray], tokens: list[int], top: int) -> tuple:
    """The TokenLogprobs of one response's tokens from its output arrays (by name)."""
    values = outputs.get("output_log_probs")
    if values is None or not tokens:
        return ()
    flat = values.reshape(-1)[: len(tokens)].astype(float).tolist()
    alternatives = _alternatives(outputs, len(tokens), top)
    return tuple(
        TokenLogprob(token, logprob, alternatives[i] if alternatives else ())
        for i, (token, logprob) in enumerate(zip(tokens, flat, strict=False))
    )


def _alternatives(outputs: dict[str, np.ndarray], count: int, top: int) -> list:
    if not top:
        return []
    ids, values = outputs.get("top_logprob_ids"), outputs.get("top_logprobs")
    if ids is not None and values is not None:
        ids, values = (
            ids.reshape(-1, ids.shape[-1])[:count],
            values.reshape(-1, values.shape[-1])[:count],
        )
        return [
            tuple((int(i), float(v)) for i, v in zip(row_ids, row_values, strict=True) if i >= 0)[
                :top
            ]
            for row_ids, row_values in zip(ids, values, strict=True)
        ]
    logits = outputs.get("generation_logits")
    if logits is None:
        return []
    # [1, 1, beam, vocab] per streamed step, or [1, beam, tokens, vocab]: the last `count` rows of beam 0.
    # Per streamed token on the event loop, over a ~128k vocabulary: float32, and only the top `top` ids
    # sorted (argpartition is linear; a full argsort cost milliseconds per token).
    rows = logits.reshape(-1, logits.shape[-1])[-count:].astype(np.float32, copy=False)
    peak = rows.max(axis=-1, keepdims=True)
    log_total = np.log(np.exp(rows - peak).sum(axis=-1, keepdims=True, dtype=np.float64)) + peak
    top = min(top, rows.shape[-1])
    picked = np.argpartition(-rows, top - 1, axis=-1)[:, :top]
    found = []
    for ids, row, total in zip(picked, rows, log_total[:, 0], strict=True):
        ordered = ids[np.argsort(-row[ids], kind="stable")]
        found.append(tuple((int(i), float(row[i] - total)) for i in ordered))
    return found
