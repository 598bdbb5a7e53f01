"""The toolkit's commands for trtllm-build, the converter and the quantizer, against an independent record of
the upstream tools' argparse definitions (tests/data/upstream/trtllm_tools.json, transcribed from the tools'
sources, each named there): every flag and value we emit, and every flag our own lists know."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from toolkit.engine.trtllm_flags import TOOL_FLAGS, check_argv, tool_of
from toolkit.errors import EngineBuildError
from toolkit.trtllm import CONTAINERS, PINNED_TRTLLM_VERSION, container_for

from fakes.upstream_argparse import RECORD, upstream_flags, upstream_parser
from repos import gpu_engine_plan

LLAMA_8B = str(Path(__file__).parent / "data" / "llama-3.1-8b-instruct")
TOOLS = ("trtllm-build", "llama/convert_checkpoint.py", "qwen/convert_checkpoint.py", "quantize.py")
# Weights and KV cache the toolkit builds: an fp8 KV cache only with fp8 weights (see the refusal test).
PRECISIONS = [("bf16", "bf16"), ("fp8", "fp8"), ("fp8", "bf16"), ("int4-awq", "bf16")]


def flags_of(argv):
    return [a[2:] for a in argv if a.startswith("--")]


@pytest.mark.parametrize("model", [LLAMA_8B, "qwen2.5-7b-instruct", "mistral-7b-instruct-v0.3"])
@pytest.mark.parametrize("dtype,kv", PRECISIONS)
@pytest.mark.parametrize("tp", [1, 2])
def test_every_emitted_command_parses_with_the_upstream_argparse(model, dtype, kv, tp):
    plan = gpu_engine_plan(model, "h100-sxm", dtype=dtype, kv_dtype=kv, tp=tp)
    for argv in plan.commands:
        tool, args = tool_of(list(argv))
        assert set(flags_of(args)) <= set(upstream_flags(tool)), tool
        # exits on any flag or value the upstream tool refuses
        upstream_parser(tool).parse_args(args)


@pytest.mark.parametrize("tool", TOOLS)
def test_our_flag_lists_are_no_looser_than_upstream(tool):
    """Each flag we know exists upstream with the same kind, and our choices are upstream's choices."""
    upstream = upstream_flags(tool)
    aliases = {
        alias.lstrip("-"): name
        for name, flag in upstream.items()
        for alias in flag.get("aliases", [])
    }
    for name, ours in TOOL_FLAGS[tool].items():
        real = upstream.get(name) or upstream.get(aliases.get(name, ""))
        assert real is not None, f"{tool} --{name} is not an upstream flag"
        if ours.kind == "store_true":
            assert real.get("action") == "store_true", name
        elif ours.kind == "nargs+":
            assert real.get("nargs") == "+", name
        else:
            assert real.get("action") in (None, "store"), name
        upstream_choices = [str(c) for c in real.get("choices") or []]
        if ours.choices:
            assert set(ours.choices) <= set(upstream_choices), (
                f"{tool} --{name}: {set(ours.choices) - set(upstream_choices)}"
            )
        if upstream_choices and ours.kind in ("choice", "nargs+"):
            assert ours.choices, (
                f"{tool} --{name} takes only {upstream_choices} upstream; our list takes anything"
            )


def test_the_plugin_dtypes_are_upstream_s_own_per_plugin():
    with pytest.raises(EngineBuildError, match="--gemm_swiglu_plugin 'bfloat16'"):
        check_argv(["trtllm-build", "--gemm_swiglu_plugin", "bfloat16"])  # fp8 or disable only
    with pytest.raises(EngineBuildError, match="--gemm_allreduce_plugin 'fp8'"):
        # float16, bfloat16 or disable
        check_argv(["trtllm-build", "--gemm_allreduce_plugin", "fp8"])
    with pytest.raises(EngineBuildError, match="--gpt_attention_plugin 'fp8'"):
        check_argv(["trtllm-build", "--gpt_attention_plugin", "fp8"])
    with pytest.raises(EngineBuildError, match="--lora_target_modules 'attn_everything'"):
        check_argv(["trtllm-build", "--lora_target_modules", "attn_q", "attn_everything"])
    check_argv(
        [
            "trtllm-build",
            "--gemm_swiglu_plugin",
            "fp8",
            "--auto_parallel",
            "1",
            "--cluster_key",
            "H100-SXM",
        ]
    )


@pytest.mark.parametrize("tool", TOOLS)
def test_the_fakes_refuse_what_upstream_refuses(tool):
    parser = upstream_parser(tool)
    with pytest.raises(SystemExit):
        parser.parse_args(["--no_such_flag", "1"])
    first_choice = next(name for name, flag in upstream_flags(tool).items() if flag.get("choices"))
    with pytest.raises(SystemExit):
        parser.parse_args([f"--{first_choice}", "not-a-choice"])


