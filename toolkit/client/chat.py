"""Chat templates: the repository carries its tokenizer's template; clients render prompts with it.

The template reaches a client either from a local repository folder or from the served
preprocessing model's config (parameter `chat_template`), so `toolkit generate` needs nothing
but the server's address.
"""

from __future__ import annotations

from pathlib import Path

from jinja2.sandbox import ImmutableSandboxedEnvironment

from toolkit.errors import ClientError
from toolkit.model.chat_template import template_from_tokenizer_dir


def template_from_repository(repo: Path) -> str | None:
    return template_from_tokenizer_dir(Path(repo) / "preprocessing" / "1" / "tokenizer")


def template_from_server(url: str, protocol: str) -> str | None:
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
    except Exception as exc:  # noqa: BLE001 - any transport failure means: cannot reach the server
        raise ClientError(f"cannot read the chat template from {url}: {exc}", hint="start the server (toolkit serve) or pass --raw") from exc
    return config.get("parameters", {}).get("chat_template", {}).get("string_value") or None


def render_chat(template: str, messages: list[dict], *, add_generation_prompt: bool = True, **extra) -> str:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    return env.from_string(template).render(messages=messages, add_generation_prompt=add_generation_prompt, **extra)


def render_chat_prompt(prompt: str, *, repo: str | None = None, url: str = "127.0.0.1:8001", protocol: str = "grpc") -> tuple[str, bool]:
    """(text to send, whether a template was applied)."""
    template = template_from_repository(Path(repo)) if repo else template_from_server(url, protocol)
    if not template:
        return prompt, False
    return render_chat(template, [{"role": "user", "content": prompt}]), True
