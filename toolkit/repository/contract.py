"""Tensor contract of the TensorRT-LLM backend's inflight_batcher_llm layout.

Names, dtypes and dims follow NVIDIA's `triton_backend/all_models/inflight_batcher_llm/*/config.pbtxt`
(TensorRT-LLM 0.17 to 1.2), restricted to text-only decoder models: the multimodal, encoder-decoder,
LoRA, speculative-decoding and guided-decoding tensors are left out. A client written for NVIDIA's
stock ensemble sends the same tensors to ours.
"""

from __future__ import annotations

from dataclasses import dataclass

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
    dtype: str  # Triton DataType name without the TYPE_ prefix: INT32, FP32, BOOL, STRING, UINT64
    dims: tuple[int, ...]
    optional: bool = False
    scalar: bool = False  # reshape: { shape: [ ] }: the model sees [batch] instead of [batch, 1]
    ragged: bool = False  # allow_ragged_batch


def _opt(name: str, dtype: str, dims: tuple[int, ...] = (1,), **kw) -> Tensor:
    return Tensor(name, dtype, dims, optional=True, **kw)


# --- tensorrt_llm: the engine ------------------------------------------------------------------
ENGINE_INPUTS = (
    Tensor("input_ids", "INT32", (-1,), optional=True, ragged=True),
    Tensor("input_lengths", "INT32", (1,), scalar=True),
    Tensor("request_output_len", "INT32", (1,), scalar=True),
    _opt("num_return_sequences", "INT32", scalar=True),
    _opt("end_id", "INT32", scalar=True),
    _opt("pad_id", "INT32", scalar=True),
    _opt("stop_words_list", "INT32", (2, -1), ragged=True),
    _opt("bad_words_list", "INT32", (2, -1), ragged=True),
    _opt("embedding_bias", "FP32", (-1,), ragged=True),
    _opt("beam_width", "INT32", scalar=True),
    _opt("temperature", "FP32", scalar=True),
    _opt("runtime_top_k", "INT32", scalar=True),
    _opt("runtime_top_p", "FP32", scalar=True),
    _opt("len_penalty", "FP32", scalar=True),
    _opt("repetition_penalty", "FP32", scalar=True),
    _opt("min_tokens", "INT32", scalar=True),
    _opt("presence_penalty", "FP32", scalar=True),
    _opt("frequency_penalty", "FP32", scalar=True),
    _opt("seed", "UINT64", scalar=True),
    _opt("return_log_probs", "BOOL", scalar=True),
    _opt("return_context_logits", "BOOL", scalar=True),
    _opt("return_generation_logits", "BOOL", scalar=True),
    _opt("return_num_input_tokens", "BOOL", scalar=True),
    _opt("return_num_output_tokens", "BOOL", scalar=True),
    _opt("exclude_input_in_output", "BOOL", scalar=True),
    _opt("stop", "BOOL", scalar=True),
    _opt("streaming", "BOOL", scalar=True),
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
    Tensor("num_input_tokens", "INT32", (1,)),
    Tensor("num_output_tokens", "INT32", (1,)),
)

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
    _opt(
        "MIN_TOKENS", "INT32"
    ),  # ours: with min_tokens the model's other end tokens are not added as stop words
)
PREPROCESSING_OUTPUTS = (
    Tensor("INPUT_ID", "INT32", (-1,)),
    Tensor("REQUEST_INPUT_LEN", "INT32", (1,)),
    Tensor("BAD_WORDS_IDS", "INT32", (2, -1)),
    Tensor("STOP_WORDS_IDS", "INT32", (2, -1)),
    Tensor("EMBEDDING_BIAS", "FP32", (-1,)),
    Tensor("REQUEST_OUTPUT_LEN", "INT32", (-1,)),
    Tensor("OUT_END_ID", "INT32", (1,)),
    Tensor("OUT_PAD_ID", "INT32", (1,)),
)

# --- postprocessing: token ids -> text ---------------------------------------------------------
POSTPROCESSING_INPUTS = (
    Tensor("TOKENS_BATCH", "INT32", (-1, -1)),
    Tensor("SEQUENCE_LENGTH", "INT32", (-1,)),
)
POSTPROCESSING_OUTPUTS = (Tensor("OUTPUT", "STRING", (-1,)),)

