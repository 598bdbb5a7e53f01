"""The CPU engine's decoding step (model_repo/tensorrt_llm_cpu/1/sampling.py, grammars.py) on transformers' real
continuous-batching manager over the tiny random model, no server: seeds, TensorRT-LLM's penalties and bias,
exact log probs, guided decoding and n > 1, each checked against a plain forward pass of the same model."""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path

import pytest

ENGINE = Path(__file__).resolve().parents[1] / "model_repo" / "tensorrt_llm_cpu" / "1"
COMMON = Path(__file__).resolve().parents[1] / "model_repo" / "common"
sys.path[:0] = [str(ENGINE), str(COMMON)]

from transformers.generation.continuous_batching.requests import (  # noqa: E402
    RequestState,
    RequestStatus,
)

from sampling import GREEDY, RequestDecoding, row_seed  # noqa: E402
from tiny import engine_batching, make_tiny_checkpoint  # noqa: E402

END_ID = 2  # the tiny checkpoint's <|im_end|>


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    import torch
    from transformers import AutoModelForCausalLM

    path = make_tiny_checkpoint(tmp_path_factory.mktemp("tiny") / "checkpoint")
    model = AutoModelForCausalLM.from_pretrained(
        path, dtype=torch.float32, attn_implementation="sdpa"
    )
    return path, model.eval()


@pytest.fixture(scope="module")
def engine(tiny):
    """The manager as the engine builds it: no transformers processors, the Decoder deciding every token."""
    from transformers import GenerationConfig

    from cache_stats import PrefixHits, record_prefix_hits
    from grammars import GrammarMasks
    from sampling import Decoder, install_decoder

    path, model = tiny
    hits = PrefixHits(16)
    record_prefix_hits(hits)
    generation = GenerationConfig(do_sample=False, max_new_tokens=32, eos_token_id=END_ID)
    manager = engine_batching(
        model,
        generation,
        max_batch_tokens=64,
        max_requests_per_batch=16,
        num_blocks=128,
        page_size=16,
    )
    vocab = model.config.vocab_size
    grammars = GrammarMasks(str(path / "tokenizer.json"), vocab, [END_ID])
    decoder = Decoder(vocab, grammars)
    install_decoder(manager, decoder)
    manager.start()
    yield manager, decoder, grammars, hits
    manager.stop(block=True, timeout=10, hard_stop=True)


_ids = iter(range(10**6))


def run(manager, prompt, decoding=GREEDY, *, n=1, max_new_tokens=12, eos=END_ID, timeout=120):
    """One request (forked n ways); {request id: final GenerationOutput}."""
    request_id = f"t{next(_ids)}"
    manager.num_return_sequences = n
    try:
        manager.add_request(
            prompt,
            request_id=request_id,
            max_new_tokens=max_new_tokens,
            eos_token_id=eos,
            decoding=decoding,
        )
    finally:
        manager.num_return_sequences = 1
    wanted = {request_id, *(f"{request_id}__child#{i}" for i in range(n - 1))}
    done, deadline = {}, time.time() + timeout
    while set(done) != wanted and time.time() < deadline:
        result = manager.get_result(timeout=0.5)
        if result is not None and result.is_finished() and result.request_id in wanted:
            assert result.error is None, result.error
            done[result.request_id] = result
    assert set(done) == wanted, f"timed out: {sorted(wanted - set(done))}"
    return dict(sorted(done.items()))


def prompt_ids(path, text="The capital of France is"):
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(path / "tokenizer.json")).encode(text).ids


# --- seeds ------------------------------------------------------------------------------------------
def _state(generated, seed=42, request_id="r1"):
    state = RequestState(request_id, [5, 6, 7], logit_processor_kwargs={"decoding": None})
    state._status = RequestStatus.DECODING
    state.generated_tokens = list(generated)
    return state


def _seed(state, seed=42):
    return row_seed(state, RequestDecoding(top_k=50, seed=seed))


def test_the_seeded_step_survives_a_soft_reset():
    """Under KV pressure transformers re-queues a request with its output moved into its prompt; the next
    draw must use the same step. (Failed before: the step restarted at 0, so the text depended on load.)"""
    state = _state([8, 9, 10])
    reset = state.create_equivalent_initial_request()
    reset._status = RequestStatus.DECODING
    assert reset.generated_tokens == [] and _seed(reset) == _seed(state)


