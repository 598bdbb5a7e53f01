"""Triton's gRPC wire format, as the API's hot path reads and writes it: a request's protobuf built straight
from its arrays, an output's raw bytes as an array."""

from __future__ import annotations

import numpy as np
from tritonclient.grpc import service_pb2
from tritonclient.utils import np_to_triton_dtype, serialize_byte_tensor

from toolkit.errors import ClientError

_DTYPES = {"FP32": "<f4", "INT32": "<i4", "INT64": "<i8", "FP16": "<f2", "BOOL": "?"}


def request_message(
    model_name: str,
    request_id: str,
    tensors: list[tuple[str, np.ndarray, str]],
    outputs: list[str] | None,
) -> service_pb2.ModelInferRequest:
    """The ModelInferRequest of one generation, built straight from the arrays (as tritonclient's InferInput
    would, without its objects: a dozen per request)."""
    request = service_pb2.ModelInferRequest(model_name=model_name, id=request_id)
    for name, array, datatype in tensors:
        request.inputs.add(name=name, datatype=datatype, shape=array.shape)
        request.raw_input_contents.append(raw_tensor(name, array, datatype))
    for name in outputs or ():
        request.outputs.add(name=name)
    # Decoupled models: an empty response carries the final flag when no data response does.
    request.parameters["triton_enable_empty_final_response"].bool_param = True
    return request


def raw_tensor(name: str, array: np.ndarray, datatype: str) -> bytes:
    """An input's raw contents: little-endian values, or length-prefixed items for BYTES (Triton's wire
    format, tritonclient's serialize_byte_tensor); its dtype checked as tritonclient's InferInput does."""
    if datatype == "BYTES":
        serialized = serialize_byte_tensor(array)
        return serialized.item() if serialized.size else b""
    if np_to_triton_dtype(array.dtype) != datatype:
        raise ClientError(
            f"the `{name}` input is {array.dtype} but declared {datatype}",
            hint="this is a toolkit bug: the tensor's dtype must match the repository contract",
            value=str(array.dtype),
        )
    return array.tobytes()


def output_array(output, raw: bytes) -> np.ndarray:
    """An output's raw little-endian bytes as an array of its shape."""
    return np.frombuffer(raw, _DTYPES.get(output.datatype, "<i4")).reshape(tuple(output.shape))
