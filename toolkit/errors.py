"""One error hierarchy: each error says what failed, the offending value, and the next step."""

from __future__ import annotations


class ToolkitError(Exception):
    """Base of every error the toolkit raises on purpose; the CLI prints it as `Error: ...`."""

    def __init__(self, message: str, *, hint: str | None = None):
        self.message = message
        self.hint = hint
        super().__init__(message if hint is None else f"{message}\n  fix: {hint}")


class ModelSourceError(ToolkitError):
    """A --model value that cannot be resolved to a checkpoint."""


class UnsupportedModelError(ToolkitError):
    """A checkpoint whose architecture or format we cannot serve."""


class RepositoryError(ToolkitError):
    """A model repository that is missing, foreign, half-made or built for something else."""


class ServerError(ToolkitError):
    """tritonserver could not start, or died, or a model failed to load."""


class ClientError(ToolkitError):
    """A request to a served repository failed."""


class PlanError(ToolkitError):
    """A memory plan that cannot fit, or a GPU we have no profile for."""


class RecipeError(ToolkitError):
    """A build recipe with an unknown key or a wrong value."""


class EngineBuildError(ToolkitError):
    """A TensorRT-LLM tool failed, or is missing, or an engine is foreign."""


class BenchError(ToolkitError):
    """A benchmark that cannot run or whose inputs are wrong."""


class DeployError(ToolkitError):
    """A deployment that cannot run where asked: its repository, its values, or its output folder."""
