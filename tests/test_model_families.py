"""The model families H100 users bring, each planned and dry-run from its public config.json (catalog entries
with their hub ids): converter and flags against the upstream record of the tools' argparse, windows, memory.
Published parameter counts are the model cards'; the converter facts are tests/data/upstream/trtllm_tools.json."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from toolkit.cli.main import cli
from toolkit.engine.trtllm_flags import tool_of
from toolkit.errors import EngineBuildError, PlanError, RecipeError, UnsupportedModelError
from toolkit.model.catalog import catalog_entry
from toolkit.model.facts import facts_from_config
from toolkit.model.tokens import read_token_facts
from toolkit.plan import get_gpu, load_model_for_plan
from toolkit.recipes import list_recipes

from fakes import fake_checkpoint, install_fake_trtllm
from fakes.upstream_argparse import RECORD, upstream_flags, upstream_parser
from repos import gpu_engine_plan
from tiny import make_tiny_checkpoint

UPSTREAM = json.loads(RECORD.read_text())
LLAMA_8B = Path(__file__).parent / "data" / "llama-3.1-8b-instruct" / "config.json"


def invoke(*args: str):
    return CliRunner().invoke(cli, list(args))


def tool_args(argv) -> tuple[str, list[str]]:
    """The upstream record's tool an argv runs (by the script's ending), and its arguments."""
    return tool_of(list(argv))


def parsed_by_upstream(argv):
    tool, args = tool_args(argv)
    return upstream_parser(tool).parse_args(
        args
    )  # exits on any flag or value the real tool refuses


# catalog name, converter tool, published parameter count (model card / safetensors total), PP allowed
FAMILIES = [
    ("qwen2.5-1.5b-instruct", "qwen/convert_checkpoint.py", 1_543_714_304, True),
    ("llama-3.2-1b-instruct", "llama/convert_checkpoint.py", 1_235_814_400, True),
    ("mistral-7b-instruct-v0.1", "llama/convert_checkpoint.py", 7_241_732_096, True),
    ("mistral-nemo-instruct-2407", "llama/convert_checkpoint.py", 12_247_782_400, True),
    ("mixtral-8x7b-instruct", "llama/convert_checkpoint.py", 46_702_792_704, True),
    ("gemma-2-9b-it", "gemma/convert_checkpoint.py", 9_241_705_984, False),
    ("gemma-3-1b-it", "gemma/convert_checkpoint.py", 999_885_952, False),
    ("phi-3.5-mini-instruct", "phi/convert_checkpoint.py", 3_821_079_552, False),
    ("phi-4", "phi/convert_checkpoint.py", 14_659_507_200, False),
    ("deepseek-r1-distill-llama-8b", "llama/convert_checkpoint.py", 8_030_261_248, True),
]


@pytest.mark.parametrize(("name", "tool", "parameters", "pp"), FAMILIES)
def test_each_family_dry_runs_through_its_converter_with_flags_upstream_takes(
    name, tool, parameters, pp
):
    facts = load_model_for_plan(name).facts
    assert facts.parameter_count == parameters
    plan = gpu_engine_plan(name, "h100-sxm", dtype="bf16", tp=2)
    convert, build = plan.commands
    assert tool_args(convert)[0] == tool and plan.step_names == ("convert", "trtllm-build")
    args = parsed_by_upstream(convert)
    parsed_by_upstream(build)
    flags = set(upstream_flags(tool))
    assert {a.lstrip("-") for a in convert if a.startswith("--")} <= flags | {
        "model_dir",
        "output_dir",
    }
    assert args.tp_size == 2 if "tp_size" in flags else args.world_size == 2
    if not pp:
        with pytest.raises(RecipeError, match="tensor parallelism only"):
            gpu_engine_plan(name, "h100-sxm", dtype="bf16", pp=2)


def test_gemma_goes_through_its_own_cli():
    convert = gpu_engine_plan("gemma-3-1b-it", "h100-sxm", tp=2).commands[0]
    args = parsed_by_upstream(convert)
    assert args.ckpt_type == "hf" and args.world_size == 2  # the converter's own names
    assert "--tp_size" not in convert and "--workers" not in convert
    assert args.output_model_dir == convert[convert.index("--output-model-dir") + 1]


def test_mistral_v01_window_is_4096_and_v03_has_none():
    plan = gpu_engine_plan("mistral-7b-instruct-v0.1", "h100-sxm")
    assert plan.memory.max_seq_len == 8192
    assert plan.runtime.max_attention_window_size == (4096,)
    assert (
        gpu_engine_plan("mistral-7b-instruct-v0.3", "h100-sxm").runtime.max_attention_window_size
        == ()
    )
    # A window no shorter than the sequence changes nothing: Phi-3.5's 262144 on an 8192-token engine.
    assert (
        gpu_engine_plan("phi-3.5-mini-instruct", "h100-sxm").runtime.max_attention_window_size == ()
    )


def test_gemma3_1b_has_its_per_layer_windows():
    """5 local layers of 512 tokens, then a global one (sliding_window_pattern 6), for all 26 layers."""
    plan = gpu_engine_plan("gemma-3-1b-it", "h100-sxm", max_seq_len=4096)
    windows = plan.runtime.max_attention_window_size
    assert len(windows) == 26
    assert [i for i, w in enumerate(windows) if w == 4096] == [5, 11, 17, 23]
    assert set(windows) == {512, 4096}
    assert "22 of 26 layers attend to the last 512 tokens" in " ".join(plan.memory.notes)


def test_gemma2_keeps_the_4096_tokens_its_readme_allows():
    assert gpu_engine_plan("gemma-2-9b-it", "h100-sxm").memory.max_seq_len == 4096
    with pytest.raises(PlanError, match=r"outside 2\.\.4096 .*gemma/README.md") as err:
        gpu_engine_plan("gemma-2-9b-it", "h100-sxm", max_seq_len=8192)
    assert "--max-seq-len between 2 and 4096" in err.value.hint


def test_mixtral_plan_counts_all_experts_in_memory_and_routed_ones_per_decode_step():
    result = invoke(
        "plan", "-m", "mixtral-8x7b-instruct", "-g", "h100-sxm", "--dtype", "fp8", "--json"
    )
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)
    total, active = 46_702_792_704, 12_879_925_248
    assert plan["parameter_count"] == total and plan["active_parameter_count"] == active
    assert (plan["num_experts"], plan["experts_per_token"]) == (8, 2)
    embeddings_and_norms = 2 * 32000 * 4096 + (2 * 32 + 1) * 4096  # embedding, LM head, norms: bf16
    assert plan["weights_bytes"] == (total - embeddings_and_norms) * 1 + embeddings_and_norms * 2
    # Batch 1 reads attention, routers and 2 of the 8 experts of each layer: the active parameters' bytes.
    read = (active - embeddings_and_norms) * 1 + embeddings_and_norms * 2
    assert plan["decode_step_ms_lower_bound"] == pytest.approx(read / 3.35e12 * 1e3, rel=1e-6)
    shown = invoke("plan", "-m", "mixtral-8x7b-instruct", "-g", "h100-sxm", "--dtype", "fp8")
    assert shown.exit_code == 0, shown.output
    assert (
        "memory holds all 8 experts" in shown.output
        and "only the 2 routed per token" in shown.output
    )


def test_mixtral_experts_go_expert_parallel_on_request():
    plan = gpu_engine_plan("mixtral-8x7b-instruct", "h100-sxm", dtype="fp8", kv_dtype="fp8", tp=2)
    assert plan.step_names == ("quantize", "trtllm-build")
    convert = gpu_engine_plan("mixtral-8x7b-instruct", "h100-sxm", tp=4, moe_ep_size=2).commands[0]
    args = parsed_by_upstream(convert)
    assert (args.tp_size, args.moe_tp_size, args.moe_ep_size) == (4, 2, 2)
    with pytest.raises(EngineBuildError, match="dense model"):
        gpu_engine_plan("mistral-7b-instruct-v0.3", "h100-sxm", tp=2, moe_ep_size=2)
    with pytest.raises(RecipeError, match="AutoAWQ checkpoint"):
        gpu_engine_plan("mixtral-8x7b-instruct", "h100-sxm", dtype="int4-awq", tp=2)
    with pytest.raises(RecipeError, match="Phi README"):
        gpu_engine_plan("phi-4", "h100-sxm", dtype="int4-awq")


def test_reasoning_distill_gets_room_for_its_answers():
    plan = gpu_engine_plan("deepseek-r1-distill-llama-8b", "h100-sxm", dtype="fp8", kv_dtype="fp8")
    assert plan.memory.max_seq_len == 32768 + 4096
    assert gpu_engine_plan("llama-3.1-8b-instruct", "h100-sxm").memory.max_seq_len == 8192


@pytest.mark.parametrize(
    ("architecture", "release"),
    [
        ("Qwen3ForCausalLM", "TensorRT-LLM 1.0"),
        ("Qwen3MoeForCausalLM", "TensorRT-LLM 1.0"),
        ("GptOssForCausalLM", "TensorRT-LLM 1.1"),
    ],
)
def test_families_the_engine_flow_cannot_build_are_refused_naming_release_and_way_out(
    tmp_path, architecture, release
):
    config = {
        "architectures": [architecture],
        "hidden_size": 2048,
        "intermediate_size": 6144,
        "num_hidden_layers": 4,
        "num_attention_heads": 32,
        "num_key_value_heads": 4,
        "head_dim": 128,
        "vocab_size": 151936,
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    result = invoke("plan", "-m", str(tmp_path / "config.json"), "-g", "h100-sxm")
    assert result.exit_code == 1
    assert (
        f"Error: {architecture}" in result.stderr
        and "is not built by TensorRT-LLM 0.20" in result.stderr
    )
    assert release in result.stderr and "fix:" in result.stderr
    assert "--target cpu" in result.stderr or "trtllm-serve" in result.stderr
    assert facts_from_config(config).head_dim == 128  # the CPU target still reads it


@pytest.mark.parametrize(
    "architecture", ["DeepseekV3ForCausalLM", "Gemma3ForConditionalGeneration"]
)
def test_what_no_target_serves_is_refused_everywhere(architecture):
    with pytest.raises(UnsupportedModelError, match=f"{architecture}.*not served") as err:
        facts_from_config({"architectures": [architecture]})
    assert "trtllm-serve" in err.value.hint


# --- pre-quantized checkpoints ------------------------------------------------------------------
MODELOPT_FP8 = {
    "quant_method": "modelopt",
    "quant_algo": "FP8",
    "kv_cache_scheme": {"num_bits": 8, "type": "float", "dynamic": False},
    "ignore": ["lm_head"],
}


def prequantized(tmp_path: Path, base: Path | dict, section: dict | None, name="ckpt") -> Path:
    folder = tmp_path / name
    folder.mkdir()
    config = json.loads(base.read_text()) if isinstance(base, Path) else dict(base)
    if section is not None:
        config["quantization_config"] = section
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_a_modelopt_fp8_checkpoint_is_converted_in_fp8_without_a_quantize_step(tmp_path):
    folder = prequantized(tmp_path, LLAMA_8B, MODELOPT_FP8)
    plan = gpu_engine_plan(folder, "h100-sxm")
    assert plan.step_names == ("convert", "trtllm-build")
    convert = plan.commands[0]
    assert not any(a.endswith("quantize.py") for a in convert)
    args = parsed_by_upstream(convert)
    assert args.use_fp8 and args.fp8_kv_cache  # the upstream harness's flags for FP8 weights and KV
    assert UPSTREAM["prequantized_conversion"]["flags"]["FP8"] == ["--use_fp8"]
    assert (plan.memory.dtype, plan.memory.kv_dtype) == ("fp8", "fp8")
    fp8 = gpu_engine_plan(LLAMA_8B, "h100-sxm", dtype="fp8", kv_dtype="fp8")
    assert plan.memory.weights_bytes == fp8.memory.weights_bytes  # FP8 weights, not bf16
    assert plan.memory.stored_quantization == "ModelOpt FP8"
    with pytest.raises(RecipeError, match="stored as ModelOpt FP8"):
        gpu_engine_plan(folder, "h100-sxm", dtype="bf16")


def test_the_legacy_hf_quant_config_file_is_read_too(tmp_path):
    folder = prequantized(tmp_path, LLAMA_8B, None)
    (folder / "hf_quant_config.json").write_text(
        json.dumps({"producer": {"name": "modelopt"}, "quantization": {"quant_algo": "FP8"}})
    )
    plan = gpu_engine_plan(folder, "h100-sxm")
    assert plan.memory.dtype == "fp8" and plan.memory.kv_dtype == "bf16"
    assert "--fp8_kv_cache" not in plan.commands[0]
    with pytest.raises(RecipeError, match="no FP8 KV-cache scales"):
        gpu_engine_plan(folder, "h100-sxm", kv_dtype="fp8")


def test_awq_and_gptq_int4_checkpoints_convert_with_the_harness_flags(tmp_path):
    qwen = catalog_entry("qwen2.5-7b-instruct").config
    awq = {
        "quant_method": "awq",
        "bits": 4,
        "group_size": 128,
        "zero_point": True,
        "version": "gemm",
    }
    plan = gpu_engine_plan(prequantized(tmp_path, qwen, awq, "awq"), "h100-sxm")
    assert plan.memory.dtype == "int4-awq" and plan.step_names[0] == "convert"
    assert tool_args(plan.commands[0])[0] == "qwen/convert_checkpoint.py"
    assert not parsed_by_upstream(plan.commands[0]).use_weight_only  # AutoAWQ: read from its config
    gptq = {"quant_method": "gptq", "bits": 4, "group_size": 64, "desc_act": False}
    plan = gpu_engine_plan(prequantized(tmp_path, LLAMA_8B, gptq, "gptq"), "h100-sxm")
    args = parsed_by_upstream(plan.commands[0])
    assert plan.memory.dtype == "int4-gptq"
    assert args.use_weight_only and args.weight_only_precision == "int4_gptq" and args.per_group
    assert args.group_size == 64


def test_formats_the_converter_cannot_take_are_refused_by_name(tmp_path):
    tensors = {"quant_method": "compressed-tensors", "format": "float-quantized"}
    with pytest.raises(UnsupportedModelError, match="compressed-tensors") as err:
        gpu_engine_plan(prequantized(tmp_path, LLAMA_8B, tensors, "ct"), "h100-sxm")
    assert "unquantized" in err.value.hint
    gemma = catalog_entry("gemma-3-1b-it").config
    with pytest.raises(UnsupportedModelError, match="ModelOpt FP8.*gemma3_text converter"):
        gpu_engine_plan(prequantized(tmp_path, gemma, MODELOPT_FP8, "gemma"), "h100-sxm")
    nvfp4 = {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16}
    with pytest.raises(PlanError, match="no FP4 tensor cores.*Blackwell"):
        gpu_engine_plan(prequantized(tmp_path, LLAMA_8B, nvfp4, "fp4"), "h100-sxm")


# --- end ids ------------------------------------------------------------------------------------
def test_end_ids_are_the_union_of_tokenizer_config_and_generation_config(tmp_path):
    """Gemma-style: config.json names <eos> (2 here), generation_config.json the turn end only (3): both stop."""
    folder = make_tiny_checkpoint(tmp_path / "tiny")  # eos_token <|im_end|> = 2
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "eos_token_id": 0}))
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [1]}))
    tokens = read_token_facts(folder)
    assert tokens.end_id == 2 and set(tokens.stop_ids) == {0, 1}


# --- recipes ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "recipe",
    [r for r in list_recipes() if r.endswith(("h100-sxm-bf16", "h100-sxm-fp8"))],
)
def test_every_h100_recipe_dry_runs(recipe):
    result = invoke("build", "--recipe", recipe, "--dry-run", "--json")
    assert result.exit_code == 0, result.output
    for argv in json.loads(result.stdout)["commands"]:
        parsed_by_upstream(argv)


def test_a_recipe_per_family_on_h100():
    models = {
        catalog_entry(name).hub_id
        for name in ("gemma-3-1b-it", "gemma-2-9b-it", "phi-4", "mixtral-8x7b-instruct")
    }
    models |= {"mistralai/Mistral-7B-Instruct-v0.1", "Qwen/Qwen2.5-7B-Instruct"}
    models |= {"deepseek-ai/DeepSeek-R1-Distill-Llama-8B", "meta-llama/Llama-3.1-8B-Instruct"}
    texts = [p.read_text() for p in (Path(__file__).parents[1] / "build").glob("*h100-sxm*.yaml")]
    for hub_id in models:
        assert any(f"model: hf:{hub_id}\n" in text for text in texts), hub_id


# --- the fake tools take what the real ones take: a Gemma 3 build, packaged ----------------------
def test_gemma3_build_writes_the_per_layer_windows_the_backend_parses(monkeypatch, tmp_path):
    install_fake_trtllm(monkeypatch, tmp_path)
    config = tmp_path / "gemma3.json"
    config.write_text(json.dumps(catalog_entry("gemma-3-1b-it").config))
    folder = fake_checkpoint(tmp_path, config)
    tiny = make_tiny_checkpoint(tmp_path / "tiny")
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(tiny / name, folder / name)
    repo = tmp_path / "repo"
    result = invoke(
        "build",
        "-t",
        "h100-sxm",
        "-m",
        str(folder),
        "--max-seq-len",
        "2048",
        "-o",
        str(repo),
        "--json",
    )
    assert result.exit_code == 0, result.output
    text = (repo / "tensorrt_llm" / "config.pbtxt").read_text()
    value = re.search(
        r'key: "max_attention_window_size"\s*value \{\s*string_value: "([^"]+)"', text
    )
    assert value is not None, text
    # The backend's parse (utils::csvStrToVecInt of the parameter string): comma-separated int32.
    pinned = UPSTREAM_BACKEND["revisions"]["c2e65b8"]["parameter_formats"][
        "max_attention_window_size"
    ]
    assert pinned["separator"] == ","
    windows = [int(v) for v in value.group(1).split(pinned["separator"])]
    assert windows == [2048 if (i + 1) % 6 == 0 else 512 for i in range(26)]


UPSTREAM_BACKEND = json.loads(
    (Path(__file__).parent / "data" / "upstream" / "triton_backend.json").read_text()
)


def test_recorded_backend_parameter_is_one_the_pinned_config_declares():
    pinned = UPSTREAM_BACKEND["revisions"]["c2e65b8"]
    assert "max_attention_window_size" in pinned["models"]["tensorrt_llm"]["parameters"]
    assert get_gpu("h100-sxm").sm == "9.0"


# --- the CPU target decides what transformers' continuous batching runs correctly -----------------
def test_cpu_refuses_gemma2_whose_attention_cap_its_paged_attention_drops(tmp_path):
    folder = prequantized(tmp_path, catalog_entry("gemma-2-9b-it").config, None, "gemma2")
    result = invoke("build", "-t", "cpu", "-m", str(folder), "--dry-run")
    assert result.exit_code == 1
    assert "attn_logit_softcapping=50.0" in result.stderr and "different model" in result.stderr
    assert "--target h100-sxm" in result.stderr
    # Gemma 3 has no attention cap: planned for the CPU engine.
    folder = prequantized(tmp_path, catalog_entry("gemma-3-1b-it").config, None, "gemma3")
    assert invoke("build", "-t", "cpu", "-m", str(folder), "--dry-run").exit_code == 0


def test_cpu_refuses_a_prequantized_checkpoint_by_its_format(tmp_path):
    folder = prequantized(tmp_path, LLAMA_8B, MODELOPT_FP8)
    result = invoke("build", "-t", "cpu", "-m", str(folder), "--dry-run")
    assert result.exit_code == 1 and "pre-quantized as ModelOpt FP8" in result.stderr


def test_the_estimate_reads_routed_experts_and_multiplies_only_those():
    """toolkit.plan.estimate, for MoE: a batch-1 step reads attention, routers and 2 of 8 experts per layer;
    64 tokens touch nearly all (1 - (6/8)^64); every token's GEMMs multiply only its 2."""
    from dataclasses import replace

    from toolkit.plan.estimate import (
        GEMMS_PER_LAYER,
        HOPPER_TRTLLM,
        US,
        Step,
        Workload,
        engine_shape,
        estimate_performance,
        step_time,
    )

    facts = load_model_for_plan("mixtral-8x7b-instruct").facts
    plan = gpu_engine_plan(
        "mixtral-8x7b-instruct", "h100-sxm", dtype="fp8", kv_dtype="fp8", tp=2
    ).memory
    shape = engine_shape(facts, plan)
    expert = 3 * 4096 * 14336 / 2  # one expert's gate/up/down, one TP shard
    assert shape.expert_params == pytest.approx(8 * expert)
    assert shape.linear_params_read(1) == pytest.approx(shape.linear_params - 6 * expert)
    assert shape.linear_params_per_token == pytest.approx(shape.linear_params - 6 * expert)
    assert shape.linear_params_read(64) == pytest.approx(shape.linear_params, rel=1e-7)
    gpu = get_gpu("h100-sxm")
    dense = replace(shape, expert_params=0.0)  # every expert read and multiplied, as if dense
    routed, everything = (
        step_time(shape, gpu, Step(decode=1)),
        step_time(dense, gpu, Step(decode=1)),
    )
    read_share = shape.linear_params_read(1) / shape.linear_params  # ~0.30 of the layers' bytes
    # Past the fixed per-GEMM launch cost, the layers' time is the bytes they read.
    fixed = shape.layers * GEMMS_PER_LAYER * HOPPER_TRTLLM.gemm_fixed_us["fp8"] * US
    assert routed.linear - fixed == pytest.approx((everything.linear - fixed) * read_share)
    assert read_share == pytest.approx(0.2717, abs=1e-4)
    busy = Step(decode=64)
    assert step_time(shape, gpu, busy).linear == pytest.approx(
        step_time(dense, gpu, busy).linear, rel=0.01
    )
    one = estimate_performance(facts, gpu, plan, Workload(1, 1024, 512))
    assert one.decode_step_terms_ms["linear"] == pytest.approx(routed.linear * 1e3)
