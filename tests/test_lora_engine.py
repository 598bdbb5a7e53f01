"""The CPU engine's LoRA adapters (model_repo/tensorrt_llm_cpu/1/lora.py) on transformers' real continuous-batching
manager over the tiny random model, no server: base and adapter requests in one batch, each greedy output equal to
transformers + peft generating with that adapter alone; the prefix cache never hands one adapter's KV blocks to
another; and the request side (model_repo/common/adapters.py): unknown task ids and run-time weights refused."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np
import pytest

ENGINE = Path(__file__).resolve().parents[1] / "model_repo" / "tensorrt_llm_cpu" / "1"
COMMON = Path(__file__).resolve().parents[1] / "model_repo" / "common"
sys.path[:0] = [str(ENGINE), str(COMMON)]

from lora_tasks import AdapterTable  # noqa: E402
from sampling import RequestDecoding  # noqa: E402
from textcodec import Refused  # noqa: E402
from tiny import engine_batching, make_tiny_checkpoint  # noqa: E402

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
ADAPTERS = {1: ("alpha", 1, 8, TARGETS), 2: ("beta", 2, 4, ["q_proj", "v_proj", "down_proj"])}
NEW_TOKENS = 10


def make_adapter(checkpoint: Path, folder: Path, seed: int, rank: int, targets: list[str]) -> Path:
    """A PEFT adapter of the checkpoint with random non-zero B (so it changes the model's greedy answer)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32)
    config = LoraConfig(
        r=rank, lora_alpha=2 * rank, target_modules=targets, init_lora_weights=False
    )
    get_peft_model(model, config).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def lora_setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("lora")
    checkpoint = make_tiny_checkpoint(root / "checkpoint")
    for task, (_, seed, rank, targets) in ADAPTERS.items():
        make_adapter(checkpoint, root / "lora" / str(task), seed, rank, targets)
    table = AdapterTable(json.dumps({str(t): spec[0] for t, spec in ADAPTERS.items()}))
    return checkpoint, root / "lora", table


def _model(checkpoint):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        checkpoint, dtype=torch.float32, attn_implementation="sdpa"
    )
    return model.eval()


@pytest.fixture(scope="module")
def engine(lora_setup):
    """The manager as the CPU engine builds it with adapters: peft-loaded, token-routed, prefix cache keyed."""
    from transformers import GenerationConfig

    from lora import key_prefix_cache_by_adapter, load_adapters, route_adapters
    from sampling import Decoder, install_decoder

    checkpoint, folder, table = lora_setup
    model = load_adapters(_model(checkpoint), folder, table)
    key_prefix_cache_by_adapter()
    manager = engine_batching(
        model,
        GenerationConfig(do_sample=False, max_new_tokens=32, eos_token_id=-1),
        max_batch_tokens=256,
        max_requests_per_batch=16,
        num_blocks=128,
        page_size=16,
    )
    install_decoder(manager, Decoder(model.config.vocab_size))
    routed = route_adapters(model, manager, table)
    manager.start()
    yield manager, routed
    manager.stop(block=True, timeout=10, hard_stop=True)


@pytest.fixture(scope="module")
def reference(lora_setup):
    """Greedy continuations by transformers + peft, one adapter at a time (None: the plain base model)."""
    import torch
    from peft import PeftModel

    checkpoint, folder, _ = lora_setup
    base = _model(checkpoint)
    cache: dict = {}

    def generate(prompt: list[int], task: int | None) -> list[int]:
        key = (tuple(prompt), task)
        if key not in cache:
            if task is None:
                model = base
            else:
                model = PeftModel.from_pretrained(_model(checkpoint), str(folder / str(task)))
            with torch.no_grad():
                out = model.generate(
                    torch.tensor([prompt]),
                    max_new_tokens=NEW_TOKENS,
                    do_sample=False,
                    eos_token_id=None,
                    pad_token_id=0,
                )
            cache[key] = out[0, len(prompt) :].tolist()
        return cache[key]

    return generate


_ids = iter(range(10**6))


def run_all(
    manager, requests: list[tuple[list[int], int]], tag=None, timeout=120
) -> list[list[int]]:
    """Submit every (prompt, task id) at once (one continuous batch); their greedy tokens, in order. The
    request ids are `{tag}-{index}`."""
    tag = tag or f"l{next(_ids)}"
    ids = []
    for index, (prompt, task) in enumerate(requests):
        request_id = f"{tag}-{index}"
        manager.add_request(
            prompt,
            request_id=request_id,
            max_new_tokens=NEW_TOKENS,
            eos_token_id=-1,
            decoding=RequestDecoding(adapter=task),
        )
        ids.append(request_id)
    done, deadline = {}, time.time() + timeout
    while len(done) < len(ids) and time.time() < deadline:
        result = manager.get_result(timeout=0.5)
        if result is not None and result.is_finished() and result.request_id in ids:
            assert result.error is None, result.error
            done[result.request_id] = result.generated_tokens
    assert len(done) == len(ids), "timed out"
    return [done[i] for i in ids]


