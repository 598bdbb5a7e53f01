"""What the repository's Python models share: their start, config parameters, request scalars, the final
flag, error responses.

Every parameter a model reads is written into its config.pbtxt by `toolkit build`; a missing one is
an error naming it, never a silent default that could disagree with the rest of the repository.
"""

from __future__ import annotations

import json

from lifetime import bind_to_server


def start_model(args: dict) -> ModelParams:
    """What every model's initialize does first: bind the stub to its server (common/lifetime.py), then
    read the model's config parameters."""
    bind_to_server()
    return ModelParams(args)


class ModelParams:
    """The `parameters` of a model's config (strings), read with their types."""

    def __init__(self, args: dict):
        config = json.loads(args["model_config"])
        self.model = config.get("name", "?")
        self.max_batch_size = int(config.get("max_batch_size", 0))
        self.values = {
            key: value.get("string_value", "")
            for key, value in config.get("parameters", {}).items()
        }

    def text(self, key: str) -> str:
        if key not in self.values:
            raise KeyError(
                f"model {self.model}: parameter {key!r} is missing from config.pbtxt; rebuild the repository with "
                "toolkit build"
            )
        return self.values[key]

    def integer(self, key: str) -> int:
        return int(self.text(key))

    def number(self, key: str) -> float:
        return float(self.text(key))

    def flag(self, key: str) -> bool:
        return self.text(key).strip().lower() == "true"

    def ids(self, key: str) -> tuple[int, ...]:
        """A comma-separated list of token ids ("" is none)."""
        return tuple(int(part) for part in self.text(key).split(",") if part.strip())


def final_flag(pb_utils) -> int:
    """TRITONSERVER_RESPONSE_COMPLETE_FINAL; it lives in the C++ half of pb_utils, present once the stub runs."""
    return pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


def scalar(pb_utils, request, name: str, default=None):
    """A request's optional scalar input as a Python value, or `default` when absent."""
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None:
        return default
    return tensor.as_numpy().reshape(-1)[0].item()


def error_response(pb_utils, message: str):
    """A response that fails this request alone (the server keeps serving the others)."""
    return pb_utils.InferenceResponse(error=pb_utils.TritonError(message))
