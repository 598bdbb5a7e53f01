"""One error hierarchy: each error says what failed, the offending value, and the next step.

Each error carries its fields (`message`, `hint`, `value`) and also subclasses the standard exception
it stands for (a bad value is a ValueError, a missing repository a FileNotFoundError, a failed tool a
RuntimeError), as huggingface_hub's errors do, so library callers can catch either.
"""

from __future__ import annotations

from typing import Any


class ToolkitError(Exception):
    """Base of every error the toolkit raises on purpose; the CLI prints it as `Error: ...`.

    `value`: the offending value, when there is one (a flag's value, a path, a field of a request).
    """

    def __init__(self, message: str, *, hint: str | None = None, value: Any = None):
        self.message = message
        self.hint = hint
        self.value = value
        super().__init__(message if hint is None else f"{message}\n  fix: {hint}")


class ModelSourceError(ToolkitError, ValueError):
    """A --model value that cannot be resolved to a checkpoint."""


class UnsupportedModelError(ToolkitError, ValueError):
    """A checkpoint whose architecture or format we cannot serve."""


class RepositoryError(ToolkitError, ValueError):
    """A model repository that is missing, foreign, half-made or built for something else."""


class RepositoryNotFoundError(RepositoryError, FileNotFoundError):
    """No repository at the path given."""


class ServerError(ToolkitError, RuntimeError):
    """tritonserver could not start, or died, or a model failed to load."""


class ClientError(ToolkitError, RuntimeError):
    """A request to a served repository failed."""


class PlanError(ToolkitError, ValueError):
    """A memory plan that cannot fit, or a GPU we have no profile for."""


class RecipeError(ToolkitError, ValueError):
    """A build recipe or build setting with an unknown key or a wrong value."""


class EngineBuildError(ToolkitError, RuntimeError):
    """A TensorRT-LLM tool failed, or is missing, or an engine is foreign."""


class BenchError(ToolkitError, RuntimeError):
    """A benchmark that cannot run or whose inputs are wrong."""


class DeployError(ToolkitError, ValueError):
    """A deployment that cannot run where asked: its repository, its values, or its output folder."""


class TraceError(ToolkitError, ValueError):
    """Tracing asked for but not possible: no OTLP endpoint, a bad sampling rate, no OpenTelemetry SDK."""


class AdapterError(ToolkitError, ValueError):
    """A LoRA adapter (--lora NAME=PATH) that cannot be served on the base model: missing, corrupt, of
    another base model, or beyond the build's limits."""
