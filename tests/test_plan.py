"""Planner numbers against values computed by hand from the models' published configs."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from toolkit.cli.main import cli
from toolkit.errors import PlanError
from toolkit.plan import get_gpu, load_model_for_plan, plan_memory
from toolkit.plan.memory import compute_plan

DATA = Path(__file__).parent / "data"
LLAMA_8B = DATA / "llama-3.1-8b-instruct" / "config.json"
LLAMA_70B = DATA / "llama-3.1-70b-instruct" / "config.json"
SMOL = DATA / "smollm2-135m-instruct" / "config.json"
GB = 10**9


def facts(path):
    return load_model_for_plan(str(path)).facts


def test_llama_8b_parameter_count_matches_the_published_8_03b():
    # embeddings 128256*4096 twice (untied) + 32 layers x (q,o 4096^2; k,v 4096*1024; MLP 3*4096*14336;
    # 2 norms) + final norm
    per_layer = 2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336 + 2 * 4096
    assert (
        facts(LLAMA_8B).parameter_count
        == 2 * 128256 * 4096 + 32 * per_layer + 4096
        == 8_030_261_248
    )


def test_llama_8b_bf16_on_h100_sxm():
    plan = plan_memory(facts(LLAMA_8B), get_gpu("h100-sxm"), model="llama")
    assert plan.kv_bytes_per_token == 2 * 32 * 8 * 128 * 2 == 131072
    assert plan.weights_bytes == 8_030_261_248 * 2  # ~16.06 GB
    assert round(plan.weights_bytes / GB, 2) == 16.06
    card = 81559 * 2**20  # nvidia-smi memory.total of an H100 80GB HBM3
    assert plan.gpu_memory_bytes == card == 85_520_809_984
    reserve = int(0.10 * card)
    pool = card - 16_060_522_496 - reserve
    assert plan.kv_pool_bytes == pool
    assert plan.kv_cache_tokens == int(pool // 131072) // 64 * 64 == 464_640
    assert plan.max_sequences_at_max_seq_len == 464_640 // 8192 == 56
    # The runtime's reserve: 3.5 GiB, activations of trtllm-bench's 2048-token step (hidden in and out and
    # gate/up, bf16) and fp32 logits of its 384-request batch (464640 / 1536 = 302.5 -> 128 * ceil);
    # it takes 0.9 of the rest: 448,704 tokens, which hold 292 requests of 1024 + 512 tokens.
    runtime_reserve = 3584 * 2**20 + 2048 * 2 * (2 * 4096 + 2 * 14336) + 384 * 128256 * 4
    assert plan.runtime_reserve_bytes == runtime_reserve == 4_106_092_544
    free = card - 16_060_522_496 - runtime_reserve
    assert plan.runtime_kv_cache_tokens == int(0.9 * free) // 131072 // 64 * 64 == 448_704
    # the batch the runtime holds (no runtime tuner); step tokens 292 * (1 + 1024 / 512) -> at least 2048
    assert plan.max_seq_len == 8192 and plan.max_batch_size == 448_704 // 1536 == 292
    assert plan.max_num_tokens == 2048
    assert (
        "runtime's KV pool" in plan.batch_limits_from
        and "1024 in / 512 out" in plan.batch_limits_from
    )
    assert plan.kv_tokens_per_request_at_max_batch == 448_704 // 292
    assert plan.decode_step_ms_lower_bound == pytest.approx(16_060_522_496 / 3.35e12 * 1e3)
    assert plan.decode_step_ms_lower_bound == pytest.approx(4.79, abs=0.01)
    assert plan.decode_tokens_per_s_per_stream_ceiling == pytest.approx(208.6, abs=0.1)
    # the batch: the runtime's pool holds exactly that many requests of the target size
    running = 292
    step = (16_060_522_496 + running * (1024 + 256) * 131072) / 3.35e12 * 1e3
    assert plan.decode_step_ms_at_max_batch == pytest.approx(step)
    assert plan.decode_tokens_per_s_ceiling == pytest.approx(running * 1e3 / step)
    # all but the embedding table and norms
    matmul_params = 8_030_261_248 - 128256 * 4096 - 65 * 4096
    assert plan.prefill_tokens_per_s_upper_bound == pytest.approx(989.5e12 / (2 * matmul_params))
    assert plan.min_tp_that_fits == 1 and plan.fits


def test_batch_limits_follow_trtllm_bench_and_never_the_full_length_sequence_count():
    from toolkit.plan.memory import batch_limits

    # capped at 4096 requests; 8192 step tokens
    assert batch_limits(1_000_000, 128, 128) == (
        4096,
        8192,
    )
    assert batch_limits(10_000, 1024, 512) == (64, 2048)  # floors: 64 requests, 2048 tokens
    assert batch_limits(600_000, 1000, 1000) == (384, 2048)
    # 150 per stage -> 32 * ceil(150 / 32)
    assert batch_limits(600_000, 1000, 1000, pp=2) == (
        160,
        2048,
    )
    plan = plan_memory(facts(LLAMA_8B), get_gpu("h100-sxm"), dtype="fp8", kv_dtype="fp8")
    assert plan.max_batch_size > 4 * plan.max_sequences_at_max_seq_len


def test_given_batch_limits_are_kept_and_named():
    plan = plan_memory(facts(LLAMA_8B), get_gpu("h100-sxm"), max_batch_size=32, max_num_tokens=4096)
    assert (plan.max_batch_size, plan.max_num_tokens) == (32, 4096)
    assert plan.batch_limits_from.startswith("max_batch_size and max_num_tokens given")


def test_without_tp_the_plan_takes_the_smallest_that_fits():
    plan = plan_memory(facts(LLAMA_70B), get_gpu("h100-sxm"), dtype="bf16")
    assert plan.tp_size == plan.min_tp_that_fits == 2


def test_llama_8b_fp8_weights_and_fp8_kv_halve_the_bytes():
    plan = plan_memory(facts(LLAMA_8B), get_gpu("h100-sxm"), dtype="fp8", kv_dtype="fp8")
    linear = 32 * (2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336)
    unquantized = 2 * 128256 * 4096 + 65 * 4096  # embeddings, LM head, norms stay bf16
    assert plan.weights_bytes == linear * 1 + unquantized * 2
    assert plan.kv_bytes_per_token == 65536
    assert plan.decode_step_ms_lower_bound == pytest.approx(plan.weights_bytes / 3.35e12 * 1e3)
    assert plan.prefill_tokens_per_s_upper_bound > 2 * 65000  # the fp8 tensor-core rate


def test_llama_8b_tp2_splits_kv_heads_and_linear_layers():
    plan = plan_memory(facts(LLAMA_8B), get_gpu("h100-sxm"), tp=2)
    assert plan.kv_bytes_per_token_per_gpu == 65536
    linear = 32 * (2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336)
    per_gpu = (linear / 2 + 64 * 4096 + 128256 * 4096 + 128256 * 4096 / 2 + 4096) * 2
    assert plan.weights_bytes_per_gpu == int(per_gpu)


def test_pipeline_stages_hold_the_embedding_first_and_the_lm_head_last():
    """TensorRT-LLM builds the embedding on the first pipeline stage and the LM head (with the final norm) on
    the last; a GPU holds its stage's layers. The plan is per GPU on the worst stage."""
    layer = 2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336  # linear weights of one layer
    norms = 2 * 4096
    embedding = lm_head = 128256 * 4096
    pp2 = plan_memory(facts(LLAMA_8B), get_gpu("h100-sxm"), pp=2)
    first = 16 * (layer + norms) + embedding
    last = 16 * (layer + norms) + lm_head + 4096
    assert pp2.weights_bytes_per_gpu == max(first, last) * 2 == last * 2
    tp2pp2 = plan_memory(facts(LLAMA_8B), get_gpu("h100-sxm"), tp=2, pp=2)
    first = 16 * (layer / 2 + norms) + embedding  # the embedding is whole on each TP rank
    last = 16 * (layer / 2 + norms) + lm_head / 2 + 4096  # the LM head is TP-split
    assert tp2pp2.weights_bytes_per_gpu == int(max(first, last) * 2) == int(first * 2)
    smol = facts(SMOL)  # 30 layers over 4 stages: 8, 8, 7, 7 (the first stages take the remainder)
    pp4 = plan_memory(smol, get_gpu("h100-sxm"), pp=4)
    layer = 2 * 576 * 576 + 2 * 576 * 192 + 3 * 576 * 1536 + 2 * 576
    first, last = 8 * layer + 49152 * 576, 7 * layer + 49152 * 576 + 576
    assert pp4.weights_bytes_per_gpu == max(first, last) * 2


