"""Which LoRA adapter a request asks for, as the tensorrtllm backend reads it: `lora_task_id`.

The repository's adapters are built in (`toolkit build --lora NAME=PATH`) and numbered 1, 2, ... in the
order declared; 0 (or no `lora_task_id`) is the base model. The engine config's `lora_adapters`
parameter is {"<task id>": "<name>"}. An unknown task id is the client's error naming the known ones.
`lora_weights` / `lora_config` (an adapter sent with the request, which the GPU engine loads at run
time) are refused by the Python engines: they serve only the adapters built into the repository.
"""

from __future__ import annotations

import json

from textcodec import Refused

BASE_TASK = 0
RUNTIME_INPUTS = ("lora_weights", "lora_config")


class AdapterTable:
    """The adapters a repository's engine serves, by task id, from its `lora_adapters` parameter."""

    def __init__(self, parameter: str):
        self.names: dict[int, str] = {
            int(task): str(name) for task, name in json.loads(parameter or "{}").items()
        }

    def __bool__(self) -> bool:
        return bool(self.names)

    def known(self) -> str:
        if not self.names:
            return "this repository has no LoRA adapters: rebuild it with --lora NAME=PATH"
        listed = ", ".join(f"{task} ({name})" for task, name in sorted(self.names.items()))
        return f"this repository has {listed}"

    def task_of(self, pb_utils, request) -> int:
        """The request's adapter task id (0: the base model); refuses an unknown one and run-time weights."""
        for name in RUNTIME_INPUTS:
            if pb_utils.get_input_tensor_by_name(request, name) is not None:
                raise Refused(
                    f"{name}: this engine serves only the LoRA adapters built into the repository "
                    "(toolkit build --lora NAME=PATH); send lora_task_id to pick one "
                    f"({self.known()})",
                    "unsupported_parameter",
                )
        tensor = pb_utils.get_input_tensor_by_name(request, "lora_task_id")
        if tensor is None:
            return BASE_TASK
        values = tensor.as_numpy().reshape(-1)
        if values.size != 1:
            raise Refused(f"lora_task_id holds {values.size} values; send one task id")
        task = int(values[0])
        if task != BASE_TASK and task not in self.names:
            raise Refused(f"unknown LoRA task id {task}; {self.known()}", "lora_unknown")
        return task