def test_pinned_release_is_named():
    assert PINNED_TRTLLM_VERSION == "0.20.0"


@pytest.mark.parametrize("dtype", ["bf16", "int4-awq"])
def test_an_fp8_kv_cache_needs_fp8_weights(dtype):
    """trtllm-build 0.20 turns paged context FMHA off for an fp8 KV cache unless the checkpoint's quant_algo is
    one the upstream record names; the runtime then turns chunked context and KV-cache reuse off. Refused."""
    rule = json.loads(RECORD.read_text())["trtllm-build"]["builder_rules"]
    assert "W4A16_AWQ" not in rule["paged_context_fmha_with_fp8_kv_cache"]["quant_algos"]
    with pytest.raises(EngineBuildError) as err:
        gpu_engine_plan(LLAMA_8B, "h100-sxm", dtype=dtype, kv_dtype="fp8")
    assert f"--kv-dtype fp8 with --dtype {dtype}" in err.value.message
    assert "paged context FMHA" in err.value.message
    assert "--kv-dtype bf16" in err.value.hint and "--dtype fp8" in err.value.hint


def test_without_chunked_context_a_step_must_hold_the_longest_prompt(tmp_path):
    """The executor bounds an unchunked context by max_num_tokens (context FMHA on): planned below
    max_input_len, long prompts could not be served."""
    recipe = tmp_path / "no-chunks.yaml"
    recipe.write_text("model: x\ntarget: h100-sxm\nkv_cache:\n  enable_chunked_context: false\n")
    with pytest.raises(
        EngineBuildError, match="max_num_tokens 2048 is less than max_input_len 8191"
    ):
        gpu_engine_plan(LLAMA_8B, None, recipe=str(recipe))
    plan = gpu_engine_plan(LLAMA_8B, None, recipe=str(recipe), max_num_tokens=8192)
    assert not plan.runtime.enable_chunked_context and plan.memory.max_num_tokens == 8192


@pytest.mark.parametrize(
    "model,script",
    [
        ("qwen2.5-7b-instruct", "examples/models/core/qwen/convert_checkpoint.py"),
        ("qwen2.5-72b-instruct", "examples/models/core/qwen/convert_checkpoint.py"),
        (LLAMA_8B, "examples/models/core/llama/convert_checkpoint.py"),
        ("mistral-7b-instruct-v0.3", "examples/models/core/llama/convert_checkpoint.py"),
    ],
)
def test_bf16_converts_with_the_converter_of_the_architecture(model, script):
    """The Llama converter builds LLaMAForCausalLM, which has no q/k/v bias: Qwen2 needs its own."""
    convert = list(gpu_engine_plan(model, "h100-sxm", dtype="bf16", tp=4).commands[0])
    assert convert[1].endswith(script)
    tool, args = tool_of(convert)
    assert tool == script.split("/", 3)[-1]
    parsed = upstream_parser(tool).parse_args(args)  # the upstream record of that very script
    assert (parsed.dtype, parsed.tp_size) == ("bfloat16", 4)


def test_container_of_each_release_is_the_first_that_carries_it():
    rows = json.loads(RECORD.read_text())["triton_containers"]["rows"]
    first: dict[str, str] = {}
    for tag, version in sorted(rows.items()):
        first.setdefault(version, tag)
    for version, tag in first.items():
        assert container_for(version) == f"nvcr.io/nvidia/tritonserver:{tag}-trtllm-python-py3"
    assert set(CONTAINERS) <= set(first), "a release the record does not list"
    assert container_for(PINNED_TRTLLM_VERSION).endswith(":25.06-trtllm-python-py3")


def test_bf16_uses_the_converter_and_the_gemm_plugin():
    plan = gpu_engine_plan(LLAMA_8B, "h100-sxm", dtype="bf16")
    convert, build = (list(a) for a in plan.commands)
    assert convert[1].endswith("examples/models/core/llama/convert_checkpoint.py")
    assert convert[convert.index("--dtype") + 1] == "bfloat16"
    assert build[build.index("--gemm_plugin") + 1] == "auto"
    assert "--use_fp8_context_fmha" not in build


def test_fp8_uses_modelopt_quantize_with_fp8_kv_and_no_gemm_plugin():
    plan = gpu_engine_plan(LLAMA_8B, "h100-sxm", dtype="fp8", kv_dtype="fp8")
    quantize, build = (list(a) for a in plan.commands)
    assert quantize[1].endswith("examples/quantization/quantize.py")
    assert quantize[quantize.index("--qformat") + 1] == "fp8"
    assert quantize[quantize.index("--kv_cache_dtype") + 1] == "fp8"
    assert build[build.index("--gemm_plugin") + 1] == "disable"
    assert build[build.index("--use_fp8_context_fmha") + 1] == "enable"


