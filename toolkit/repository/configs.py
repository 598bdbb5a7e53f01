"""config.pbtxt for each model, built from Triton's ModelConfig protobuf so it always parses."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from toolkit.repository import contract as c


def tensor_inputs(tensors: Iterable[c.Tensor]) -> list[mc.ModelInput]:
    result = []
    for t in tensors:
        item = mc.ModelInput(
            name=t.name,
            data_type=mc.DataType.Value(f"TYPE_{t.dtype}"),
            dims=list(t.dims),
            optional=t.optional,
            allow_ragged_batch=t.ragged,
        )
        if t.scalar:
            item.reshape.SetInParent()  # reshape: { shape: [ ] }
        result.append(item)
    return result


def tensor_outputs(tensors: Iterable[c.Tensor]) -> list[mc.ModelOutput]:
    return [
        mc.ModelOutput(
            name=t.name, data_type=mc.DataType.Value(f"TYPE_{t.dtype}"), dims=list(t.dims)
        )
        for t in tensors
    ]


def set_input_type(config: mc.ModelConfig, name: str, dtype: str) -> None:
    """The data type of input `name` (when the config has it), e.g. "BF16"."""
    for tensor in config.input:
        if tensor.name == name:
            tensor.data_type = mc.DataType.Value(f"TYPE_{dtype}")


def set_parameters(config: mc.ModelConfig, parameters: Mapping[str, object]) -> None:
    for key, value in parameters.items():
        config.parameters[key].string_value = _param_string(value)


def _param_string(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def python_model(
    name: str,
    inputs: Iterable[c.Tensor],
    outputs: Iterable[c.Tensor],
    *,
    max_batch_size: int,
    decoupled: bool = False,
    instances: int = 1,
    parameters: Mapping[str, object] | None = None,
    dynamic_batching: bool = False,
) -> mc.ModelConfig:
    config = mc.ModelConfig(name=name, backend="python", max_batch_size=max_batch_size)
    config.input.extend(tensor_inputs(inputs))
    config.output.extend(tensor_outputs(outputs))
    config.model_transaction_policy.decoupled = decoupled
    config.instance_group.append(
        mc.ModelInstanceGroup(count=instances, kind=mc.ModelInstanceGroup.KIND_CPU)
    )
    if dynamic_batching:
        config.dynamic_batching.SetInParent()
    set_parameters(config, parameters or {})
    return config


def ensemble_model(max_batch_size: int, trtllm_version: str | None = None) -> mc.ModelConfig:
    """The ensemble, its tensorrt_llm step feeding the input names an engine of `trtllm_version` reads."""
    config = mc.ModelConfig(name=c.ENSEMBLE, platform="ensemble", max_batch_size=max_batch_size)
    config.input.extend(tensor_inputs(c.text_inputs(trtllm_version)))
    config.output.extend(tensor_outputs(c.TEXT_OUTPUTS))
    steps = (
        (c.PREPROCESSING, c.PREPROCESSING_INPUT_MAP, c.PREPROCESSING_OUTPUT_MAP),
        (c.ENGINE, c.engine_input_map(trtllm_version), c.ENGINE_OUTPUT_MAP),
        (c.POSTPROCESSING, c.POSTPROCESSING_INPUT_MAP, c.POSTPROCESSING_OUTPUT_MAP),
    )
    for model_name, input_map, output_map in steps:
        step = config.ensemble_scheduling.step.add(model_name=model_name, model_version=-1)
        step.input_map.update(input_map)
        step.output_map.update(output_map)
    return config


def to_pbtxt(config: mc.ModelConfig) -> str:
    return text_format.MessageToString(config)


def parse_pbtxt(text: str) -> mc.ModelConfig:
    return text_format.Parse(text, mc.ModelConfig())
