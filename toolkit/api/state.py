"""What the OpenAI API serves with: its settings, and the state built from them and the repository."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from pathlib import Path

from toolkit.api.errors import ApiError, short_text
from toolkit.api.fairness import EngineShare
from toolkit.api.logprobs import TokenTexts
from toolkit.api.metrics import ApiMetrics
from toolkit.api.prompt import PromptCodec
from toolkit.api.reasoning import reasoning_parser
from toolkit.api.tools import resolve_tool_parser
from toolkit.api.triton import ENGINE_MODEL, TritonBackend
from toolkit.errors import ToolkitError
from toolkit.repository.reader import Repository
from toolkit.settings import MAX_STREAM_INTERVAL, ApiLimits
from toolkit.trace.config import TracePlan

# Long prompts tokenized at once: each takes ~150-700 bytes of memory per character while it is encoded,
# so the API's memory is bounded by this count, not by how many clients send long prompts together.
LONG_ENCODES_AT_ONCE = 2


@dataclass(frozen=True)
class ApiSettings:
    """Everything `create_app` needs; the CLI and `toolkit serve --openai-port` build one of these."""

    triton_url: str
    repo: Path
    # tensorrt_llm (token ids; cancellation reaches the engine), or ensemble / tensorrt_llm_bls (text)
    model_name: str = ENGINE_MODEL
    served_model_name: str | None = None  # the id in /v1/models; default: from the repository
    api_keys: tuple[str, ...] = ()
    max_in_flight: int = 64
    retry_after_s: int = 1
    # Header, body and send timeouts; body size and read budget; the engine's stall timeout.
    limits: ApiLimits = ApiLimits()
    # How chat answers carry their reasoning (toolkit.api.reasoning): auto takes the model's, none turns it off.
    reasoning_parser: str = "auto"
    # How tool calls are read from the output: auto (from the model's tokenizer), a family, or none.
    tool_parser: str = "auto"
    # Trusted callers only: special-token text in message content (<|im_start|>, ...) is read as those
    # tokens. Off, content is text, as at OpenAI: a user cannot write a turn of another role.
    special_tokens_in_messages: bool = False
    # Where and how to trace (toolkit.trace.config.plan_tracing); None: no tracing, no SDK loaded.
    trace: TracePlan | None = None
    # Engine steps per streamed chunk after the first (--stream-interval): 1 streams every token.
    stream_interval: int = 1
    # Triton's HTTP address (host:port): engine-contract streams go over its generate_stream instead of
    # gRPC (--engine-transport http; toolkit.api.engine_http). None: all over gRPC.
    engine_http_url: str | None = None

    def __post_init__(self) -> None:
        value = self.stream_interval
        if (
            isinstance(value, bool)
            or not isinstance(value, int)
            or not 1 <= value <= MAX_STREAM_INTERVAL
        ):
            raise ToolkitError(
                f"the stream interval must be a whole number of engine steps from 1 to {MAX_STREAM_INTERVAL}, "
                f"not {value!r}",
                hint=f"pass --stream-interval between 1 and {MAX_STREAM_INTERVAL}, or leave it at 1 (every token)",
            )


class ApiState:
    def __init__(self, settings: ApiSettings, repository: Repository, engine_fault=None):
        self.settings = settings
        self.repository = repository
        self.limits = repository.limits
        self.codec = PromptCodec(
            repository, content_as_text=not settings.special_tokens_in_messages
        )
        decoder = self.codec if settings.model_name == ENGINE_MODEL else None
        self.capabilities = repository.capabilities
        self.reasoning = reasoning_parser(
            settings.reasoning_parser, repository.manifest.model.facts.reasoning_parser
        )
        self.vocab_size = repository.manifest.model.facts.vocab_size
        self.backend = TritonBackend(
            settings.triton_url,
            settings.model_name,
            decoder=decoder,
            tokens=repository.tokens,
            decoupled=repository.decoupled,
            trtllm_version=repository.trtllm_version,
            stall_timeout_s=settings.limits.stall_timeout_s,
            vocab_size=self.vocab_size,
            stream_interval=settings.stream_interval,
            engine_stream_interval=self.capabilities.engine_stream_interval,
            engine_http_url=settings.engine_http_url,
            shared_fault=engine_fault,
        )
        self.metrics = ApiMetrics()
        self.tracer = None
        if settings.trace is not None:
            from toolkit.api.tracing import ApiTracer

            self.tracer = ApiTracer(settings.trace)
        self.share = EngineShare(
            repository.limits, len(settings.api_keys), self.metrics.share_waiting.set
        )
        self.model_id = settings.served_model_name or repository.served_model_name
        # Each LoRA adapter is a model id of its own (its name), served with its task id.
        self.adapters = {adapter.name: adapter.task_id for adapter in repository.adapters}
        self.created = int(time.time())
        self.long_encodes = asyncio.Semaphore(LONG_ENCODES_AT_ONCE)
        self._token_texts: TokenTexts | None = None
        self.tool_parser = resolve_tool_parser(settings.tool_parser, self.codec)

    @property
    def token_texts(self) -> TokenTexts:
        """Token id -> text and bytes (log probs), built on first use."""
        if self._token_texts is None:
            self._token_texts = TokenTexts(self.codec)
        return self._token_texts

    @property
    def kv_block_size(self) -> int:
        """Tokens per KV block of the engine (cached tokens are its reused blocks times this)."""
        return self.limits.kv_block_size

    def check_model(self, name: str) -> None:
        if name not in (self.model_id, self.settings.model_name) and name not in self.adapters:
            served = f"`{self.model_id}`"
            if self.adapters:
                served += " and its LoRA adapters " + ", ".join(f"`{a}`" for a in self.adapters)
            raise ApiError(
                404,
                f"The model `{short_text(name)}` does not exist; this server serves {served}.",
                param="model",
                code="model_not_found",
            )

    def lora_task(self, name: str) -> int:
        """The LoRA task id a body's `model` asks for: its adapter's, 0 for the base model."""
        return self.adapters.get(name, 0)
