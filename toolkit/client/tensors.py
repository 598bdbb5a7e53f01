"""Request tensors for a served repository, typed by the repository contract.

One place turns (name, numpy array, Triton dtype) into tritonclient inputs, and one builds a
request to the engine model (`tensorrt_llm`) with every scalar typed as the contract declares it.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from toolkit.repository import contract as c

NUMPY = {"INT32": np.int32, "FP32": np.float32, "UINT64": np.uint64, "BOOL": bool}
_ENGINE_DTYPES = {t.name: t.dtype for t in c.PYTHON_ENGINE_INPUTS}


def infer_inputs(tensors: Iterable[tuple[str, np.ndarray, str]]) -> list:
    """tritonclient gRPC inputs (also valid for tritonclient.grpc.aio, which shares the class)."""
    import tritonclient.grpc as grpcclient

    inputs = []
    for name, array, dtype in tensors:
        item = grpcclient.InferInput(name, list(array.shape), dtype)
        item.set_data_from_numpy(array)
        inputs.append(item)
    return inputs


def scalar(name: str, value, dtype: str) -> tuple[str, np.ndarray, str]:
    """A [batch 1, 1] tensor, the shape every scalar input of the contract has on the wire."""
    return name, np.array([[value]], dtype=NUMPY[dtype]), dtype


def engine_tensors(
    prompt_ids: list[int], max_tokens: int, **scalars
) -> list[tuple[str, np.ndarray, str]]:
    """input_ids, input_lengths, request_output_len, plus optional engine scalars (streaming=True, end_id=2, ...)."""
    tensors = [
        ("input_ids", np.array([prompt_ids], dtype=np.int32), "INT32"),
        scalar("input_lengths", len(prompt_ids), "INT32"),
        scalar("request_output_len", max_tokens, "INT32"),
    ]
    for name, value in scalars.items():
        if name not in _ENGINE_DTYPES:
            raise ValueError(f"{name!r} is not an input of the {c.ENGINE} model")
        tensors.append(scalar(name, value, _ENGINE_DTYPES[name]))
    return tensors


def engine_inputs(prompt_ids: list[int], max_tokens: int, **scalars) -> list:
    return infer_inputs(engine_tensors(prompt_ids, max_tokens, **scalars))
