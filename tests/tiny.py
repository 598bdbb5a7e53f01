"""A tiny random Llama checkpoint with a small byte-level BPE tokenizer, made inside the test."""

from __future__ import annotations

import json
from pathlib import Path

CORPUS = [
    "The capital of France is Paris.",
    "Hello world, this is a tiny tokenizer.",
    "café naïve résumé 日本語 🎉",
    "Numbers 0 1 2 3 4 5 6 7 8 9 and symbols !?.,;:",
    "A quick brown fox jumps over the lazy dog.",
]


def make_tiny_checkpoint(path: Path, *, weights: str = "safetensors") -> Path:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM

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
    (path / "tokenizer_config.json").write_text(
        json.dumps({"eos_token": "<|im_end|>", "bos_token": "<|im_start|>"})
    )
    (path / "chat_template.jinja").write_text(
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    config = LlamaConfig(
        vocab_size=tokenizer.get_vocab_size(),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        eos_token_id=2,
        bos_token_id=1,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    model.generation_config.eos_token_id = 2
    if weights == "safetensors":
        model.save_pretrained(path)
    else:
        config.save_pretrained(path)
        torch.save(model.state_dict(), path / "pytorch_model.bin")
    return path