def test_smollm2_numbers():
    f = facts(SMOL)
    per_layer = 2 * 576 * 576 + 2 * 576 * 192 + 3 * 576 * 1536 + 2 * 576
    # tied: no LM head
    assert f.parameter_count == 49152 * 576 + 30 * per_layer + 576 == 134_515_008
    plan = plan_memory(f, get_gpu("h100-sxm"))
    assert plan.kv_bytes_per_token == 2 * 30 * 3 * 64 * 2 == 23040
    assert plan.weights_bytes == 134_515_008 * 2
    # on the GPU TensorRT-LLM keeps its own LM head copy even when tied
    assert plan.weights_bytes_per_gpu == (134_515_008 + 49152 * 576) * 2
    card = 81559 * 2**20
    pool = card - (134_515_008 + 49152 * 576) * 2 - int(0.1 * card)
    assert plan.kv_cache_tokens == pool // 23040 // 64 * 64
    assert plan.max_sequences_at_max_seq_len == plan.kv_cache_tokens // 8192 == 406
    # requests of the target size the runtime's pool holds
    assert plan.max_batch_size == plan.runtime_kv_cache_tokens // (1024 + 512) == 2058


def test_llama_70b_bf16_on_one_h100_is_refused_with_options():
    with pytest.raises(PlanError) as err:
        plan_memory(facts(LLAMA_70B), get_gpu("h100-sxm"), model="llama-70b", tp=1)
    message, hint = err.value.message, err.value.hint
    assert "does not fit on h100-sxm" in message and "141.11 GB of weights" in message
    # 85.5 GB usable per H100: bf16 fits at TP 2, fp8 and int4-awq on one card
    assert (
        "--dtype bf16 --tp 2" in hint
        and "--dtype fp8 --tp 1" in hint
        and "--dtype int4-awq --tp 1" in hint
    )


