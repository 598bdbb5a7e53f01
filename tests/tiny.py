"""A tiny random Llama checkpoint with a small byte-level BPE tokenizer, made inside the test."""

from __future__ import annotations

import json
from pathlib import Path

from toy_tokenizers import CHATML_EOS, CHATML_TEMPLATE, byte_level_bpe, word_level

CORPUS = [
    "The capital of France is Paris.",
    "Hello world, this is a tiny tokenizer.",
    "café naïve résumé 日本語 🎉",
    "Numbers 0 1 2 3 4 5 6 7 8 9 and symbols !?.,;:",
    "A quick brown fox jumps over the lazy dog.",
]


def write_tiny_tokenizer(path: Path):
    """The tiny checkpoint's tokenizer files in `path` (a byte-level BPE trained on CORPUS, the ChatML
    template in chat_template.jinja); returns the tokenizer."""
    path.mkdir(parents=True, exist_ok=True)
    tokenizer = byte_level_bpe(CORPUS)
    tokenizer.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(
        json.dumps({"eos_token": CHATML_EOS, "bos_token": "<|im_start|>"})
    )
    (path / "chat_template.jinja").write_text(CHATML_TEMPLATE)
    return tokenizer


# The tiny checkpoint's shape, as config.json spells it.
TINY_LLAMA_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 512,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "tie_word_embeddings": False,
}


def tiny_llama_config(vocab_size: int, **overrides):
    """A transformers LlamaConfig of TINY_LLAMA_CONFIG's shape, `overrides` applied."""
    from transformers import LlamaConfig

    return LlamaConfig(**{**TINY_LLAMA_CONFIG, "vocab_size": vocab_size, **overrides})


def engine_batching(model, generation, **batching):
    """transformers' continuous-batching manager as the CPU engine configures it (per-request
    processors, no transformers queue: the engine bounds its own), `batching` sizing the cache."""
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    config = ContinuousBatchingConfig(per_request_processors=True, max_queue_size=0, **batching)
    return model.init_continuous_batching(
        generation_config=generation, continuous_batching_config=config
    )


def make_tiny_checkpoint(path: Path, *, weights: str = "safetensors") -> Path:
    import torch
    from transformers import LlamaForCausalLM

    tokenizer = write_tiny_tokenizer(path)
    config = tiny_llama_config(tokenizer.get_vocab_size())
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    model.generation_config.eos_token_id = 2
    if weights == "safetensors":
        model.save_pretrained(path)
    else:
        config.save_pretrained(path)
        torch.save(model.state_dict(), path / "pytorch_model.bin")
    return path


# --- a Llama-3-style checkpoint whose next token is a fixed function of the last one --------------
LLAMA3_SPECIAL = [
    "[UNK]",
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|eom_id|>",
    "<|eot_id|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
]
BIGRAM_WORDS = [
    "user",
    "assistant",
    "hello",
    "world",
    "stop1",
    "stop2",
    "stop3",
    "one",
    "two",
    "three",
    "loop",
    "junk",
    "capital",
    "France",
]
# next token after each token (greedy or sampled alike: the logit gap is 80): a deterministic "model"
BIGRAM_NEXT = {
    "<|end_header_id|>": "▁hello",
    "▁hello": "▁world",
    "▁world": "<|eot_id|>",  # a chat answer, then the turn end
    "▁stop1": "▁one",
    "▁one": "<|eot_id|>",  # the tokenizer's eos_token: the end_id
    "▁stop2": "▁two",
    "▁two": "<|end_of_text|>",  # generation_config's first eos id
    "▁stop3": "▁three",
    "▁three": "<|eom_id|>",  # another generation_config eos id
    "▁loop": "▁loop",  # never ends
}
BIGRAM_DEFAULT_NEXT = "▁junk"  # after an end token: only seen if generation did not stop there
LLAMA3_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|> "
    "{{ m['content'] }}<|eot_id|>{% endfor %}{% if add_generation_prompt %}"
    "<|start_header_id|>assistant<|end_header_id|>{% endif %}"
)