def test_the_choices_of_one_request_get_their_own_seeds_and_choice_0_keeps_the_request_s():
    """(Failed before: forks copy the request's kwargs, so all n choices drew the same tokens.)"""
    parent = _state([])
    children = [parent.fork(f"r1__child#{i}") for i in range(3)]
    seeds = [_seed(s) for s in (parent, *children)]
    assert len(set(seeds)) == 4
    assert _seed(parent) == _seed(_state([], request_id="other"))  # n = 1 text is unchanged


# --- against a plain forward pass --------------------------------------------------------------------
def reference(model, prompt, steps, *, bias=None, rep=1.0, presence=0.0, frequency=0.0):
    """Greedy tokens and each step's raw log_softmax, TensorRT-LLM's bias and penalties applied by hand."""
    import torch

    tokens, logprobs = list(prompt), []
    for _ in range(steps):
        with torch.no_grad():
            logits = model(torch.tensor([tokens])).logits[0, -1].float()
        logprobs.append(torch.log_softmax(logits, -1))
        x = logits.clone()
        if bias is not None:
            for token, value in bias:
                x[token] += value
        counts = torch.bincount(torch.tensor(tokens), minlength=x.numel()).float()
        seen = counts > 0
        y = torch.where(x < 0, x * rep, x / rep) - presence - frequency * counts
        x = torch.where(seen, y, x)
        tokens.append(int(x.argmax()))
    return tokens[len(prompt) :], logprobs


@pytest.mark.parametrize(
    "settings",
    [
        {},
        {"repetition_penalty": 1.3},
        {"repetition_penalty": 0.7},
        {"presence_penalty": 1.5},
        {"frequency_penalty": 0.8},
        {"repetition_penalty": 1.2, "presence_penalty": 0.5, "frequency_penalty": 0.3},
        {"logit_bias": ((17, 5.0), (40, -3.0))},
    ],
)
def test_greedy_tokens_with_penalties_and_bias_are_tensorrt_llm_s(engine, tiny, settings):
    manager = engine[0]
    path, model = tiny
    prompt = prompt_ids(path)
    got = run(manager, prompt, RequestDecoding(**settings), eos=-1)
    expected, _ = reference(
        model,
        prompt,
        12,
        bias=settings.get("logit_bias"),
        rep=settings.get("repetition_penalty", 1.0),
        presence=settings.get("presence_penalty", 0.0),
        frequency=settings.get("frequency_penalty", 0.0),
    )
    assert next(iter(got.values())).generated_tokens == expected


def test_log_probs_and_top_alternatives_equal_a_plain_forward_pass(engine, tiny):
    import torch

    manager = engine[0]
    path, model = tiny
    prompt = prompt_ids(path, "Hello world, this is")
    result = next(iter(run(manager, prompt, RequestDecoding(logprobs=5), eos=-1).values()))
    tokens, expected = reference(model, prompt, 12)
    assert result.generated_tokens == tokens
    assert len(result.logprobs) == len(tokens)
    for token, (logprob, ids, values), reference_row in zip(
        tokens, result.logprobs, expected, strict=True
    ):
        assert abs(logprob - float(reference_row[token])) < 1e-4
        best, best_ids = torch.topk(reference_row, 5)
        assert list(ids) == best_ids.tolist()
        assert max(abs(a - b) for a, b in zip(values, best.tolist(), strict=True)) < 1e-4


# --- guided decoding ---------------------------------------------------------------------------------
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 6},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "role": {"enum": ["admin", "user"]},
        "tags": {"type": "array", "items": {"type": "boolean"}, "maxItems": 2},
    },
    "required": ["name", "age", "role", "tags"],
    "additionalProperties": False,
}


def _guided(engine, tiny, kind, guide, seed=None, n=1, max_new_tokens=64):
    from tokenizers import Tokenizer

    manager, _, grammars, _ = engine
    path, _ = tiny
    guide_id = grammars.register(kind, guide)
    sampled = {"top_k": 400, "seed": seed} if seed is not None else {}
    decoding = RequestDecoding(guide=guide_id, end_id=END_ID, **sampled)
    try:
        results = run(manager, prompt_ids(path), decoding, n=n, max_new_tokens=max_new_tokens)
    finally:
        grammars.unregister(guide_id)
    tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
    texts = []
    for result in results.values():
        tokens = result.generated_tokens
        assert tokens and tokens[-1] == END_ID, "a guided output ends with the end token"
        texts.append(tokenizer.decode(tokens[:-1]))
    return texts


