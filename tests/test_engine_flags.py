"""The toolkit's commands for trtllm-build, the converter and the quantizer, against an independent record of
the upstream tools' argparse definitions (tests/data/upstream/trtllm_tools.json, transcribed from the tools'
sources, each named there): every flag and value we emit, and every flag our own lists know."""

from __future__ import annotations

from pathlib import Path

import pytest

from toolkit.engine.trtllm_flags import TOOL_FLAGS, check_argv, tool_of
from toolkit.errors import EngineBuildError
from toolkit.trtllm import PINNED_TRTLLM_VERSION

from fakes.upstream_argparse import upstream_flags, upstream_parser
from repos import gpu_engine_plan

LLAMA_8B = str(Path(__file__).parent / "data" / "llama-3.1-8b-instruct")
TOOLS = ("trtllm-build", "convert_checkpoint.py", "quantize.py")


def flags_of(argv):
    return [a[2:] for a in argv if a.startswith("--")]


@pytest.mark.parametrize(
    "dtype,kv",
    [("bf16", "bf16"), ("fp8", "fp8"), ("fp8", "bf16"), ("int4-awq", "fp8"), ("bf16", "fp8")],
)
@pytest.mark.parametrize("tp", [1, 2])
def test_every_emitted_command_parses_with_the_upstream_argparse(dtype, kv, tp):
    plan = gpu_engine_plan(LLAMA_8B, "h100-sxm", dtype=dtype, kv_dtype=kv, tp=tp)
    for argv in plan.commands:
        tool, args = tool_of(list(argv))
        assert set(flags_of(args)) <= set(upstream_flags(tool)), tool
        upstream_parser(tool).parse_args(
            args
        )  # exits on any flag or value the upstream tool refuses


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
        check_argv(
            ["trtllm-build", "--gemm_allreduce_plugin", "fp8"]
        )  # float16, bfloat16 or disable
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