def make_bigram_checkpoint(path: Path) -> Path:
    """A Llama-3-style checkpoint made in the test: BOS added by the tokenizer, eos_token <|eot_id|> (id 4), while
    generation_config.json lists [2, 3, 4] (<|end_of_text|>, <|eom_id|>, <|eot_id|>) as Llama-3.1-Instruct does.
    Attention and MLP are zero and each embedding is a one-hot, so the LM head maps the last token to the next."""
    import torch
    from tokenizers import decoders, pre_tokenizers, processors
    from transformers import LlamaForCausalLM

    path.mkdir(parents=True, exist_ok=True)
    # LLAMA3_SPECIAL[0] is word_level's UNK (id 0): the special tokens take ids 0-6, the words 7 on
    tokenizer = word_level(
        LLAMA3_SPECIAL[1:] + [f"▁{w}" for w in BIGRAM_WORDS],
        pre_tokenizer=pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always"),
    )
    vocab = tokenizer.get_vocab()
    tokenizer.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
    tokenizer.add_special_tokens(LLAMA3_SPECIAL[1:])
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<|begin_of_text|> $A",
        pair="<|begin_of_text|> $A <|begin_of_text|> $B",
        special_tokens=[("<|begin_of_text|>", 1)],
    )
    tokenizer.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "bos_token": "<|begin_of_text|>",
                "eos_token": "<|eot_id|>",
                "chat_template": LLAMA3_TEMPLATE,
            }
        )
    )
    (path / "generation_config.json").write_text(
        json.dumps({"bos_token_id": 1, "eos_token_id": [2, 3, 4]})
    )
    size = len(vocab)
    config = tiny_llama_config(
        size,
        intermediate_size=32,
        num_hidden_layers=1,
        num_key_value_heads=4,
        max_position_embeddings=4096,
        eos_token_id=[2, 3, 4],
        tie_word_embeddings=False,
    )
    assert size <= config.hidden_size  # one one-hot direction per token
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        for name, tensor in model.named_parameters():
            if name.endswith("norm.weight"):
                tensor.fill_(1.0)
            else:
                tensor.zero_()
        model.model.embed_tokens.weight[:, :size] = torch.eye(size)
        for token, index in vocab.items():
            nxt = BIGRAM_NEXT.get(token, BIGRAM_DEFAULT_NEXT)
            model.lm_head.weight[vocab[nxt], index] = 10.0
    model.generation_config.eos_token_id = [2, 3, 4]
    model.save_pretrained(path)
    (path / "generation_config.json").write_text(
        json.dumps({"bos_token_id": 1, "eos_token_id": [2, 3, 4]})
    )
    return path


# --- tokenizers with each tool-calling family's markers (for synthetic repositories) -----------------
TOOL_MARKERS = {
    # family -> (tokens added to the vocabulary, whether they are special: dropped from the text)
    "hermes": (["<tool_call>", "</tool_call>"], False),  # Qwen2.5 keeps them as text
    "mistral": (["[TOOL_CALLS]"], True),
    "llama3_json": (["<|python_tag|>"], True),
}
TOOL_TEMPLATE = (
    "{% if tools %}<|im_start|>system\nTools: {{ tools | tojson }}<|im_end|>\n{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{% if m.tool_calls %}{% for c in m.tool_calls %}call {{ c.function.name }} "
    "{{ c.function.arguments | tojson }}{% endfor %}{% else %}{{ m['content'] }}{% endif %}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def make_tool_tokenizer(path: Path, family: str) -> dict[str, str]:
    """The tiny tokenizer with `family`'s tool-call markers added, and a chat template that renders tools:
    {file name: text}, for a config-only checkpoint."""
    from tokenizers import AddedToken, Tokenizer

    make_tiny_tokenizer(path)
    tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
    tokens, special = TOOL_MARKERS[family]
    tokenizer.add_tokens([AddedToken(t, special=special, normalized=False) for t in tokens])
    tokenizer.save(str(path / "tokenizer.json"))
    return {
        "tokenizer.json": (path / "tokenizer.json").read_text(),
        "tokenizer_config.json": json.dumps(
            {"eos_token": "<|im_end|>", "bos_token": "<|im_start|>"}
        ),
        "chat_template.jinja": TOOL_TEMPLATE,
    }


def make_tiny_tokenizer(path: Path) -> Path:
    """The tiny checkpoint's tokenizer.json alone."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    path.mkdir(parents=True, exist_ok=True)
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(CORPUS * 5, trainer)
    tokenizer.save(str(path / "tokenizer.json"))
    return path
