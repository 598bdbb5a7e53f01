"""The tokenizer-info file of the tensorrtllm backend's guided decoding (xgrammar), written at build time.

The backend's C++ reads `xgrammar_tokenizer_info_path` at load and builds xgrammar's TokenizerInfo
from three keys of that JSON file (tests/data/upstream/triton_backend.json, guided_decoding):
`encoded_vocab` (every token's string, by id), `tokenizer_str` (the whole tokenizer.json) and
`stop_token_ids`. TensorRT-LLM's examples/generate_xgrammar_tokenizer_info.py writes the same keys
from a Hugging Face tokenizer (tests/data/upstream/trtllm_tools.json); we write them from the
repository's own tokenizer.json, with no TensorRT-LLM install. Its stop ids are the tokenizer's eos
only; ours are every end id the repository knows (a chat model's end of turn is often another token),
since xgrammar allows a stop token only where the grammar may end and requires one once it has.
"""

from __future__ import annotations

import json
from pathlib import Path

from toolkit.errors import RepositoryError

TOKENIZER_INFO = "xgrammar_tokenizer_info.json"  # the name the stock script gives it


def xgrammar_tokenizer_info(tokenizer_json: Path, stop_ids: list[int]) -> dict:
    """The tokenizer-info object for the tokenizer in `tokenizer_json`; RepositoryError if its ids have gaps
    (xgrammar takes a token's id from its position in encoded_vocab)."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(tokenizer_json))
    by_id = sorted(tokenizer.get_vocab(with_added_tokens=True).items(), key=lambda item: item[1])
    missing = [i for i, (_, token_id) in enumerate(by_id) if token_id != i]
    if missing:
        raise RepositoryError(
            f"{tokenizer_json}: token ids are not contiguous (no token has id {missing[0]}), so xgrammar "
            "cannot take ids from positions in encoded_vocab",
            hint="build without guided decoding, or use a tokenizer whose ids run 0..N-1",
            value=missing[0],
        )
    return {
        "encoded_vocab": [token for token, _ in by_id],
        "tokenizer_str": tokenizer.to_str(),
        "stop_token_ids": list(dict.fromkeys(int(i) for i in stop_ids)),
    }


def write_tokenizer_info(folder: Path, tokenizer_json: Path, stop_ids: list[int]) -> Path:
    """Write TOKENIZER_INFO into `folder`; its path."""
    path = Path(folder) / TOKENIZER_INFO
    info = xgrammar_tokenizer_info(tokenizer_json, stop_ids)
    path.write_text(json.dumps(info, ensure_ascii=False), encoding="utf-8")
    return path