def test_fp8_refused_on_a100():
    with pytest.raises(PlanError, match="no FP8"):
        compute_plan(facts(LLAMA_8B), get_gpu("a100-80gb"), dtype="fp8")


def test_tp_must_divide_heads():
    with pytest.raises(PlanError, match="does not divide"):
        compute_plan(facts(SMOL), get_gpu("h100-sxm"), tp=2)


def test_unknown_gpu_names_the_known_ones():
    with pytest.raises(PlanError, match="no GPU profile") as err:
        get_gpu("h800")
    assert "h100-sxm" in err.value.hint


def test_gpu_profiles_have_the_datasheet_numbers():
    h100, h200 = get_gpu("h100-sxm"), get_gpu("h200")
    # memory: what nvidia-smi reports as memory.total on each card, in MiB
    assert (h100.memory_bytes, h100.bandwidth_bytes_per_s, h100.sm) == (
        81559 * 2**20,
        3.35e12,
        "9.0",
    )
    assert (h200.memory_bytes, h200.bandwidth_bytes_per_s) == (143771 * 2**20, 4.8e12)
    assert (
        get_gpu("a100-80gb").memory_bytes == 81920 * 2**20
        and get_gpu("l40s").memory_bytes == 46068 * 2**20
    )
    assert get_gpu("a100-80gb").fp8_tflops is None and get_gpu("l40s").sm == "8.9"