@pytest.mark.parametrize("seed", [None, 1, 2, 3])
def test_a_random_model_writes_schema_valid_json_under_guided_decoding(engine, tiny, seed):
    import jsonschema

    for text in _guided(engine, tiny, "json_schema", json.dumps(SCHEMA), seed=seed):
        jsonschema.validate(json.loads(text), SCHEMA)


def test_any_json_object_regex_and_ebnf_guides_hold(engine, tiny):
    assert isinstance(json.loads(_guided(engine, tiny, "json", None, seed=5)[0]), dict)
    regex = r"(\+33 ?|0)[1-9]( ?[0-9]{2}){4}"
    for text in _guided(engine, tiny, "regex", regex, seed=7, n=3):
        assert re.fullmatch(regex, text), text
    ebnf = 'root ::= "(" num ("+" num)* ")"\nnum ::= [0-9] [0-9]?'
    for text in _guided(engine, tiny, "ebnf_grammar", ebnf, seed=9):
        assert re.fullmatch(r"\(\d\d?(\+\d\d?)*\)", text), text


def test_a_guide_is_compiled_once_and_a_broken_one_is_named(engine):
    from guides import GuideError

    grammars = engine[2]
    before = grammars.stats()
    ids = [grammars.register("regex", "[a-c]{3}") for _ in range(3)]
    after = grammars.stats()
    assert after["compiled"] - before["compiled"] == 1 and after["reused"] - before["reused"] == 2
    for guide_id in ids:
        grammars.unregister(guide_id)
    with pytest.raises(GuideError, match="unclosed character class"):
        grammars.register("regex", "[0-9")
    with pytest.raises(GuideError, match="Invalid type"):
        grammars.register("json_schema", '{"type": "nonsense"}')


# --- n > 1 ---------------------------------------------------------------------------------------
def test_n_sampled_choices_differ_and_choice_0_is_the_single_request_s_text(engine, tiny):
    manager = engine[0]
    path, _ = tiny
    decoding = RequestDecoding(top_k=400, temperature=1.0, seed=11)
    prompt = prompt_ids(path)
    several = run(manager, prompt, decoding, n=4, eos=-1)
    texts = [tuple(r.generated_tokens) for r in several.values()]
    assert len(set(texts)) == 4
    single = next(iter(run(manager, prompt, decoding, eos=-1).values()))
    parent = next(r for rid, r in several.items() if "__child#" not in rid)
    assert tuple(single.generated_tokens) == tuple(parent.generated_tokens)


def test_a_prompt_already_in_the_cache_is_counted_as_reused(engine, tiny):
    manager, _, _, hits = engine
    path, _ = tiny
    prompt = (prompt_ids(path, "A quick brown fox jumps over the lazy dog.") * 6)[:70]
    first = next(iter(run(manager, prompt, max_new_tokens=2, eos=-1)))
    second = next(iter(run(manager, prompt, max_new_tokens=2, eos=-1)))
    assert hits.pop(first) == 0
    cached = hits.pop(
        second
    )  # whole 16-token blocks the first request completed, never the last token
    assert 0 < cached < len(prompt) and cached % 16 == 0
    assert hits.reused_blocks >= cached // 16


def test_a_request_released_while_still_in_a_step_leaves_no_state_behind():
    """The router ends a request (stop word, cancel) before the manager takes it out of the batch: its
    penalty counts were forgotten first and then made again by that step, and never freed (4 bytes x the
    vocabulary per request). Failed before: the entry stayed after the request had left the batch."""
    from types import SimpleNamespace

    from sampling import Decoder

    decoder = Decoder(16)
    state = _state([8, 9])
    state.logit_processor_kwargs = {"decoding": GREEDY}
    decoder.prepare_tensor_args([SimpleNamespace(state=state)])
    decoder.penalties.seen(state)  # a penalised row's counts, as the step's __call__ makes them
    decoder.release(state.request_id)
    decoder.prepare_tensor_args([SimpleNamespace(state=state)])  # still in this step's batch
    decoder.penalties.seen(state)
    assert state.request_id in decoder.penalties.entries  # its row still needs them this step
    decoder.prepare_tensor_args([])  # the first step without it
    assert decoder.penalties.entries == {}
