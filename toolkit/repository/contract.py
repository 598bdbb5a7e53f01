"""Tensor contract of the TensorRT-LLM backend's inflight_batcher_llm layout, as the pinned release has it.

Names, dtypes, dims, optional flags and reshapes follow NVIDIA's stock `all_models/inflight_batcher_llm`
configs of the backend code TensorRT-LLM 0.20.0 ships (toolkit.trtllm says why that revision), restricted
to text-only decoder models: the multimodal, encoder-decoder, speculative-decoding,
KV-retention and disaggregated-serving tensors are left out (a client that sends one is refused by
Triton as an unexpected input, never silently ignored). So is `runtime_top_p_min`, which
the stock config declares but the backend never reads (its utils.h names top-p-min "runtime_top_k_min",
an upstream typo): declared, it would be accepted and ignored. `decoder_input_lengths` stays, unread by a
decoder-only engine, because the stock ensemble feeds it. tests/test_contract_upstream.py
checks every tensor here against tests/data/upstream/triton_backend.json, transcribed from the backend.

Where a release reads another name for the same input (0.17-0.19: `min_length`, `random_seed`;
0.17-0.18: `return_kv_cache_reuse_stats`), `engine_name` gives the name an engine of that release
reads; the text models (ensemble, BLS) keep the pinned names and map them. Inputs a release does not
have yet (guided decoding before 0.19) are left out of its engine's config (`engine_inputs`).

The Python engines (cpu, synthetic) also declare tensors of our own (`OWN_ENGINE_INPUTS`,
`OWN_ENGINE_OUTPUTS`, listed in OWN_EXTENSIONS): optional, so stock clients never see them, and never
declared on the tensorrtllm backend (which would accept an input and ignore it).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from toolkit.trtllm import PINNED_TRTLLM_VERSION, version_tuple

# Model names, fixed by the layout (clients address them by name).
ENSEMBLE = "ensemble"
PREPROCESSING = "preprocessing"
ENGINE = "tensorrt_llm"
POSTPROCESSING = "postprocessing"
BLS = "tensorrt_llm_bls"
MODEL_NAMES = (ENSEMBLE, PREPROCESSING, ENGINE, POSTPROCESSING, BLS)


@dataclass(frozen=True)
class Tensor:
    name: str
    dtype: str  # Triton DataType name without the TYPE_ prefix: INT32, FP32, BOOL, STRING, UINT64, INT64
    dims: tuple[int, ...]
    optional: bool = False
    scalar: bool = False  # reshape: { shape: [ ] }: the model sees [batch] instead of [batch, 1]
    ragged: bool = False  # allow_ragged_batch


def _opt(name: str, dtype: str, dims: tuple[int, ...] = (1,), **kw) -> Tensor:
    return Tensor(name, dtype, dims, optional=True, **kw)


def _scalars(dtype: str, *names: str) -> tuple[Tensor, ...]:
    return tuple(_opt(name, dtype, scalar=True) for name in names)


# --- tensorrt_llm: the engine ------------------------------------------------------------------
ENGINE_INPUTS = (
    _opt("input_ids", "INT32", (-1,), ragged=True),
    Tensor("input_lengths", "INT32", (1,), scalar=True),
    Tensor("request_output_len", "INT32", (1,), scalar=True),
    _opt("num_return_sequences", "INT32", scalar=True),
    # encoder-decoder only; decoder-only engines ignore it
    _opt("decoder_input_ids", "INT32", (-1,), ragged=True),
    _opt("decoder_input_lengths", "INT32", scalar=True),
    *_scalars("INT32", "end_id", "pad_id"),
    _opt("stop_words_list", "INT32", (2, -1), ragged=True),
    _opt("bad_words_list", "INT32", (2, -1), ragged=True),
    _opt("embedding_bias", "FP32", (-1,), ragged=True),
    *_scalars("INT32", "beam_width"),
    *_scalars("FP32", "temperature"),
    *_scalars("INT32", "runtime_top_k"),
    *_scalars("FP32", "runtime_top_p", "runtime_top_p_decay"),
    *_scalars("INT32", "runtime_top_p_reset_ids"),
    *_scalars("FP32", "len_penalty"),
    *_scalars("BOOL", "early_stopping"),
    *_scalars("FP32", "repetition_penalty"),
    *_scalars("INT32", "min_tokens"),
    *_scalars("FP32", "beam_search_diversity_rate", "presence_penalty", "frequency_penalty"),
    *_scalars("UINT64", "seed"),
    *_scalars(
        "BOOL",
        "return_log_probs",
        "return_context_logits",
        "return_generation_logits",
        "return_perf_metrics",
        "exclude_input_in_output",
        "stop",
        "streaming",
    ),
    # The guide's kind (json, json_schema, regex, ebnf_grammar: GUIDE_TYPES) and the guide itself.
    _opt("guided_decoding_guide_type", "STRING", ragged=True),
    _opt("guided_decoding_guide", "STRING", ragged=True),
    # LoRA: the adapter's task id (0: the base model; the repository's adapters are 1, 2, ... as built),
    # or, on the GPU engine only, an adapter sent with the request (hf_lora_convert.py's two arrays).
    *_scalars("UINT64", "lora_task_id"),
    _opt("lora_weights", "FP16", (-1, -1), ragged=True),
    _opt("lora_config", "INT32", (-1, 3), ragged=True),
)
ENGINE_OUTPUTS = (
    Tensor("output_ids", "INT32", (-1, -1)),
    Tensor("sequence_length", "INT32", (-1,)),
    Tensor("cum_log_probs", "FP32", (-1,)),
    Tensor("output_log_probs", "FP32", (-1, -1)),
    Tensor("context_logits", "FP32", (-1, -1)),
    Tensor("generation_logits", "FP32", (-1, -1, -1)),
    Tensor("batch_index", "INT32", (1,)),
    Tensor("sequence_index", "INT32", (1,)),
    *(
        Tensor(name, "INT32", (1,))
        for name in (
            "kv_cache_alloc_new_blocks",
            "kv_cache_reused_blocks",
            "kv_cache_alloc_total_blocks",
        )
    ),
    *(
        Tensor(name, "INT64", (1,))
        for name in (
            "arrival_time_ns",
            "first_scheduled_time_ns",
            "first_token_time_ns",
            "last_token_time_ns",
        )
    ),
    Tensor("acceptance_rate", "FP32", (1,)),
    Tensor("total_accepted_draft_tokens", "INT32", (1,)),
    Tensor("total_draft_tokens", "INT32", (1,)),
)
# The backend's guide types (utils.cc), by the capabilities' guide kinds (toolkit.capabilities.GUIDE_KINDS).
GUIDE_TYPES = {
    "json_object": "json",
    "json_schema": "json_schema",
    "regex": "regex",
    "ebnf": "ebnf_grammar",
}

# --- ours, on the Python engines only ------------------------------------------------------------
OWN_ENGINE_INPUTS = (
    # With return_log_probs: how many most likely alternatives of each generated token to return too.
    _opt("num_top_logprobs", "INT32", scalar=True),
)
OWN_ENGINE_OUTPUTS = (
    # [tokens, num_top_logprobs] per response: the alternatives' ids and log probs, most likely first.
    Tensor("top_logprob_ids", "INT32", (-1, -1)),
    Tensor("top_logprobs", "FP32", (-1, -1)),
)
PYTHON_ENGINE_INPUTS = (*ENGINE_INPUTS, *OWN_ENGINE_INPUTS)
PYTHON_ENGINE_OUTPUTS = (*ENGINE_OUTPUTS, *OWN_ENGINE_OUTPUTS)

# Engine inputs that ask for a request feature (toolkit.capabilities.FEATURES), with the value that means
# "off": a value, EMPTY (no words in a word list, no non-zero bias: what the stock preprocessing sends
# when the client asks for none), or None (any value sent asks for it). An engine whose repository does
# not honour the feature refuses a request that asks for it (toolkit.targets.python.engine_refusals).
EMPTY = "empty"
ENGINE_INPUT_FEATURES: dict[str, tuple[str, object]] = {
    "beam_width": ("beam_width", 1),
    "len_penalty": ("beam_width", 1.0),  # applies to beam search only
    "early_stopping": ("beam_width", False),
    "beam_search_diversity_rate": ("beam_width", 0.0),
    "num_return_sequences": ("n", 1),
    "return_log_probs": ("logprobs", False),
    "return_context_logits": ("context_logits", False),
    "return_generation_logits": ("generation_logits", False),
    "repetition_penalty": ("penalties", 1.0),
    "presence_penalty": ("penalties", 0.0),
    "frequency_penalty": ("penalties", 0.0),
    "embedding_bias": ("logit_bias", EMPTY),
    "bad_words_list": ("bad_words", EMPTY),
    "runtime_top_p_decay": ("top_p_decay", None),
    "runtime_top_p_reset_ids": ("top_p_decay", None),
    "guided_decoding_guide_type": ("guided_decoding", None),
    "guided_decoding_guide": ("guided_decoding", None),
    "num_top_logprobs": ("top_logprobs", 0),
    "lora_task_id": ("lora", 0),
    "lora_weights": ("lora", None),
    "lora_config": ("lora", None),
}

# Inputs an earlier release reads under another name: pinned name -> (name, releases before which it applies).
_RENAMED = {
    "min_tokens": ("min_length", (0, 20)),
    "seed": ("random_seed", (0, 20)),
    "return_perf_metrics": ("return_kv_cache_reuse_stats", (0, 19)),
}


def engine_name(name: str, trtllm_version: str | None = None) -> str:
    """The name under which an engine of `trtllm_version` (default: the pinned release) reads input `name`."""
    renamed = _RENAMED.get(name)
    version = version_tuple(trtllm_version or PINNED_TRTLLM_VERSION)
    if renamed is None or version is None or version >= renamed[1]:
        return name
    return renamed[0]


# Inputs that a release before the one named does not have (TensorRT-LLM release notes; the backend's configs
# in tests/data/upstream/triton_backend.json).
_INTRODUCED = {
    "guided_decoding_guide_type": (0, 19),
    "guided_decoding_guide": (0, 19),
}


def has_input(name: str, trtllm_version: str | None = None) -> bool:
    """Whether an engine of `trtllm_version` (default: the pinned release) has input `name` at all."""
    version = version_tuple(trtllm_version or PINNED_TRTLLM_VERSION)
    return name not in _INTRODUCED or version is None or version >= _INTRODUCED[name]


def engine_inputs(trtllm_version: str | None = None) -> tuple[Tensor, ...]:
    return tuple(
        replace(t, name=engine_name(t.name, trtllm_version))
        for t in ENGINE_INPUTS
        if has_input(t.name, trtllm_version)
    )


def engine_renames(trtllm_version: str | None = None) -> dict[str, str]:
    """{pinned name: name this release reads} for the inputs whose names differ."""
    return {
        name: engine_name(name, trtllm_version)
        for name in _RENAMED
        if engine_name(name, trtllm_version) != name
    }


# --- preprocessing: text -> token ids ----------------------------------------------------------
PREPROCESSING_INPUTS = (
    Tensor("QUERY", "STRING", (1,)),
    Tensor("REQUEST_OUTPUT_LEN", "INT32", (1,)),
    _opt("BAD_WORDS_DICT", "STRING", (-1,)),
    _opt("STOP_WORDS_DICT", "STRING", (-1,)),
    _opt("EMBEDDING_BIAS_WORDS", "STRING", (-1,)),
    _opt("EMBEDDING_BIAS_WEIGHTS", "FP32", (-1,)),
    _opt("END_ID", "INT32"),
    _opt("PAD_ID", "INT32"),
    # ours: with min_tokens the model's other end tokens are not added as stop words
    _opt("MIN_TOKENS", "INT32"),
)
PREPROCESSING_OUTPUTS = (
    Tensor("INPUT_ID", "INT32", (-1,)),
    Tensor("REQUEST_INPUT_LEN", "INT32", (1,)),
    Tensor("DECODER_INPUT_ID", "INT32", (-1,)),
    Tensor("REQUEST_DECODER_INPUT_LEN", "INT32", (1,)),
    Tensor("BAD_WORDS_IDS", "INT32", (2, -1)),
    Tensor("STOP_WORDS_IDS", "INT32", (2, -1)),
    Tensor("EMBEDDING_BIAS", "FP32", (-1,)),
    Tensor("REQUEST_OUTPUT_LEN", "INT32", (-1,)),
    Tensor("OUT_END_ID", "INT32", (1,)),
    Tensor("OUT_PAD_ID", "INT32", (1,)),
)
# Ours, not in the stock models; optional, so stock clients never see them.
OWN_EXTENSIONS = {
    PREPROCESSING: ("MIN_TOKENS",),
    ENGINE: tuple(t.name for t in (*OWN_ENGINE_INPUTS, *OWN_ENGINE_OUTPUTS)),
}

# --- postprocessing: token ids -> text ---------------------------------------------------------
POSTPROCESSING_INPUTS = (
    Tensor("TOKENS_BATCH", "INT32", (-1, -1)),
    Tensor("SEQUENCE_LENGTH", "INT32", (-1,)),
)
POSTPROCESSING_OUTPUTS = (Tensor("OUTPUT", "STRING", (-1,)),)

# --- ensemble and BLS: the client-facing text API ----------------------------------------------
# (name, dtype, dims, the BLS reshapes it to a scalar) in the stock order.
_TEXT = (
    ("num_return_sequences", "INT32", (1,), True),
    ("bad_words", "STRING", (-1,), False),
    ("stop_words", "STRING", (-1,), False),
    ("exclude_input_in_output", "BOOL", (1,), False),
    ("end_id", "INT32", (1,), False),
    ("pad_id", "INT32", (1,), False),
    ("top_k", "INT32", (1,), False),
    ("top_p", "FP32", (1,), False),
    ("temperature", "FP32", (1,), False),
    ("length_penalty", "FP32", (1,), False),
    ("repetition_penalty", "FP32", (1,), False),
    ("min_tokens", "INT32", (1,), False),
    ("presence_penalty", "FP32", (1,), False),
    ("frequency_penalty", "FP32", (1,), False),
    ("seed", "UINT64", (1,), False),
    ("return_log_probs", "BOOL", (1,), True),
    ("return_context_logits", "BOOL", (1,), True),
    ("return_generation_logits", "BOOL", (1,), True),
    ("return_perf_metrics", "BOOL", (1,), True),
    ("beam_width", "INT32", (1,), False),
    ("stream", "BOOL", (1,), False),
    ("embedding_bias_words", "STRING", (-1,), False),
    ("embedding_bias_weights", "FP32", (-1,), False),
    ("lora_task_id", "UINT64", (1,), True),
)
# An adapter sent with the request (GPU engine): ragged on the ensemble and the BLS alike.
_LORA_RUNTIME = (("lora_weights", "FP16", (-1, -1)), ("lora_config", "INT32", (-1, 3)))
_REQUIRED_TEXT = (Tensor("text_input", "STRING", (1,)), Tensor("max_tokens", "INT32", (1,)))
_GUIDED = (
    "guided_decoding_guide_type",
    "guided_decoding_guide",
)  # ragged on the ensemble, not on the BLS
TEXT_INPUTS = (
    *_REQUIRED_TEXT,
    *(_opt(name, dtype, dims) for name, dtype, dims, _ in _TEXT),
    *(_opt(name, "STRING", ragged=True) for name in _GUIDED),
    *(_opt(name, dtype, dims, ragged=True) for name, dtype, dims in _LORA_RUNTIME),
)
BLS_INPUTS = (
    *_REQUIRED_TEXT,
    *(_opt(name, dtype, dims, scalar=reshaped) for name, dtype, dims, reshaped in _TEXT),
    *(_opt(name, "STRING") for name in _GUIDED),
    *(_opt(name, dtype, dims, ragged=True) for name, dtype, dims in _LORA_RUNTIME),
)
TEXT_OUTPUTS = (Tensor("text_output", "STRING", (-1,)), *ENGINE_OUTPUTS[2:])


def text_inputs(trtllm_version: str | None = None, bls: bool = False) -> tuple[Tensor, ...]:
    """The ensemble's (or BLS's) inputs for an engine of `trtllm_version`: none it could not pass on."""
    return tuple(
        t for t in (BLS_INPUTS if bls else TEXT_INPUTS) if has_input(t.name, trtllm_version)
    )


# Ensemble wiring, as in NVIDIA's ensemble:
# (step model, {step tensor: ensemble tensor}, {step output: ensemble tensor}).
PREPROCESSING_INPUT_MAP = {
    "QUERY": "text_input",
    "REQUEST_OUTPUT_LEN": "max_tokens",
    "BAD_WORDS_DICT": "bad_words",
    "STOP_WORDS_DICT": "stop_words",
    "EMBEDDING_BIAS_WORDS": "embedding_bias_words",
    "EMBEDDING_BIAS_WEIGHTS": "embedding_bias_weights",
    "END_ID": "end_id",
    "PAD_ID": "pad_id",
    "MIN_TOKENS": "min_tokens",
}
PREPROCESSING_OUTPUT_MAP = {
    "REQUEST_INPUT_LEN": "_REQUEST_INPUT_LEN",
    "INPUT_ID": "_INPUT_ID",
    "REQUEST_DECODER_INPUT_LEN": "_REQUEST_DECODER_INPUT_LEN",
    "DECODER_INPUT_ID": "_DECODER_INPUT_ID",
    "REQUEST_OUTPUT_LEN": "_REQUEST_OUTPUT_LEN",
    "STOP_WORDS_IDS": "_STOP_WORDS_IDS",
    "BAD_WORDS_IDS": "_BAD_WORDS_IDS",
    "EMBEDDING_BIAS": "_EMBEDDING_BIAS",
    "OUT_END_ID": "_PREPROCESSOR_END_ID",
    "OUT_PAD_ID": "_PREPROCESSOR_PAD_ID",
}
_ENGINE_FROM_TEXT = {
    "input_ids": "_INPUT_ID",
    "decoder_input_ids": "_DECODER_INPUT_ID",
    "input_lengths": "_REQUEST_INPUT_LEN",
    "decoder_input_lengths": "_REQUEST_DECODER_INPUT_LEN",
    "exclude_input_in_output": "exclude_input_in_output",
    "request_output_len": "_REQUEST_OUTPUT_LEN",
    "end_id": "_PREPROCESSOR_END_ID",
    "pad_id": "_PREPROCESSOR_PAD_ID",
    "embedding_bias": "_EMBEDDING_BIAS",
    "runtime_top_k": "top_k",
    "runtime_top_p": "top_p",
    "temperature": "temperature",
    "len_penalty": "length_penalty",
    "repetition_penalty": "repetition_penalty",
    "min_tokens": "min_tokens",
    "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
    "seed": "seed",
    "return_log_probs": "return_log_probs",
    "return_context_logits": "return_context_logits",
    "return_generation_logits": "return_generation_logits",
    "return_perf_metrics": "return_perf_metrics",
    "num_return_sequences": "num_return_sequences",
    "beam_width": "beam_width",
    "streaming": "stream",
    "stop_words_list": "_STOP_WORDS_IDS",
    "bad_words_list": "_BAD_WORDS_IDS",
    "guided_decoding_guide_type": "guided_decoding_guide_type",
    "guided_decoding_guide": "guided_decoding_guide",
    "lora_task_id": "lora_task_id",
    "lora_weights": "lora_weights",
    "lora_config": "lora_config",
}
ENGINE_OUTPUT_MAP = {
    "output_ids": "_TOKENS_BATCH",
    "sequence_length": "_SEQUENCE_LENGTH",
    **{t.name: t.name for t in ENGINE_OUTPUTS[2:]},
}
POSTPROCESSING_INPUT_MAP = {"TOKENS_BATCH": "_TOKENS_BATCH", "SEQUENCE_LENGTH": "_SEQUENCE_LENGTH"}
POSTPROCESSING_OUTPUT_MAP = {"OUTPUT": "text_output"}


def engine_input_map(trtllm_version: str | None = None) -> dict[str, str]:
    """The ensemble's tensorrt_llm step inputs, under the names an engine of `trtllm_version` reads."""
    return {
        engine_name(name, trtllm_version): source
        for name, source in _ENGINE_FROM_TEXT.items()
        if has_input(name, trtllm_version)
    }


# BLS: text inputs passed to tensorrt_llm unchanged but for their name (pinned names; the model renames
# them per release with its `engine_tensor_names` parameter).
BLS_PASSTHROUGH = {
    text: engine for engine, text in _ENGINE_FROM_TEXT.items() if not text.startswith("_")
}
