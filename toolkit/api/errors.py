"""Every error the API answers is a JSON body in OpenAI's format: {"error": {message, type, param, code}}."""

from __future__ import annotations

import logging
import re

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import JSONResponse

from toolkit.api.openai_types import RESPONSE_FORMAT_TAGS
from toolkit.api.schemas import UNION_MEMBERS
from toolkit.errors import ToolkitError

log = logging.getLogger("toolkit.api")
_SURROGATE = re.compile("[\ud800-\udfff]")


class ApiError(ToolkitError):
    """An error answered to the client with `status`; `type` and `code` follow OpenAI's values."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict | None = None,
    ):
        super().__init__(message)
        self.status = status
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict:
        return error_body(self.message, self.type, self.param, self.code)


# What an error may echo of the request: a refusal names the offending value by a short prefix, never
# the whole of it (a 6 MB logit_bias key came back whole, in the message and again in `param`).
MAX_MESSAGE_CHARS = 1000
MAX_PARAM_CHARS = 200
MAX_NAME_CHARS = 64  # one client-chosen name (a key, a model id) inside a message or a param


def short_text(text: str, limit: int = MAX_NAME_CHARS) -> str:
    """`text` cut to `limit` characters, marked when cut."""
    return text if len(text) <= limit else f"{text[: limit - 3]}..."


def error_body(message: str, type: str, param: str | None = None, code: str | None = None) -> dict:
    return {
        "error": {
            "message": printable(short_text(message, MAX_MESSAGE_CHARS)),
            "type": type,
            "param": None if param is None else printable(short_text(param, MAX_PARAM_CHARS)),
            "code": code,
        }
    }


def printable(text: str) -> str:
    """`text` as valid Unicode: an echoed client value may hold lone surrogates, which no UTF-8 body can carry
    (Starlette's JSONResponse raised UnicodeEncodeError in our error handler: a 500 and a reset connection)."""
    return _SURROGATE.sub("\ufffd", text)


def _http_message(request: Request, exc: StarletteHTTPException) -> str:
    """Starlette's bare "Not Found" / "Method Not Allowed", said as OpenAI says them: naming what was asked."""
    method, path = request.method, request.url.path
    if exc.status_code == 404 and exc.detail == "Not Found":
        return f"Invalid URL ({method} {path})"
    if exc.status_code == 405 and exc.detail == "Method Not Allowed":
        allowed = (exc.headers or {}).get("Allow", "")
        use = f"; use {' or '.join(m.strip() for m in allowed.split(','))}" if allowed else ""
        return f"Method {method} is not allowed on {path}{use}."
    return str(exc.detail)


def _not_json(request: Request, exc: RequestValidationError) -> ApiError | None:
    """A body sent with another Content-Type is never parsed as JSON (FastAPI validates its raw bytes): say
    which header to send, not that the body "should be a valid dictionary"."""
    content_type = request.headers.get("content-type")
    if content_type is None or _is_json(content_type):
        return None
    if not any(tuple(error.get("loc", ())) == ("body",) for error in exc.errors()):
        return None
    return ApiError(
        400,
        f"The request body must be JSON sent with `Content-Type: application/json`, not "
        f"`{content_type}`.",
        code="invalid_value",
    )


def _is_json(content_type: str) -> bool:
    """As FastAPI decides to parse a body: application/json or application/*+json (parameters aside)."""
    kind = content_type.split(";", 1)[0].strip().lower()
    return kind == "application/json" or (
        kind.startswith("application/") and kind.endswith("+json")
    )


def _validation_error(exc: RequestValidationError) -> ApiError:
    errors = exc.errors()
    invalid_text = [error for error in errors if error.get("type") in UNICODE_ERRORS]
    if invalid_text:  # named before a union's other members' complaints ("not a list", ...)
        return _unicode_error(invalid_text[0])
    first = errors[0] if errors else {"loc": (), "msg": "invalid request"}
    loc = _param_parts(first)
    param = ".".join(loc) or None
    if first.get("type") == "extra_forbidden":
        param = param or short_text(str(first["loc"][-1]))  # a key that is no identifier, as sent
        return ApiError(
            400,
            f"Unrecognized request argument supplied: {param}",
            param=param,
            code="unrecognized_argument",
        )
    if first.get("type") == "json_invalid":
        return ApiError(400, "The request body is not valid JSON.", code="invalid_json")
    where = f" at `{param}`" if param else ""
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return ApiError(
        400,
        f"Invalid request{where}: {first.get('msg', 'invalid value')}{more}",
        param=param,
        code="invalid_value",
    )


_TYPE_TAGS = {"str", "int", "float", "bool", "list", "dict", "none"}
# Models that are members of a union: pydantic names them in a location ("...content.0.TextPart.text").
_MODEL_TAGS = frozenset(model.__name__ for model in UNION_MEMBERS)
# Our own check (schemas.valid_unicode), and pydantic's where a constrained str meets a lone surrogate first.
UNICODE_ERRORS = ("lone_surrogate", "string_unicode")


def _param_parts(error: dict) -> list[str]:
    """The error's location as field names and indexes; a client's own key (of logit_bias, or an
    unknown field) by a short prefix. Not the member's tag pydantic puts after `response_format`
    (`response_format.json_schema.json_schema.schema` is `response_format.json_schema.schema`)."""
    loc = [part for part in error.get("loc", ()) if part != "body"]
    return [
        short_text(str(part))
        for i, part in enumerate(loc)
        if _is_field(part)
        and not (i and loc[i - 1] == "response_format" and part in RESPONSE_FORMAT_TAGS)
    ]


def _unicode_error(error: dict) -> ApiError:
    parts = _param_parts(error)
    index = (error.get("ctx") or {}).get("index")
    param = ".".join([*parts, str(index)] if index is not None else parts) or None
    reason = (
        error["msg"]
        if error.get("type") == "lone_surrogate"
        else "the string holds a lone UTF-16 surrogate, which is not valid Unicode: send text as UTF-8, "
        "or escape only valid surrogate pairs"
    )
    return ApiError(
        400, f"Invalid request at `{param}`: {reason}.", param=param, code="invalid_value"
    )


def _is_field(part) -> bool:
    """Field names and list indexes; not the union-member tags pydantic puts in a location ("constrained-str")."""
    if isinstance(part, int):
        return True
    return part.isidentifier() and part.lower() not in _TYPE_TAGS and part not in _MODEL_TAGS


def install_error_handlers(app: FastAPI) -> None:
    """Map validation errors to 400 (not FastAPI's 422), HTTP errors and crashes to OpenAI's format."""

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        error = _not_json(request, exc) or _validation_error(exc)
        return JSONResponse(error.body(), status_code=error.status)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        kind = "invalid_request_error" if exc.status_code < 500 else "server_error"
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
        return JSONResponse(
            error_body(_http_message(request, exc), kind, None, code),
            status_code=exc.status_code,
            headers=exc.headers,
        )

    @app.exception_handler(Exception)
    async def _crash(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return JSONResponse(
            error_body(
                "The server had an error while processing your request.",
                "server_error",
                None,
                "internal_error",
            ),
            status_code=500,
        )