def test_int4_awq_quantizes_with_awq_block_size():
    quantize = list(gpu_engine_plan(LLAMA_8B, "h100-sxm", dtype="int4-awq").commands[0])
    assert quantize[quantize.index("--qformat") + 1] == "int4_awq"
    assert quantize[quantize.index("--awq_block_size") + 1] == "128"


def test_trtllm_build_has_the_serving_features_and_the_plan_limits():
    plan = gpu_engine_plan(LLAMA_8B, "h100-sxm", dtype="bf16", tp=2)
    build = list(plan.commands[1])
    value = lambda flag: build[build.index(flag) + 1]  # noqa: E731
    assert value("--kv_cache_type") == "paged"
    for flag in (
        "--remove_input_padding",
        "--context_fmha",
        "--use_paged_context_fmha",
        "--multiple_profiles",
        "--use_fused_mlp",
    ):
        assert value(flag) == "enable"
    assert int(value("--max_batch_size")) == plan.memory.max_batch_size
    assert int(value("--max_num_tokens")) == plan.memory.max_num_tokens
    assert int(value("--max_seq_len")) == plan.memory.max_seq_len
    assert value("--workers") == "2"
    convert = list(plan.commands[0])
    assert convert[convert.index("--tp_size") + 1] == "2"


def test_check_argv_rejects_unknown_flags_and_values():
    with pytest.raises(EngineBuildError, match="has no flag '--max_output_len'"):
        check_argv(["trtllm-build", "--max_output_len", "10"])  # removed long before 0.20
    with pytest.raises(EngineBuildError, match="--gemm_plugin 'fp16'"):
        check_argv(["trtllm-build", "--gemm_plugin", "fp16"])
    with pytest.raises(EngineBuildError, match="--log_level 'trace'"):
        check_argv(["trtllm-build", "--log_level", "trace"])  # came after 0.20
    with pytest.raises(EngineBuildError, match="has no flag '--fp8_kv_cache'"):
        check_argv(["python3", "/x/models/core/qwen/convert_checkpoint.py", "--fp8_kv_cache"])
    with pytest.raises(EngineBuildError, match="--qformat 'fp4'"):
        check_argv(["python3", "/x/quantization/quantize.py", "--qformat", "fp4"])
    with pytest.raises(EngineBuildError, match="needs a value"):
        check_argv(["trtllm-build", "--max_batch_size"])
    check_argv(
        [
            "python3",
            "/x/models/core/llama/convert_checkpoint.py",
            "--fp8_kv_cache",
            "--tp_size",
            "2",
        ]
    )


# --- FP8 / tensor-parallel fusions: one build setting each, their conditions from the upstream record --
FUSIONS = ("reduce_fusion", "user_buffer", "gemm_swiglu_plugin", "low_latency_gemm_plugin")
FUSION_FLAGS = {
    "--reduce_fusion": "enable",
    "--user_buffer": "enable",
    "--gemm_swiglu_plugin": "fp8",
    "--low_latency_gemm_plugin": "fp8",
}
LLAMA_70B = "llama-3.1-70b-instruct"


def _rules() -> dict:
    return json.loads(RECORD.read_text())["trtllm-build"]["builder_rules"]


def _build_argv(plan) -> list[str]:
    return list(plan.commands[-1])


def _flag_values(argv: list[str]) -> dict[str, str]:
    return {a: argv[i + 1] for i, a in enumerate(argv[:-1]) if a.startswith("--")}


@pytest.mark.parametrize("tp", [2, 4])
def test_the_70b_fp8_tp_recipes_build_with_the_fusions_nvidia_measured(tp):
    """NVIDIA's FP8 case study (Llama 70B TP4 on H100): reduce fusion + user buffers, GEMM + SwiGLU and the
    low-latency GEMM plugin took it from 5300 to 6049 tokens/s (+14 %)."""
    plan = gpu_engine_plan(LLAMA_70B, None, recipe=f"llama-3.1-70b-instruct-h100-sxm-fp8-tp{tp}")
    values = _flag_values(_build_argv(plan))
    assert plan.memory.tp_size == tp and plan.memory.dtype == "fp8"
    assert {flag: values.get(flag) for flag in FUSION_FLAGS} == FUSION_FLAGS
    for flag, value in FUSION_FLAGS.items():  # each value is one the upstream flag takes
        assert value in upstream_flags("trtllm-build")[flag[2:]]["choices"]
    rules = _rules()
    assert plan.memory.tp_size > rules["reduce_fusion"]["requires_tp_above"]
    assert plan.memory.architecture in rules["reduce_fusion"]["architectures"]
    assert "fp8" in rules["gemm_swiglu_plugin"]["plugin_dtypes"]
    assert values["--use_fused_mlp"] == "enable"  # what the SwiGLU fusion needs upstream
    assert "use_fused_mlp" in rules["gemm_swiglu_plugin"]["requires"]
    assert (
        values["--gemm_plugin"] not in rules["low_latency_gemm_plugin"]["not_with"]["gemm_plugin"]
    )
    upstream_parser("trtllm-build").parse_args(_build_argv(plan)[1:])


