"""The engine files trtllm-build writes, by name: one serialized engine per rank.

trtllm-build writes `rank{N}.engine` for each of the world_size = TP x PP ranks beside config.json;
the build cache, the layout check and `toolkit deploy` (the bytes a replica loads) all name them here.
"""

from __future__ import annotations

from pathlib import Path


def rank_engine_file(engine_dir: Path, rank: int) -> Path:
    """The serialized engine of one tensor/pipeline-parallel rank."""
    return Path(engine_dir) / f"rank{rank}.engine"


def rank_engine_files(engine_dir: Path, world_size: int) -> list[Path]:
    """Every rank's engine file, rank 0 first."""
    return [rank_engine_file(engine_dir, rank) for rank in range(world_size)]