def _prompt(seed: int, length: int) -> list[int]:
    return np.random.default_rng(seed).integers(3, 300, length).tolist()


def test_every_lora_linear_is_routed(engine):
    _, routed = engine
    assert routed == 2 * len(
        TARGETS
    )  # 2 layers; adapter 1 targets all seven, adapter 2 a subset of them


def test_base_and_both_adapters_in_one_batch_each_equal_peft_alone(engine, reference):
    manager, _ = engine
    prompts = [_prompt(i, 5 + 3 * i) for i in range(6)]
    requests = [(p, i % 3) for i, p in enumerate(prompts)]
    outputs = run_all(manager, requests)
    for (prompt, task), got in zip(requests, outputs, strict=True):
        assert got == reference(prompt, task or None), f"task {task}"
    same = prompts[0]
    answers = {task: reference(same, task or None) for task in (0, 1, 2)}
    assert len({tuple(a) for a in answers.values()}) == 3, "the adapters must change the answer"


def test_a_shared_prompt_is_never_served_another_adapter_s_kv_blocks(engine, reference):
    """The research's defect: a prompt computed by the base model first, then asked under each adapter (and
    again under the base model) while its blocks are cached. Each answer must still be its own adapter's."""
    manager, _ = engine
    shared = _prompt(99, 70)  # 4 full blocks of 16 that the prefix cache could hand on
    assert run_all(manager, [(shared, 0)]) == [reference(shared, None)]
    outputs = run_all(manager, [(shared, 1), (shared, 2), (shared, 0), (shared, 1)])
    assert outputs == [reference(shared, t or None) for t in (1, 2, 0, 1)]


def test_requests_of_one_adapter_still_share_their_prefix(engine, reference):
    from cache_stats import PrefixHits, record_prefix_hits

    manager, _ = engine
    hits = PrefixHits(16)
    record_prefix_hits(hits)
    shared = _prompt(7, 50)
    run_all(manager, [(shared, 1)])
    assert run_all(manager, [(shared, 1)], tag="again") == [reference(shared, 1)]
    assert hits.pop("again-0") == 48  # 3 blocks of 16 reused within adapter 1
    assert run_all(manager, [(shared, 2)], tag="other") == [reference(shared, 2)]
    assert hits.pop("other-0") == 0


def test_every_choice_of_an_adapter_request_forked_n_ways_keeps_its_adapter(engine, reference):
    manager, _ = engine
    prompt = _prompt(11, 40)
    manager.num_return_sequences = 3
    try:
        manager.add_request(
            prompt,
            request_id="forked",
            max_new_tokens=NEW_TOKENS,
            eos_token_id=-1,
            decoding=RequestDecoding(adapter=2),
        )
    finally:
        manager.num_return_sequences = 1
    wanted = {"forked", "forked__child#0", "forked__child#1"}
    done, deadline = {}, time.time() + 120
    while set(done) != wanted and time.time() < deadline:
        result = manager.get_result(timeout=0.5)
        if result is not None and result.is_finished() and result.request_id in wanted:
            done[result.request_id] = result.generated_tokens
    assert set(done) == wanted
    assert reference(prompt, 2) != reference(prompt, None)
    assert all(tokens == reference(prompt, 2) for tokens in done.values())  # greedy: all alike


# --- the request side: lora_task_id, lora_weights / lora_config -------------------------------------------
class _Tensor:
    def __init__(self, value):
        self.value = np.asarray(value)

    def as_numpy(self):
        return self.value


class _PbUtils:
    @staticmethod
    def get_input_tensor_by_name(request, name):
        return request.get(name)


def _task(table, **inputs):
    return table.task_of(_PbUtils, {k: _Tensor(v) for k, v in inputs.items()})


def test_the_task_id_picks_an_adapter_and_zero_or_none_the_base_model(lora_setup):
    _, _, table = lora_setup
    assert _task(table) == 0
    assert _task(table, lora_task_id=np.array([0], np.uint64)) == 0
    assert _task(table, lora_task_id=np.array([2], np.uint64)) == 2


def test_an_unknown_task_id_is_refused_naming_the_known_ones(lora_setup):
    _, _, table = lora_setup
    with pytest.raises(Refused) as refused:
        _task(table, lora_task_id=np.array([7], np.uint64))
    assert str(refused.value) == (
        "[refused:lora_unknown] unknown LoRA task id 7; this repository has 1 (alpha), 2 (beta)"
    )
    with pytest.raises(Refused, match="no LoRA adapters: rebuild it with --lora NAME=PATH"):
        _task(AdapterTable("{}"), lora_task_id=np.array([1], np.uint64))


@pytest.mark.parametrize("name", ["lora_weights", "lora_config"])
def test_run_time_adapter_weights_are_refused_naming_the_build_setting(lora_setup, name):
    _, _, table = lora_setup
    with pytest.raises(Refused, match=rf"unsupported_parameter\] {name}: .*--lora NAME=PATH"):
        _task(table, **{name: np.zeros((1, 3), np.int32)})
