"""Chat templates for clients: from a local repository, or from the served preprocessing model's config.

The template reaches a client either from a repository folder or from the served preprocessing
model's config (parameter `chat_template`), so `toolkit generate` needs nothing but the server's address.
"""

from __future__ import annotations

import http.client
from pathlib import Path

from toolkit.client.generate import GRPC_ON_HTTP, not_http
from toolkit.errors import ClientError
from toolkit.model.chat_template import ChatTemplate


def template_from_repository(repo: Path) -> ChatTemplate | None:
    from toolkit.repository.reader import open_repository

    return ChatTemplate.from_tokenizer_dir(open_repository(Path(repo)).tokenizer_dir)


def template_from_server(url: str, protocol: str) -> ChatTemplate | None:
    """The served preprocessing model's `chat_template` parameter, or None."""
    try:
        if protocol == "grpc":
            import tritonclient.grpc as grpcclient

            with grpcclient.InferenceServerClient(url) as client:
                config = client.get_model_config("preprocessing", as_json=True)["config"]
        else:
            import tritonclient.http as httpclient

            client = httpclient.InferenceServerClient(url.removeprefix("http://"))
            config = client.get_model_config("preprocessing")
            client.close()
    except http.client.HTTPException as exc:  # an HTTP client's parser on a gRPC (HTTP/2) port
        raise not_http(url) from exc
    except Exception as exc:  # noqa: BLE001 - any transport failure means: cannot reach the server
        raise ClientError(
            f"cannot read the chat template from {url}: {exc}",
            hint=GRPC_ON_HTTP
            if "http1.x server" in str(exc).lower()
            else "start the server (toolkit serve), fix --url, or pass --raw",
        ) from exc
    source = config.get("parameters", {}).get("chat_template", {}).get("string_value")
    return ChatTemplate(source) if source else None


def render_chat_prompt(
    prompt: str, *, repo: str | None = None, url: str = "127.0.0.1:8001", protocol: str = "grpc"
) -> tuple[str, bool]:
    """(text to send, whether a template was applied)."""
    template = template_from_repository(Path(repo)) if repo else template_from_server(url, protocol)
    if template is None:
        return prompt, False
    return template.render([{"role": "user", "content": prompt}]), True