def test_cli_plan_json_from_a_bare_config_json():
    result = CliRunner().invoke(cli, ["plan", "-m", str(LLAMA_8B), "--gpu", "h100-sxm", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    for key in (
        "weights_bytes",
        "kv_bytes_per_token",
        "kv_cache_tokens",
        "max_batch_size",
        "max_num_tokens",
        "max_seq_len",
        "tp_size",
        "decode_step_ms_lower_bound",
    ):
        assert key in data
    assert data["kv_bytes_per_token"] == 131072 and data["tp_size"] == 1
    assert round(data["decode_step_ms_lower_bound"], 1) == 4.8


def test_cli_plan_table_from_a_folder_without_weights():
    result = CliRunner().invoke(
        cli, ["plan", "-m", str(LLAMA_8B.parent), "--dtype", "fp8", "--kv-dtype", "fp8"]
    )
    assert result.exit_code == 0, result.output
    assert "decode step lower bound" in result.stdout and "65,536 bytes" in result.stdout


def test_cli_plan_refuses_70b_with_exit_1():
    result = CliRunner().invoke(
        cli, ["plan", "-m", str(LLAMA_70B), "--gpu", "h100-sxm", "--tp", "1"]
    )
    assert result.exit_code == 1
    assert "Error: llama-3.1-70b-instruct in bf16 does not fit on h100-sxm" in result.stderr
    assert "fix: options that fit:" in result.stderr and "--dtype fp8 --tp 1" in result.stderr


def test_cli_plan_of_a_catalog_model_needs_no_network(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    for model in ("llama-3.1-8b-instruct", "hf:meta-llama/Llama-3.1-8B-Instruct"):
        result = CliRunner().invoke(cli, ["plan", "-m", model, "--json"])
        assert result.exit_code == 0, result.output
        data = json.loads(result.stdout)
        assert data["kv_bytes_per_token"] == 131072 and data["parameter_count"] == 8_030_261_248
        assert data["config_from"] == "catalog (config.json of hf:meta-llama/Llama-3.1-8B-Instruct)"
    for name in (
        "llama-3.1-70b-instruct",
        "llama-3.2-1b-instruct",
        "llama-3.2-3b-instruct",
        "mistral-7b-instruct-v0.3",
        "qwen2.5-7b-instruct",
        "qwen2.5-72b-instruct",
    ):
        assert CliRunner().invoke(cli, ["plan", "-m", name, "--dtype", "fp8"]).exit_code == 0, name


def test_a_catalog_model_plans_the_same_with_and_without_a_revision(monkeypatch):
    """toolkit deploy's build Job rebuilds hf:ORG/NAME@REV of a repository built from hf:ORG/NAME: the
    plans must be equal, or the rebuilt repository's fingerprint differs after hours of building."""
    import toolkit.model.sources as sources
    from toolkit.build import BuildRequest, plan_build
    from toolkit.model.catalog import entry_for_hub_id

    hub_id = "meta-llama/Llama-3.1-8B-Instruct"
    entry = entry_for_hub_id(hub_id)

    def download_config(repo_id, revision=None):  # the hub at that revision: the catalog's config
        path = Path(tempfile.mkdtemp()) / "config.json"
        path.write_text(json.dumps(entry.config))
        return path

    monkeypatch.setattr(sources, "download_config", download_config)
    recipe = "llama-3.1-8b-instruct-h100-sxm-fp8"
    plain = plan_build(BuildRequest.make(recipe=recipe, model=f"hf:{hub_id}"))
    pinned = plan_build(BuildRequest.make(recipe=recipe, model=f"hf:{hub_id}@0123456789abcdef"))
    assert plain.planned.memory.to_dict() == pinned.planned.memory.to_dict()
