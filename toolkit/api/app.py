"""The OpenAI-compatible app: `create_app` wires the routes to one Triton backend and one tokenizer.

A request goes through the gate (toolkit.api.gate: keys, limits), becomes a Job (toolkit.api.jobs),
and is answered (toolkit.api.responses); the state it is served with is toolkit.api.state's.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from starlette.responses import Response

from toolkit.api.errors import ApiError, install_error_handlers
from toolkit.api.fairness import hold_share
from toolkit.api.gate import ARRIVAL, Gate
from toolkit.api.generation import Job
from toolkit.api.jobs import plan_job, refuse_unsupported, render_chat, request_features
from toolkit.api.responses import respond
from toolkit.api.schemas import (
    ChatCompletion,
    ChatCompletionRequest,
    Completion,
    CompletionRequest,
    ErrorResponse,
    Health,
    Model,
    ModelList,
    unsupported_content,
)
from toolkit.api.state import ApiSettings, ApiState
from toolkit.api.tokenize import (
    DetokenizeRequest,
    DetokenizeResponse,
    TokenizeRequest,
    TokenizeResponse,
    detokenize,
    tokenize,
)
from toolkit.api.tools import template_messages, template_tools, tool_setup
from toolkit.api.tracing import request_trace
from toolkit.repository.reader import open_repository

__all__ = ["ApiSettings", "create_app"]

ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorResponse}
    for status in (400, 401, 404, 405, 408, 413, 429, 500, 502, 503, 504)
}


def create_app(settings: ApiSettings, in_flight=None, engine_fault=None) -> FastAPI:
    """The ASGI app, wrapped in the gate (API keys, in-flight bound); its lifespan opens the gRPC channel.
    `in_flight`: the count the bound is kept in when several worker processes share it; `engine_fault`:
    the engine's fault they share (toolkit.api.workers.SharedFault)."""
    state = ApiState(settings, open_repository(Path(settings.repo)), engine_fault)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        await state.backend.start()
        try:
            yield
        finally:
            await state.backend.close()
            if state.tracer is not None:
                state.tracer.shutdown()

    # No slash redirects: Starlette builds their Location from the Host header (an open redirect to
    # whatever host a client names); /v1/chat/completions/ is a 404 naming the path instead.
    app = FastAPI(
        title="toolkit OpenAI-compatible API",
        version="1",
        lifespan=lifespan,
        redirect_slashes=False,
    )
    app.state.api = state
    install_error_handlers(app)
    _add_routes(app, state)
    app.add_middleware(
        Gate,
        api_keys=tuple(settings.api_keys),
        max_in_flight=settings.max_in_flight,
        retry_after_s=settings.retry_after_s,
        metrics=state.metrics,
        limits=settings.limits,
        tracer=state.tracer,
        in_flight=in_flight,
    )
    return app


def _add_routes(app: FastAPI, state: ApiState) -> None:
    @app.post("/v1/chat/completions", response_model=ChatCompletion, responses=ERRORS)
    async def chat_completions(body: ChatCompletionRequest, request: Request):
        state.check_model(body.model)
        refuse_unsupported(state, body)
        found = unsupported_content(body)
        if found:
            raise ApiError(400, found[1], param=found[0], code="unsupported_content")
        tools, tool_guide = tool_setup(state, body)
        features, _ = request_features(state, body, tool_guide)
        messages = template_messages(body.messages)
        prompt = await render_chat(state, messages, template_tools(body.tools))
        job = await plan_job(
            state,
            "chat",
            body,
            prompt,
            body.requested_max_tokens(),
            "messages",
            _arrival(request),
            request_trace(request.scope),
            features=features,
            tools=tools,
        )
        held = (job.prompt_tokens + job.max_tokens) * job.n  # each of n choices its own sequence
        await hold_share(state.share, request, held, job.n)
        return await respond(state, job, bool(body.stream), request)

    @app.post("/v1/completions", response_model=Completion, responses=ERRORS)
    async def completions(body: CompletionRequest, request: Request):
        state.check_model(body.model)
        refuse_unsupported(state, body)
        features, _ = request_features(state, body)
        trace = request_trace(request.scope)
        jobs: list[Job] = []
        for i, prompt in enumerate(body.prompts()):  # each prompt its own engine request
            param = "prompt" if isinstance(body.prompt, str) else f"prompt.{i}"
            job = await plan_job(
                state,
                "completion",
                body,
                prompt,
                body.max_tokens,
                param,
                _arrival(request),
                trace,
                features=features,
                first_index=i * features.n,
            )
            jobs.append(dataclasses.replace(job, id=jobs[0].id) if jobs else job)
        held = sum((job.prompt_tokens + job.max_tokens) * features.n for job in jobs)
        await hold_share(state.share, request, held, len(jobs) * features.n)
        return await respond(state, jobs, bool(body.stream), request)

    @app.post("/tokenize", response_model=TokenizeResponse, responses=ERRORS)
    async def tokenize_text(body: TokenizeRequest):
        return await tokenize(state, body)

    @app.post("/detokenize", response_model=DetokenizeResponse, responses=ERRORS)
    async def detokenize_tokens(body: DetokenizeRequest):
        return await detokenize(state, body)

    @app.get("/v1/models", response_model=ModelList, responses=ERRORS)
    async def list_models():
        return ModelList(data=[_model(state), *(_model(state, name) for name in state.adapters)])

    @app.get("/v1/models/{model}", response_model=Model, responses=ERRORS)
    async def retrieve_model(model: str):
        state.check_model(model)
        return _model(state, model if model in state.adapters else None)

    @app.get("/health", response_model=Health, responses={503: {"model": ErrorResponse}})
    async def health():
        problem = await state.backend.health()
        if problem is None:
            return Health(status="ok", model=state.model_id)
        raise ApiError(503, problem, type="server_error", code="not_ready")

    @app.get("/metrics", response_class=Response)
    async def metrics():
        return Response(
            state.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8"
        )


def _model(state: ApiState, adapter: str | None = None) -> Model:
    """The base model's card, or a LoRA adapter's (its parent: the base model)."""
    return Model(
        id=adapter or state.model_id,
        created=state.created,
        owned_by="toolkit",
        root=state.model_id,
        parent=state.model_id if adapter else None,
    )


def _arrival(request: Request) -> float:
    """When the request came through the gate (before body parsing and validation), for TTFT."""
    return request.scope.get("state", {}).get(ARRIVAL) or time.perf_counter()
