"""Calibration of fp8 / int4-awq weights (ModelOpt's quantize.py): which data, on how many GPUs, how much
memory each holds.

quantize.py (TensorRT-LLM 0.20) loads the whole bf16 checkpoint with transformers' device_map "auto",
which spreads it over every visible GPU, and calibrates on `--calib_dataset`: by default the hub's
cnn_dailymail, downloaded at run time. A local folder works offline: tensorrt_llm/quantization/
quantize_by_modelopt.py get_calib_dataloader reads any folder with datasets.load_dataset(folder,
split="train") and takes its `text` column, except that a name containing "cnn_dailymail" or
"scienceqa" / "science_qa" is read as that dataset instead (sources: tests/data/upstream/
trtllm_tools.json, quantize.py).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from toolkit.build_settings import BuildSettings
from toolkit.engine.commands import needs_quantizer
from toolkit.errors import EngineBuildError
from toolkit.plan.gpus import GB
from toolkit.plan.memory import MemoryPlan
from toolkit.settings import hub_offline

GIB = 2**30

# Hub checkpoints are bf16: 2 bytes per parameter the plan counts.
CHECKPOINT_BYTES_PER_PARAMETER = 2
# Besides its share of the checkpoint, each GPU holds its CUDA context and the activations of one
# calibration batch (batch 1 x 512 tokens, quantize.py's defaults).
CALIBRATION_OVERHEAD_BYTES = 4 * GIB
# Names quantize.py reads as a hub dataset of its own, even for a local folder.
SPECIAL_NAMES = ("cnn_dailymail", "scienceqa", "science_qa")
DATA_SUFFIXES = (".jsonl", ".json", ".parquet", ".csv", ".txt", ".arrow")
# The quantize step with a local set: neither the hub nor datasets may reach the network.
OFFLINE_ENVIRONMENT = (("HF_DATASETS_OFFLINE", "1"), ("HF_HUB_OFFLINE", "1"))
DEFAULT_DATASET = "cnn_dailymail"


@dataclass(frozen=True)
class CalibrationPlan:
    dataset: str  # a local folder, or quantize.py's default (the hub's cnn_dailymail)
    offline: bool  # the quantize step runs with the hub and datasets offline
    gpus: int  # the build's GPUs: the checkpoint is spread over them
    checkpoint_bytes: int  # bf16
    bytes_per_gpu: int

    def to_dict(self) -> dict:
        return asdict(self)


def plan_calibration(memory: MemoryPlan, settings: BuildSettings) -> CalibrationPlan | None:
    """The calibration of this build, checked; None when nothing is quantized."""
    if not needs_quantizer(memory):
        return None
    dataset = check_dataset(settings.calib_dataset) if settings.calib_dataset else None
    gpus = settings.calib_gpus or memory.world_size
    checkpoint = memory.parameter_count * CHECKPOINT_BYTES_PER_PARAMETER
    per_gpu = math.ceil(checkpoint / gpus) + CALIBRATION_OVERHEAD_BYTES
    if per_gpu > memory.gpu_memory_bytes:
        raise EngineBuildError(
            _too_big(memory, gpus, checkpoint), hint=_gpus_hint(memory, checkpoint)
        )
    return CalibrationPlan(
        dataset=str(dataset) if dataset else DEFAULT_DATASET,
        offline=dataset is not None,
        gpus=gpus,
        checkpoint_bytes=checkpoint,
        bytes_per_gpu=per_gpu,
    )


def _too_big(memory: MemoryPlan, gpus: int, checkpoint: int) -> str:
    return (
        f"calibrating {memory.model} holds its bf16 checkpoint ({checkpoint / GB:.1f} GB) on the build's "
        f"{gpus} GPU{'s' if gpus > 1 else ''} ({memory.gpu_memory_bytes / GB:.1f} GB each, "
        f"{CALIBRATION_OVERHEAD_BYTES / GB:.1f} GB of which the calibration itself needs): it does not fit"
    )


def _gpus_hint(memory: MemoryPlan, checkpoint: int) -> str:
    usable = memory.gpu_memory_bytes - CALIBRATION_OVERHEAD_BYTES
    needed = math.ceil(checkpoint / usable)
    return (
        f"pass --calib-gpus {needed} (quantization.calib_gpus in a recipe; the build machine then needs "
        f"{needed} GPUs), or build with --tp {needed}"
    )


def check_dataset(path: Path) -> Path:
    """A local calibration folder quantize.py reads as its own data; EngineBuildError otherwise."""
    folder = Path(path).expanduser().resolve()
    problem = _dataset_problem(folder)
    if problem is not None:
        raise EngineBuildError(
            f"--calib-dataset {folder}: {problem}",
            hint="point --calib-dataset at a folder of .jsonl / .json / .parquet / .csv / .txt files "
            "whose rows have a `text` field (datasets.load_dataset(folder, split='train'))",
            value=str(folder),
        )
    return folder


def _dataset_problem(folder: Path) -> str | None:
    if not folder.exists():
        return "does not exist"
    if not folder.is_dir():
        return "is not a folder (quantize.py reads a folder with datasets.load_dataset)"
    special = [name for name in SPECIAL_NAMES if name in str(folder).lower()]
    if special:
        return (
            f"its path contains {special[0]!r}, which quantize.py reads as that hub dataset instead of "
            "the folder: move or rename it"
        )
    files = sorted(f for f in folder.rglob("*") if f.suffix in DATA_SUFFIXES and f.is_file())
    if not files:
        return f"holds no data file ({', '.join(DATA_SUFFIXES)})"
    if files[0].suffix in (".jsonl", ".json") and not _has_text(files[0]):
        return f"the rows of {files[0].name} have no `text` field, the column quantize.py calibrates on"
    return None


def _has_text(path: Path) -> bool:
    """Whether the first record of a JSON Lines (or JSON list) file has a `text` field."""
    with path.open(encoding="utf-8", errors="replace") as handle:
        head = handle.read(1 << 16)
    first = head.lstrip()[:1]
    try:
        record = json.loads(head.splitlines()[0]) if first == "{" else json.loads(head)[0]
    except (json.JSONDecodeError, IndexError, KeyError, TypeError):
        return False
    return isinstance(record, dict) and "text" in record


def check_calibration_source(calibration: CalibrationPlan | None) -> None:
    """Refuse, before anything is downloaded or run, a calibration that would download its data with the
    hub offline (quantize.py would fail there after the checkpoint's download and the model's load)."""
    if calibration is None or calibration.offline or not _offline():
        return
    raise EngineBuildError(
        f"calibration reads the hub's {DEFAULT_DATASET}, which quantize.py downloads at run time, and "
        "the hub is offline here (HF_HUB_OFFLINE / HF_DATASETS_OFFLINE)",
        hint="pass --calib-dataset DIR (quantization.calib_dataset in a recipe): a local folder with a "
        "`text` column in its train split",
    )


def _offline() -> bool:
    """Whether huggingface_hub or datasets are told to stay offline (their own environment variables)."""
    return hub_offline() or os.environ.get("HF_DATASETS_OFFLINE", "") not in ("", "0")