# --- ensemble and BLS: the client-facing text API ----------------------------------------------
TEXT_INPUTS = (
    Tensor("text_input", "STRING", (1,)),
    Tensor("max_tokens", "INT32", (1,)),
    _opt("num_return_sequences", "INT32"),
    _opt("bad_words", "STRING", (-1,)),
    _opt("stop_words", "STRING", (-1,)),
    _opt("exclude_input_in_output", "BOOL"),
    _opt("end_id", "INT32"),
    _opt("pad_id", "INT32"),
    _opt("top_k", "INT32"),
    _opt("top_p", "FP32"),
    _opt("temperature", "FP32"),
    _opt("length_penalty", "FP32"),
    _opt("repetition_penalty", "FP32"),
    _opt("min_tokens", "INT32"),
    _opt("presence_penalty", "FP32"),
    _opt("frequency_penalty", "FP32"),
    _opt("seed", "UINT64"),
    _opt("return_log_probs", "BOOL"),
    _opt("return_context_logits", "BOOL"),
    _opt("return_generation_logits", "BOOL"),
    _opt("return_num_input_tokens", "BOOL"),
    _opt("return_num_output_tokens", "BOOL"),
    _opt("beam_width", "INT32"),
    _opt("stream", "BOOL"),
    _opt("embedding_bias_words", "STRING", (-1,)),
    _opt("embedding_bias_weights", "FP32", (-1,)),
)
TEXT_OUTPUTS = (
    Tensor("text_output", "STRING", (-1,)),
    Tensor("cum_log_probs", "FP32", (-1,)),
    Tensor("output_log_probs", "FP32", (-1, -1)),
    Tensor("context_logits", "FP32", (-1, -1)),
    Tensor("generation_logits", "FP32", (-1, -1, -1)),
    Tensor("batch_index", "INT32", (1,)),
    Tensor("sequence_index", "INT32", (1,)),
    Tensor("num_input_tokens", "INT32", (1,)),
    Tensor("num_output_tokens", "INT32", (1,)),
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
    "REQUEST_OUTPUT_LEN": "_REQUEST_OUTPUT_LEN",
    "STOP_WORDS_IDS": "_STOP_WORDS_IDS",
    "BAD_WORDS_IDS": "_BAD_WORDS_IDS",
    "EMBEDDING_BIAS": "_EMBEDDING_BIAS",
    "OUT_END_ID": "_PREPROCESSOR_END_ID",
    "OUT_PAD_ID": "_PREPROCESSOR_PAD_ID",
}
ENGINE_INPUT_MAP = {
    "input_ids": "_INPUT_ID",
    "input_lengths": "_REQUEST_INPUT_LEN",
    "request_output_len": "_REQUEST_OUTPUT_LEN",
    "exclude_input_in_output": "exclude_input_in_output",
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
    "return_num_input_tokens": "return_num_input_tokens",
    "return_num_output_tokens": "return_num_output_tokens",
    "num_return_sequences": "num_return_sequences",
    "beam_width": "beam_width",
    "streaming": "stream",
    "stop_words_list": "_STOP_WORDS_IDS",
    "bad_words_list": "_BAD_WORDS_IDS",
}
ENGINE_OUTPUT_MAP = {
    "output_ids": "_TOKENS_BATCH",
    "sequence_length": "_SEQUENCE_LENGTH",
    "cum_log_probs": "cum_log_probs",
    "output_log_probs": "output_log_probs",
    "context_logits": "context_logits",
    "generation_logits": "generation_logits",
    "batch_index": "batch_index",
    "sequence_index": "sequence_index",
    "num_input_tokens": "num_input_tokens",
    "num_output_tokens": "num_output_tokens",
}
POSTPROCESSING_INPUT_MAP = {"TOKENS_BATCH": "_TOKENS_BATCH", "SEQUENCE_LENGTH": "_SEQUENCE_LENGTH"}
POSTPROCESSING_OUTPUT_MAP = {"OUTPUT": "text_output"}
