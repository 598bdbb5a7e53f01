"""Reasoning models: the OpenAI API returns the <think> part as `reasoning_content`, as vLLM's deepseek_r1
reasoning parser does, streamed or not; the repository's model decides (its tokenizer's think tokens), and
`toolkit api --reasoning-parser` overrides it."""

from __future__ import annotations

import asyncio
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from toolkit.api import ApiSettings
from toolkit.api.generation import Generation, Job, SseFormatter
from toolkit.api.metrics import ApiMetrics
from toolkit.api.reasoning import PARSERS, reasoning_parser
from toolkit.api.responses import _drain, _sse, _whole_body
from toolkit.api.state import ApiState
from toolkit.api.triton import Piece, Sampling
from toolkit.errors import ToolkitError
from toolkit.repository.reader import open_repository

from repos import config_only_checkpoint, write_test_repository

R1 = PARSERS["deepseek_r1"]


@pytest.mark.parametrize(
    ("answer", "reasoning", "content"),
    [
        ("Paris is big.\n</think>\n\nParis.", "Paris is big.\n", "\n\nParis."),
        ("<think>Hmm.</think>Paris.", "Hmm.", "Paris."),  # the model repeated the opening tag
        ("Still thinking when cut", "Still thinking when cut", None),  # no </think>: all reasoning
        ("Done.</think>", "Done.", None),
    ],
)
def test_split_reads_answers_as_vllm_deepseek_r1(answer, reasoning, content):
    assert R1.split(answer) == (reasoning, content)


@given(
    st.lists(
        st.sampled_from(["<think>", "</think>", "<", "/", "think", ">", "a", " b", "\n"]),
        max_size=12,
    ),
    st.lists(st.integers(min_value=0, max_value=40), max_size=6),
)
def test_streamed_pieces_split_as_the_whole_answer_does(words, cuts):
    text = "".join(words)
    points = sorted({min(c, len(text)) for c in cuts})
    pieces = [text[a:b] for a, b in zip([0, *points], [*points, len(text)], strict=True) if b > a]
    stream = R1.stream()
    fields = [f for piece in pieces for f in stream.feed(piece)] + stream.flush()
    reasoning = "".join(t for f, t in fields if f == "reasoning_content")
    content = "".join(t for f, t in fields if f == "content")
    expected_reasoning, expected_content = R1.split(text)
    assert (reasoning, content or None) == (expected_reasoning or "", expected_content)


class _Pieces:
    engine = True

    def __init__(self, texts):
        self.texts = texts

    async def generate(self, prompt, prompt_ids, max_tokens, sampling):
        for i, text in enumerate(self.texts):
            yield Piece(text.encode(), i + 1, i == len(self.texts) - 1)


def _job() -> Job:
    return Job("chatcmpl-1", "chat", "m", "p", [1], 1, 64, Sampling(), ())


def test_a_stream_sends_reasoning_content_then_content():
    async def events():
        generation = Generation(
            _job(), _Pieces(["<thi", "nk>Let me ", "think.</th", "ink>Par", "is."]), ApiMetrics()
        )
        sse = SseFormatter(generation.job)
        return [chunk async for chunk in _sse(sse, [generation], generation.deltas(), None, R1)]

    lines = [
        line for chunk in asyncio.run(events()) for line in chunk.decode().split("\n\n") if line
    ]
    deltas = [json.loads(line[6:])["choices"][0]["delta"] for line in lines[:-1]]
    assert "".join(d.get("reasoning_content", "") for d in deltas) == "Let me think."
    assert "".join(d.get("content", "") or "" for d in deltas) == "Paris."
    assert all("<" not in (d.get("content") or "") + d.get("reasoning_content", "") for d in deltas)
    assert lines[-1] == "data: [DONE]"


def test_a_whole_answer_carries_both_fields():
    job = _job()
    generation = Generation(job, _Pieces(["Let me think.</think>", "Paris."]), ApiMetrics())
    asyncio.run(_drain(generation.deltas()))
    body = _whole_body([job], [generation], None, R1)
    message = body["choices"][0]["message"]
    assert (message["reasoning_content"], message["content"]) == ("Let me think.", "Paris.")
    plain = _whole_body([job], [generation], None)["choices"][0]["message"]
    assert "reasoning_content" not in plain and plain["content"] == "Let me think.</think>Paris."


def _repo(root, think_tokens: bool):
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = ["hello", "world", "<|im_end|>"]
    tokenizer = Tokenizer(
        models.WordLevel({"[UNK]": 0, **{w: i + 1 for i, w in enumerate(words)}}, "[UNK]")
    )
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    if think_tokens:
        tokenizer.add_tokens(["<think>", "</think>"])
    checkpoint = config_only_checkpoint(
        root / "ckpt",
        {
            "tokenizer.json": tokenizer.to_str(),
            "tokenizer_config.json": json.dumps({"eos_token": "<|im_end|>"}),
        },
        vocab_size=tokenizer.get_vocab_size(),
        eos_token_id=3,
    )
    return write_test_repository(checkpoint, root / "repo", synthetic=True, max_seq_len=64, max_input_len=32,
                                 max_output_len=16, kv_cache_tokens=256)  # fmt: skip


def test_the_repository_model_decides_and_the_api_option_overrides(tmp_path):
    thinking = _repo(tmp_path / "r1", think_tokens=True)
    plain = _repo(tmp_path / "plain", think_tokens=False)
    repository = open_repository(thinking)
    assert repository.manifest.model.facts.reasoning_parser == "deepseek_r1"
    assert ApiState(ApiSettings("127.0.0.1:1", thinking), repository).reasoning is R1
    off = ApiSettings("127.0.0.1:1", thinking, reasoning_parser="none")
    assert ApiState(off, repository).reasoning is None
    on = ApiSettings("127.0.0.1:1", plain, reasoning_parser="deepseek_r1")
    assert ApiState(on, open_repository(plain)).reasoning is R1
    assert ApiState(ApiSettings("127.0.0.1:1", plain), open_repository(plain)).reasoning is None
    with pytest.raises(ToolkitError, match="unknown reasoning parser 'qwen9'"):
        reasoning_parser("qwen9", None)


def test_a_tool_call_answer_keeps_its_reasoning_out_of_the_content():
    """With tool calls the content was set from the whole text again, <think> part included (failed before:
    content 'Let me think.</think>')."""
    from toolkit.api.tool_parsers import ParsedCall

    job = _job()
    generation = Generation(job, _Pieces(["Let me think.</think>"]), ApiMetrics())
    asyncio.run(_drain(generation.deltas()))
    generation.choices[0].tool_calls = [ParsedCall("get_weather", '{"city": "Paris"}', "call_1")]
    message = _whole_body([job], [generation], None, R1)["choices"][0]["message"]
    assert message["reasoning_content"] == "Let me think."
    assert message["content"] is None
    assert message["tool_calls"][0]["function"]["name"] == "get_weather"
