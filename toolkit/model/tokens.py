"""Which token ids end a generation, and whether a prompt gets the tokenizer's special tokens.

The TensorRT-LLM backend takes one `end_id`. An instruct model ends its turn with its tokenizer's
`eos_token` (Llama-3.1-Instruct: `<|eot_id|>` 128009, while generation_config.json lists
[128001, 128008, 128009]), which is also what NVIDIA's stock preprocessing uses. So `end_id` is
the tokenizer's eos token, and every other id of generation_config's `eos_token_id` is a default
stop token: the same stop as a one-token stop word, which every engine honours.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

from toolkit.errors import RepositoryError
from toolkit.jsonfile import read_json


@dataclass(frozen=True)
class TokenFacts:
    end_id: int  # the token that ends an assistant turn
    pad_id: int
    # other end tokens (generation_config.eos_token_id): default stop tokens
    stop_ids: tuple[int, ...]
    bos_id: int | None  # the tokenizer's BOS, when its post-processor adds one to raw text
    add_special_tokens: bool  # raw text_input gets the tokenizer's special tokens (no double BOS)

    def to_dict(self) -> dict:
        data = asdict(self)
        data["stop_ids"] = list(self.stop_ids)
        return data

    @classmethod
    def from_dict(cls, data: dict) -> TokenFacts:
        return cls(
            int(data["end_id"]),
            int(data["pad_id"]),
            tuple(int(i) for i in data["stop_ids"]),
            None if data.get("bos_id") is None else int(data["bos_id"]),
            bool(data["add_special_tokens"]),
        )


def read_token_facts(checkpoint: Path) -> TokenFacts:
    """From tokenizer.json, tokenizer_config.json, generation_config.json and config.json of a checkpoint."""
    vocab = _token_ids(checkpoint / "tokenizer.json")
    tokenizer_config = _json(checkpoint / "tokenizer_config.json")
    generation = _json(checkpoint / "generation_config.json")
    config = _json(checkpoint / "config.json")
    # Every end token the checkpoint names: generation_config.json's (where Gemma's and Phi-3's turn ends live),
    # then config.json's.
    eos_ids = list(
        dict.fromkeys(_ids(generation.get("eos_token_id")) + _ids(config.get("eos_token_id")))
    )
    turn_end = vocab.get(_text(tokenizer_config.get("eos_token")) or "")
    end_id = turn_end if turn_end is not None else (eos_ids[0] if eos_ids else None)
    if end_id is None:
        raise RepositoryError(
            f"{checkpoint} names no end token (no eos_token in tokenizer_config.json, no eos_token_id in "
            "generation_config.json)",
            hint="add eos_token_id to the checkpoint's generation_config.json",
        )
    pad = vocab.get(_text(tokenizer_config.get("pad_token")) or "")
    pad_id = pad if pad is not None else _first(_ids(generation.get("pad_token_id")), end_id)
    stop_ids = tuple(i for i in dict.fromkeys(eos_ids) if i != end_id)
    bos_id = _bos_added_by_post_processor(checkpoint / "tokenizer.json")
    return TokenFacts(
        end_id=end_id, pad_id=pad_id, stop_ids=stop_ids, bos_id=bos_id, add_special_tokens=True
    )


def _bos_added_by_post_processor(tokenizer_json: Path) -> int | None:
    """The id a TemplateProcessing post-processor puts before a single sequence (Llama-3: 128000), if any."""
    spec = _json(tokenizer_json)
    processor = spec.get("post_processor") or {}
    processors = (
        processor.get("processors", [processor])
        if processor.get("type") == "Sequence"
        else [processor]
    )
    for item in processors:
        if item.get("type") != "TemplateProcessing":
            continue
        single = item.get("single") or []
        first = single[0] if single else {}
        token = (first.get("SpecialToken") or {}).get("id")
        ids = (item.get("special_tokens", {}).get(token) or {}).get("ids") if token else None
        if ids:
            return int(ids[0])
    return None


def _token_ids(tokenizer_json: Path) -> dict[str, int]:
    spec = _json(tokenizer_json)
    ids = {t["content"]: int(t["id"]) for t in spec.get("added_tokens", [])}
    vocab = (spec.get("model") or {}).get("vocab")
    if isinstance(vocab, dict):
        ids = {**{k: int(v) for k, v in vocab.items()}, **ids}
    return ids


def _json(path: Path) -> dict:
    if not path.is_file():
        return {}
    data = read_json(path, hint="re-download the checkpoint")
    return data if isinstance(data, dict) else {}


def _ids(value) -> list[int]:
    if isinstance(value, bool):
        return []
    if isinstance(value, int):
        return [value]
    if isinstance(value, list):
        return [int(v) for v in value if isinstance(v, int) and not isinstance(v, bool)]
    return []


def _text(value) -> str | None:
    if isinstance(value, dict):  # older tokenizer_config.json: {"content": "<s>", ...}
        return value.get("content")
    return value if isinstance(value, str) else None


def _first(values: list[int], default: int) -> int:
    return values[0] if values else default
