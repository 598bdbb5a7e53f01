"""The repository's tensor contract against NVIDIA's backend, transcribed independently into
tests/data/upstream/triton_backend.json (configs, C++ tensor names and metric families of the backend
revisions named there). Our contract is the stock one of the pinned release (TensorRT-LLM 0.20.0: the
backend code of revision c2e65b8) minus tensors left out on purpose, each named below with its reason."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from toolkit.repository import contract as c

RECORD = json.loads(
    (Path(__file__).parent / "data" / "upstream" / "triton_backend.json").read_text()
)
PINNED = RECORD["revisions"]["c2e65b8"]
FAMILY = {
    "multimodal",
    "encoder-decoder",
    "speculative",
    "retention",
    "disaggregated",
    "prompt-table",
    "lookahead",
    "unread",
}
# Stock tensors the toolkit leaves out (text-only decoder models), by reason. A client that sends one gets
# Triton's "unexpected input" error: refused, never silently ignored.
LEFT_OUT = {
    "encoder-decoder": {
        "encoder_input_features",
        "encoder_output_lengths",
        "decoder_text_input",
        "DECODER_QUERY",
        "cross_attention_mask",
        "skip_cross_attn_blocks",
    },
    "multimodal": {
        "IMAGE_BYTES",
        "IMAGE_URL",
        "VIDEO_BYTES",
        "PIXEL_VALUES",
        "IMAGE_SIZES",
        "IS_VIDEO_INPUT",
        "ASPECT_RATIO_IDS",
        "ASPECT_RATIO_MASK",
        "CROSS_ATTENTION_MASK",
        "ATTENTION_MASK",
        "IMAGE_GRID_THW",
        "VISION_INPUT_ID",
        "image_input",
        "image_bytes_input",
        "image_url_input",
        "video_bytes_input",
        "mrope_rotary_cos_sin",
        "mrope_position_deltas",
        "prompt_embedding_table",
        "prompt_vocab_size",
    },
    "prompt-table": {
        "prompt_table_extra_ids",
        "prompt_table_extra_id",
        "PROMPT_TABLE_EXTRA_ID",
        "OUT_PROMPT_TABLE_EXTRA_IDS",
    },
    "speculative": {
        "draft_input_ids",
        "draft_logits",
        "draft_acceptance_threshold",
        "num_draft_tokens",
        "use_draft_logits",
    },
    "retention": {
        "retention_token_range_starts",
        "retention_token_range_ends",
        "retention_token_range_priorities",
        "retention_token_range_durations_ms",
        "retention_decode_priority",
        "retention_decode_duration_ms",
    },
    "lookahead": {
        "lookahead_window_size",
        "lookahead_ngram_size",
        "lookahead_verification_set_size",
    },
    "disaggregated": {"context_phase_params"},
    # Declared by the stock config, read by no C++ of the pinned backend: utils.h maps top-p-min to
    # "runtime_top_k_min" (an upstream typo), so a value sent would be accepted and silently ignored.
    "unread": {"runtime_top_p_min"},
}
LEFT_OUT_NAMES = set().union(*LEFT_OUT.values())
# Declared by the stock tensorrt_llm config but read by no C++ of the backend, kept because the stock ensemble
# feeds it: the decoder-input length of encoder-decoder models, meaningless to a decoder-only engine (the CPU
# engine ignores it as the GPU backend does). runtime_top_p_min is left out instead (LEFT_OUT["unread"]).
DECLARED_BUT_UNREAD = {"decoder_input_lengths"}
OURS = {
    c.ENGINE: (c.ENGINE_INPUTS, c.ENGINE_OUTPUTS),
    c.PREPROCESSING: (c.PREPROCESSING_INPUTS, c.PREPROCESSING_OUTPUTS),
    c.POSTPROCESSING: (c.POSTPROCESSING_INPUTS, c.POSTPROCESSING_OUTPUTS),
    c.ENSEMBLE: (c.TEXT_INPUTS, c.TEXT_OUTPUTS),
    c.BLS: (c.BLS_INPUTS, c.TEXT_OUTPUTS),
}


def _dims(upstream: dict) -> tuple:
    return tuple(upstream["dims"])


@pytest.mark.parametrize("model", sorted(OURS))
def test_every_tensor_we_declare_is_the_stock_one(model):
    inputs, outputs = OURS[model]
    stock = PINNED["models"][model]
    stock_in = {t["name"]: t for t in stock["inputs"]}
    own = set(c.OWN_EXTENSIONS.get(model, ()))
    for tensor in inputs:
        if tensor.name in own:
            assert tensor.optional, f"{model}.{tensor.name}: our extensions must be optional"
            continue
        up = stock_in.get(tensor.name)
        assert up is not None, f"{model} input {tensor.name} is not in the stock config"
        assert (tensor.dtype, tensor.dims) == (up["data_type"], _dims(up)), f"{model}.{tensor.name}"
        assert tensor.optional == up.get("optional", False), f"{model}.{tensor.name} optional"
        assert tensor.scalar == ("reshape" in up), f"{model}.{tensor.name} reshape"
        assert tensor.ragged == up.get("ragged", False), f"{model}.{tensor.name} ragged"
    stock_out = {t["name"]: t for t in stock["outputs"]}
    for tensor in outputs:
        up = stock_out.get(tensor.name)
        assert up is not None, f"{model} output {tensor.name} is not in the stock config"
        assert tensor.dims == _dims(up), f"{model}.{tensor.name}"
        # Logits are ${logits_datatype} upstream (FP32 unless the engine says otherwise).
        assert tensor.dtype == up["data_type"] or up["data_type"].startswith("${"), (
            f"{model}.{tensor.name}"
        )


def test_the_python_engines_declare_the_stock_tensors_and_only_optional_ones_of_their_own():
    own = set(c.OWN_EXTENSIONS[c.ENGINE])
    extra_in = [t for t in c.PYTHON_ENGINE_INPUTS if t not in c.ENGINE_INPUTS]
    extra_out = [t for t in c.PYTHON_ENGINE_OUTPUTS if t not in c.ENGINE_OUTPUTS]
    assert {t.name for t in (*extra_in, *extra_out)} == own
    assert all(t.optional for t in extra_in)
    stock = PINNED["models"][c.ENGINE]
    stock_names = {t["name"] for t in (*stock["inputs"], *stock["outputs"])}
    assert not own & stock_names, "an extension of ours must not take a stock tensor's name"


def test_our_guide_kinds_are_the_backend_s_guide_types():
    """An unknown guide type is silently ignored by the backend (the request runs unconstrained)."""
    from toolkit.capabilities import GUIDE_KINDS

    backend_types = PINNED["guided_decoding"]["guide_types"]
    assert set(c.GUIDE_TYPES) == set(GUIDE_KINDS)
    assert set(c.GUIDE_TYPES.values()) == set(backend_types)


@pytest.mark.parametrize("model", sorted(OURS))
def test_every_stock_tensor_we_leave_out_has_a_reason(model):
    inputs, outputs = OURS[model]
    declared = {t.name for t in (*inputs, *outputs)}
    stock = PINNED["models"][model]
    missing = {t["name"] for t in (*stock["inputs"], *stock["outputs"])} - declared
    assert missing <= LEFT_OUT_NAMES, (
        f"{model} leaves out {missing - LEFT_OUT_NAMES} with no reason"
    )


def test_the_pinned_backend_reads_every_engine_input_we_declare():
    """A name the C++ backend does not read would be accepted by Triton and silently ignored."""
    names = PINNED["cpp_tensor_names"]
    read = set(names["inputs"]) | set(names["other"])
    unread = {t.name for t in c.engine_inputs()} - read
    assert unread == DECLARED_BUT_UNREAD
    assert {t.name for t in c.ENGINE_OUTPUTS} <= set(names["outputs"])


@pytest.mark.parametrize(
    ("version", "revision"), [("0.17.0", "v0.17.0"), ("0.18.2", "v0.18.2"), ("0.19.0", "v0.19.0")]
)
def test_engines_of_earlier_releases_get_the_names_they_read(version, revision):
    rev = RECORD["revisions"][revision]
    read = set(rev["cpp_tensor_names"]["inputs"]) | set(rev["cpp_tensor_names"]["other"])
    declared = {t["name"] for t in rev["models"][c.ENGINE]["inputs"]}
    ours = {t.name for t in c.engine_inputs(version)}
    assert ours - DECLARED_BUT_UNREAD <= read, f"{version} would ignore {ours - read}"
    assert ours <= declared
    assert (
        c.engine_name("min_tokens", version) == "min_length"
        and c.engine_name("seed", version) == "random_seed"
    )
    for name in c.engine_input_map(version):
        assert name in declared, f"the ensemble would feed {name}, which {version} does not declare"


def test_the_ensemble_is_wired_as_the_stock_one():
    steps = {s["model_name"]: s for s in PINNED["models"][c.ENSEMBLE]["ensemble_steps"]}
    ours = {
        c.PREPROCESSING: (c.PREPROCESSING_INPUT_MAP, c.PREPROCESSING_OUTPUT_MAP),
        c.ENGINE: (c.engine_input_map(), c.ENGINE_OUTPUT_MAP),
        c.POSTPROCESSING: (c.POSTPROCESSING_INPUT_MAP, c.POSTPROCESSING_OUTPUT_MAP),
    }
    for model, (inputs, outputs) in ours.items():
        stock_in = {k: v for k, v in steps[model]["input_map"].items() if k not in LEFT_OUT_NAMES}
        own = set(c.OWN_EXTENSIONS.get(model, ()))
        assert {k: v for k, v in inputs.items() if k not in own} == stock_in, model
        stock_out = {k: v for k, v in steps[model]["output_map"].items() if k not in LEFT_OUT_NAMES}
        assert outputs == stock_out, model


def test_decoupled_where_the_stock_models_are():
    for model in (c.ENGINE, c.BLS):
        assert PINNED["models"][model]["decoupled"] == "${decoupled_mode}"
    for model in (c.PREPROCESSING, c.POSTPROCESSING):
        assert "decoupled" not in PINNED["models"][model]


def test_the_python_engines_export_the_backend_metric_families():
    import sys

    from toolkit.repository.sources import model_repo_sources

    sys.path.insert(0, str(model_repo_sources() / "common"))
    from engine_metrics import COUNTERS, GAUGES, HISTOGRAMS, TOKEN_LEN_BUCKETS

    metrics = PINNED["metrics"]
    vectors = metrics["vectors"]
    for name, family in metrics["families"].items():
        labels = tuple(vectors[family["labels"]])
        if family["kind"] == "gauge":
            assert GAUGES[name] == (family["category"], labels), name
        elif family["kind"] == "counter":
            assert COUNTERS[name] == (family["category"], labels), name
        else:
            assert (
                HISTOGRAMS[name] == (family["category"], labels[0])
                and family["buckets"] == TOKEN_LEN_BUCKETS
            ), name
    assert set(GAUGES) | set(COUNTERS) | set(HISTOGRAMS) == set(metrics["families"])
