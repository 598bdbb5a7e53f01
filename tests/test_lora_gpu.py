"""LoRA on GPU targets (issue 19): the engine's plugin flags, TensorRT-LLM's own adapter conversion into the
backend's prefetch folder, the LoRA cache's config parameters and its place in the memory plan. Every fact
about TensorRT-LLM and the backend is read from the independent upstream records (tests/data/upstream:
trtllm_tools.json `hf_lora_convert.py`, `peft_cache`, `trtllm-build.lora_notes`; triton_backend.json
`revisions.c2e65b8.lora`), never from the toolkit's own tables. The tools are the fakes of tests/fakes."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from toolkit.cli.main import cli
from toolkit.repository.configs import parse_pbtxt
from toolkit.repository.reader import open_repository

from fakes import fake_checkpoint, install_fake_trtllm
from fakes.upstream_argparse import upstream_parser
from lora_adapters import ATTENTION, MLP, write_lora_adapter
from tiny import make_bigram_checkpoint

UPSTREAM = Path(__file__).parent / "data" / "upstream"
TOOLS = json.loads((UPSTREAM / "trtllm_tools.json").read_text())
CONVERT = TOOLS["hf_lora_convert.py"]
PEFT_CACHE = TOOLS["peft_cache"]
BACKEND_LORA = json.loads((UPSTREAM / "triton_backend.json").read_text())["revisions"]["c2e65b8"][
    "lora"
]
LLAMA_DIR = Path(__file__).parent / "data" / "llama-3.1-8b-instruct"
LLAMA = json.loads((LLAMA_DIR / "config.json").read_text())
BASE = "meta-llama/Llama-3.1-8B-Instruct"
# Two adapters: rank 8 on q/v, rank 16 on every linear layer.
ADAPTERS = {"sql": (8, ("q_proj", "v_proj")), "chat": (16, (*ATTENTION, *MLP))}


def invoke(*args: str):
    return CliRunner().invoke(cli, list(args))


@pytest.fixture(scope="module")
def adapters(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("adapters")
    return {
        name: write_lora_adapter(root / name, LLAMA, base=BASE, rank=rank, modules=modules, seed=i)
        for i, (name, (rank, modules)) in enumerate(ADAPTERS.items())
    }


def _lora_args(adapters: dict[str, Path]) -> list[str]:
    return [word for name, folder in adapters.items() for word in ("--lora", f"{name}={folder}")]


def _build_dry_run(adapters, *extra: str):
    """`toolkit build --dry-run` of the Llama checkpoint for h100-sxm with these adapters."""
    args = ["build", "-t", "h100-sxm", "-m", str(LLAMA_DIR), "--dry-run", *extra]
    return invoke(*args, *_lora_args(adapters))


def _dry_run(adapters, *extra: str, output: Path | None = None) -> dict:
    result = _build_dry_run(adapters, "--json", *extra, *(["-o", str(output)] if output else []))
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def _upstream_modules(hf_modules) -> set[str]:
    """TensorRT-LLM's names by the upstream conversion's map, q/k/v completed as trtllm-build does."""
    names = {CONVERT["hf_modules_to_trtllm_modules"][m] for m in hf_modules}
    qkv = {"attn_q", "attn_k", "attn_v"}
    return names | qkv if names & qkv else names


def test_the_dry_run_builds_the_engine_with_the_lora_plugin_the_adapters_modules_and_rank(
    adapters, tmp_path
):
    data = _dry_run(adapters, output=tmp_path / "repo")
    build = data["commands"][-1]
    parsed = upstream_parser("trtllm-build").parse_args(build[1:])
    assert (
        parsed.lora_plugin == "bfloat16"
    )  # the engine's dtype: the converter runs --dtype bfloat16
    needed = _upstream_modules({m for _, modules in ADAPTERS.values() for m in modules})
    assert set(parsed.lora_target_modules) == needed
    assert (
        "mlp_h_to_4h" in needed and "mlp_gate" in needed
    )  # gate_proj and up_proj, as upstream maps them
    assert parsed.max_lora_rank == 16
    only_qv = _dry_run({"sql": adapters["sql"]})["commands"][-1]
    modules = upstream_parser("trtllm-build").parse_args(only_qv[1:]).lora_target_modules
    assert set(modules) == {"attn_q", "attn_k", "attn_v"}  # upstream adds the missing q/k/v


def test_the_dry_run_shows_the_conversion_into_the_prefetch_folder(adapters, tmp_path):
    repo = (tmp_path / "repo").resolve()
    data = _dry_run(adapters, output=repo)
    conversions = data["lora_conversion"]
    assert len(conversions) == 2
    for task_id, (argv, folder) in enumerate(zip(conversions, adapters.values(), strict=True), 1):
        assert argv[1].endswith("/hf_lora_convert.py")  # examples/ of the pinned release
        parsed = upstream_parser("hf_lora_convert.py").parse_args(argv[2:])
        assert Path(parsed.in_file) == folder
        assert Path(parsed.out_dir) == repo / "tensorrt_llm" / "1" / "lora" / str(task_id)
        assert parsed.storage_type == "bfloat16"  # the weights in the engine's dtype
    for name in CONVERT["outputs"]["files"]:
        assert f"tensorrt_llm/1/lora/2/{name.split('/')[-1]}" in data["repository_files"]
    parameters = data["engine_parameters"]
    assert set(BACKEND_LORA["parameters"]) <= set(parameters)
    assert parameters["lora_prefetch_dir"] == str(repo / "tensorrt_llm" / "1" / "lora")
    assert parameters["lora_cache_max_adapter_size"] == 16
    assert not any(str(v).startswith("${") for v in parameters.values())
    text = invoke(
        "build", "-t", "h100-sxm", "-m", str(LLAMA_DIR), "--dry-run", *_lora_args(adapters)
    )
    assert "hf_lora_convert.py --in-file" in text.output and "LoRA cache" in text.output


def _upstream_capacity(plan: dict, host_bytes: int) -> tuple[int, int]:
    """(max-rank adapters the host cache holds, slots one needs), by the record's arithmetic (peft_cache)."""
    hidden, inner = LLAMA["hidden_size"], LLAMA["intermediate_size"]
    q = LLAMA["num_attention_heads"] * (hidden // LLAMA["num_attention_heads"])
    kv = LLAMA["num_key_value_heads"] * (hidden // LLAMA["num_attention_heads"])
    one_d = [
        hidden + q,
        hidden + kv,
        hidden + kv,
        q + hidden,
        hidden + inner,
        hidden + inner,
        inner + hidden,
    ]
    page_width, layers, rank = min(one_d), LLAMA["num_hidden_layers"], plan["lora_max_rank"]
    total_slots = layers * sum(
        rank * math.ceil(d / page_width) for d in one_d
    )  # optimal = max rank
    slots_per_page = max(total_slots, math.ceil(rank * max(one_d) / page_width))
    max_lora_size = rank * layers * sum(one_d)
    min_total_slots = math.ceil(rank * sum(one_d) * layers / page_width)
    host_slots = host_bytes // (page_width * 2)  # bf16
    pages = math.ceil(host_slots / slots_per_page)
    return pages * slots_per_page * page_width // max_lora_size, min_total_slots


def test_the_plan_counts_the_lora_cache_and_the_caches_hold_every_adapter(adapters):
    with_lora = _dry_run(adapters)["plan"]
    without = _dry_run({}, "--max-batch-size", str(with_lora["max_batch_size"]))["plan"]
    assert with_lora["lora_cache_bytes"] > 0
    assert without["kv_pool_bytes"] - with_lora["kv_pool_bytes"] >= with_lora["lora_cache_bytes"]
    assert with_lora["runtime_kv_cache_tokens"] < without["runtime_kv_cache_tokens"]
    held, one = _upstream_capacity(with_lora, with_lora["lora_host_cache_bytes"])
    assert held >= len(ADAPTERS) + 1  # every prefetched adapter, and one sent at run time
    free = (
        with_lora["gpu_memory_bytes"]
        - with_lora["weights_bytes_per_gpu"]
        - with_lora["runtime_reserve_bytes"]
    )
    kv = LLAMA["num_key_value_heads"] * (LLAMA["hidden_size"] // LLAMA["num_attention_heads"])
    page_width = LLAMA["hidden_size"] + kv  # the narrowest module: attn_k / attn_v (in + out)
    device_slots = int(with_lora["lora_cache_gpu_memory_fraction"] * free) // (page_width * 2)
    assert device_slots >= one * len(ADAPTERS)  # "must hold 1 max sized LoRA", here both


def test_more_adapters_than_the_cache_holds_is_refused_with_the_fix(adapters):
    result = _build_dry_run(adapters, "--lora-cache-adapters", "1")
    assert result.exit_code == 1
    assert "the LoRA cache holds 1" in result.output and "--lora-cache-adapters 2" in result.output


def test_a_rank_above_max_lora_rank_is_refused_and_room_can_be_given(adapters):
    result = _build_dry_run(adapters, "--max-lora-rank", "8")
    assert result.exit_code == 1 and "chat (rank 16)" in result.output
    assert "--max-lora-rank 16" in result.output
    roomy = _dry_run(adapters, "--max-lora-rank", "64")
    assert upstream_parser("trtllm-build").parse_args(roomy["commands"][-1][1:]).max_lora_rank == 64
    assert roomy["engine_parameters"]["lora_cache_max_adapter_size"] == 64


def test_lora_limits_without_adapters_are_refused():
    result = _build_dry_run({}, "--max-lora-rank", "8")
    assert result.exit_code == 1 and "without --lora" in result.output


def test_an_adapter_of_another_model_is_refused_before_the_plan(adapters, tmp_path):
    other = write_lora_adapter(tmp_path / "o", {**LLAMA, "hidden_size": 2048}, base=BASE)
    result = invoke(
        "build", "-t", "h100-sxm", "-m", str(LLAMA_DIR), "--dry-run", "--lora", f"o={other}"
    )
    assert result.exit_code == 1 and "lora_A has shape [8, 2048]" in result.output


def test_adapters_of_fused_layers_are_checked_by_their_shapes_and_refused_on_gpu_naming_the_cpu(
    tmp_path,
):
    catalog = (
        Path(__file__).parents[1] / "toolkit" / "model" / "catalog" / "phi-3.5-mini-instruct.json"
    )
    entry = json.loads(catalog.read_text())
    fused = write_lora_adapter(
        tmp_path / "phi",
        entry["config"],
        base=entry["hub_id"],
        modules=("qkv_proj", "gate_up_proj"),
    )
    result = invoke(
        "build",
        "-t",
        "h100-sxm",
        "-m",
        "phi-3.5-mini-instruct",
        "--dry-run",
        "--lora",
        f"f={fused}",
    )
    assert result.exit_code == 1, result.output
    assert "gate_up_proj, qkv_proj" in result.output and "--target cpu" in result.output
    assert "LoRA-able" not in result.output  # the shapes fit Phi-3's fused layers


# --- a build through the fake tools -------------------------------------------------------------
@pytest.fixture(scope="module")
def built(tmp_path_factory, adapters):
    """Three builds: `sql` alone with room (3 adapters, rank 16); then `sql` and `notes` (q/v, rank 16):
    the same engine; then with `chat` (MLP layers too): a new engine. Returns the second repository and the
    trtllm-build runs of the second and third builds."""
    tmp = tmp_path_factory.mktemp("gpu-lora")
    notes = write_lora_adapter(tmp / "notes", LLAMA, base=BASE, rank=16, seed=7)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TOOLKIT_HOME", str(tmp / "home"))
        calls = install_fake_trtllm(mp, tmp)
        # named as the adapters' base model names it (a local folder of another name is refused)
        checkpoint = fake_checkpoint(tmp, LLAMA_DIR / "config.json").rename(
            tmp / "Llama-3.1-8B-Instruct"
        )
        bigram = make_bigram_checkpoint(tmp / "bigram")
        for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
            shutil.copy(bigram / name, checkpoint / name)
        args = [
            "build",
            "-t",
            "h100-sxm",
            "-m",
            str(checkpoint),
            "--lora-cache-adapters",
            "3",
            "--max-lora-rank",
            "16",
        ]
        runs = []
        for output, lora in (
            ("one", {"sql": adapters["sql"]}),
            ("repo", {"sql": adapters["sql"], "notes": notes}),
            ("mlp", {"sql": adapters["sql"], "notes": notes, "chat": adapters["chat"]}),
        ):
            result = invoke(*args, *_lora_args(lora), "-o", str(tmp / output))
            assert result.exit_code == 0, result.output
            runs.append(len(calls.read_text().splitlines()))
    return tmp / "repo", runs[1] - runs[0], runs[2] - runs[1]


def test_the_repository_holds_each_converted_adapter_in_its_task_folder(built):
    repo, _, _ = built
    opened = open_repository(repo)
    assert [(a.name, a.task_id, a.rank) for a in opened.adapters] == [
        ("sql", 1, 8),
        ("notes", 2, 16),
    ]
    assert opened.capabilities.lora == ("sql", "notes")
    ids = {
        name: int(number)
        for name, number in (
            item.split(" ") for item in CONVERT["module_ids"].split(": ", 1)[1].split(", ")[:8]
        )
    }
    for adapter in opened.adapters:
        folder = repo / "tensorrt_llm" / "1" / "lora" / str(adapter.task_id)
        weights = np.load(folder / "model.lora_weights.npy")
        config = np.load(folder / "model.lora_config.npy")
        rows = len(adapter.target_modules) * 2  # two layers each
        assert weights.shape[:2] == (1, rows) and weights.dtype.itemsize == 2  # bf16
        assert config.shape == (1, rows, 3) and config.dtype == np.int32
        expected = {ids[CONVERT["hf_modules_to_trtllm_modules"][m]] for m in adapter.target_modules}
        assert set(config[0, :, 0]) == expected and set(config[0, :, 2]) == {adapter.rank}
    config = parse_pbtxt((repo / "tensorrt_llm" / "config.pbtxt").read_text())
    parameters = {k: v.string_value for k, v in config.parameters.items()}
    assert parameters["lora_prefetch_dir"] == str(repo.resolve() / "tensorrt_llm" / "1" / "lora")
    assert int(parameters["lora_cache_max_adapter_size"]) == 16
    assert float(parameters["lora_cache_gpu_memory_fraction"]) > 0
    assert (
        int(parameters["lora_cache_host_memory_bytes"]) == opened.memory_plan.lora_host_cache_bytes
    )
    assert not opened.file_changes()


def test_adding_an_adapter_within_the_engines_room_keeps_the_engine(built):
    """Room given up front (--lora-cache-adapters, --max-lora-rank) and the same modules: a rebuild with one
    more adapter converts it and keeps the compiled engine; an adapter of other modules needs a new one."""
    _, same_modules, more_modules = built
    assert same_modules == 0
    assert more_modules == 1


def test_runtime_lora_weights_are_declared_in_the_engines_dtype_on_every_model_that_passes_them(
    built,
):
    """TensorRT-LLM refuses runtime weights of another dtype than the engine's (the record's storage-type
    note); the engine is bf16, so lora_weights is BF16 on tensorrt_llm, the ensemble and the BLS alike
    (the stock config's FP16 would be refused per request)."""
    repo, _, _ = built
    assert (
        "Expected lora weights to be the same data type as base model"
        in (CONVERT["flags"]["storage-type"]["note"])
    )
    for model in ("tensorrt_llm", "ensemble", "tensorrt_llm_bls"):
        config = parse_pbtxt((repo / model / "config.pbtxt").read_text())
        types = {t.name: t.data_type for t in config.input}
        assert (
            types["lora_weights"]
            == parse_pbtxt("input { data_type: TYPE_BF16 }").input[0].data_type
        ), model


def test_a_build_without_the_conversion_script_stops_before_the_download(
    adapters, tmp_path, monkeypatch
):
    install_fake_trtllm(monkeypatch, tmp_path)
    monkeypatch.setenv("TOOLKIT_TRTLLM_EXAMPLES_DIR", str(tmp_path / "no-examples"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # a download would fail differently
    result = invoke(
        "build",
        "-t",
        "h100-sxm",
        "-m",
        "llama-3.1-8b-instruct",
        "-o",
        str(tmp_path / "repo"),
        "--lora",
        f"sql={adapters['sql']}",
    )
    assert result.exit_code == 1 and "hf_lora_convert.py" in result.output, result.output
    assert "TOOLKIT_TRTLLM_EXAMPLES_DIR" in result.output and not (tmp_path / "repo").exists()