def test_the_fusions_are_off_unless_asked():
    values = _flag_values(_build_argv(gpu_engine_plan(LLAMA_70B, "h100-sxm", dtype="fp8", tp=4)))
    assert not set(FUSION_FLAGS) & set(values)


def test_the_fusions_are_build_settings_with_recipe_keys_and_recorded_values():
    from toolkit.build import BuildRequest, plan_build
    from toolkit.build_settings import SETTINGS

    for name in FUSIONS:
        assert SETTINGS[name].recipe_key == f"engine.{name}" and SETTINGS[name].kind is bool
    planned = plan_build(
        BuildRequest.make(recipe="llama-3.1-70b-instruct-h100-sxm-fp8-tp4")
    ).planned
    assert all(getattr(planned.settings, name) is True for name in FUSIONS)
    rebuild = planned.settings.rebuild_arguments()
    assert "--reduce-fusion" in rebuild and "--low-latency-gemm-plugin" in rebuild


@pytest.mark.parametrize(
    ("options", "said", "rule"),
    [
        ({"dtype": "fp8", "tp": 1, "reduce_fusion": True}, "TP 1", "reduce_fusion"),
        (
            {"model": "qwen2.5-7b-instruct", "dtype": "fp8", "tp": 2, "reduce_fusion": True},
            "Qwen2ForCausalLM",
            "reduce_fusion",
        ),
        ({"dtype": "fp8", "tp": 2, "user_buffer": True}, "--reduce-fusion", "user_buffer"),
        (
            {"dtype": "bf16", "tp": 2, "reduce_fusion": True, "user_buffer": True},
            "--dtype bf16",
            "user_buffer",
        ),
        ({"dtype": "bf16", "gemm_swiglu_plugin": True}, "--dtype bf16", "gemm_swiglu_plugin"),
        (
            {"dtype": "int4-awq", "low_latency_gemm_plugin": True},
            "--dtype int4-awq",
            "low_latency_gemm_plugin",
        ),
        (
            {"target": "l40s", "dtype": "fp8", "gemm_swiglu_plugin": True},
            "SM 8.9",
            "gemm_swiglu_plugin",
        ),
    ],
)
def test_a_fusion_upstream_would_turn_off_is_refused_naming_the_condition(options, said, rule):
    """trtllm-build drops a fusion it cannot apply with only a warning: the engine would silently lack
    what the recipe asked for. The toolkit refuses before anything runs, naming the setting, the
    upstream condition (tests/data/upstream/trtllm_tools.json, builder_rules) and what would do."""
    assert rule in _rules()
    options = {"model": LLAMA_8B, "target": "h100-sxm", **options}
    model, target = options.pop("model"), options.pop("target")
    with pytest.raises(EngineBuildError) as err:
        gpu_engine_plan(model, target, **options)
    flag = "--" + rule.replace("_", "-")
    assert flag in err.value.message and said in err.value.message
    assert err.value.hint


def test_the_fusion_conditions_are_the_upstream_records():
    """What toolkit.engine.fusions checks is what trtllm_tools.json transcribes, not a list of our own."""
    from toolkit.engine import fusions

    rules = _rules()
    assert tuple(rules["reduce_fusion"]["architectures"]) == fusions.REDUCE_FUSION_ARCHITECTURES
    assert rules["reduce_fusion"]["requires_tp_above"] == 1
    assert rules["user_buffer"]["requires"] == ["reduce_fusion"]
    emitted = {f.flag[2:]: f.value for f in fusions.FUSIONS}
    for name, value in emitted.items():
        assert value in upstream_flags("trtllm-build")[name]["choices"]
        if "plugin_dtypes" in rules[name]:
            assert value in rules[name]["plugin_dtypes"]
    assert fusions.HOPPER_SM in rules["gemm_swiglu_plugin"]["sm"]
    # every family we build: accepted exactly where the record's architectures allow
    for model, arch in (
        (LLAMA_70B, "LlamaForCausalLM"),
        ("qwen2.5-72b-instruct", "Qwen2ForCausalLM"),
        ("mistral-7b-instruct-v0.3", "MistralForCausalLM"),
    ):
        options = {"dtype": "fp8", "tp": 2, "reduce_fusion": True}
        if arch in rules["reduce_fusion"]["architectures"]:
            assert "--reduce_fusion" in _build_argv(gpu_engine_plan(model, "h100-sxm", **options))
        else:
            with pytest.raises(EngineBuildError, match=arch):
                gpu_engine_plan(model, "h100-sxm", **options)
