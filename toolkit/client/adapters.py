"""A LoRA adapter's task id for a client (`toolkit generate --lora NAME`): from a local repository's manifest, or
from the served engine model's config (its `lora_adapters` parameter: {"<task id>": "<name>"}), so a client needs
nothing but the server's address."""

from __future__ import annotations

import json
from pathlib import Path

from toolkit.errors import ClientError
from toolkit.repository import contract as c


def adapters_of_repository(repo: Path) -> dict[str, int]:
    from toolkit.repository.reader import open_repository

    return {a.name: a.task_id for a in open_repository(Path(repo)).adapters}


def adapters_of_server(url: str, protocol: str) -> dict[str, int]:
    """{name: task id} from the served engine model's `lora_adapters` parameter (none: no adapters)."""
    try:
        if protocol == "grpc":
            import tritonclient.grpc as grpcclient

            with grpcclient.InferenceServerClient(url) as client:
                config = client.get_model_config(c.ENGINE, as_json=True)["config"]
        else:
            import tritonclient.http as httpclient

            client = httpclient.InferenceServerClient(url.removeprefix("http://"))
            config = client.get_model_config(c.ENGINE)
            client.close()
    except Exception as exc:  # noqa: BLE001 - any transport failure means: cannot reach the server
        raise ClientError(
            f"cannot read the LoRA adapters from {url}: {exc}",
            hint="start the server (toolkit serve), fix --url, or pass --repo",
        ) from exc
    parameter = config.get("parameters", {}).get("lora_adapters", {}).get("string_value") or "{}"
    return {str(name): int(task) for task, name in json.loads(parameter).items()}


def lora_task_id(name: str, adapters: dict[str, int]) -> int:
    """The task id of adapter `name`; a ClientError naming the ones there are."""
    if name in adapters:
        return adapters[name]
    known = ", ".join(adapters) or "none"
    raise ClientError(
        f"--lora {name}: the served repository has no LoRA adapter of that name (its adapters: {known})",
        hint="name one of them, or rebuild the repository with --lora NAME=PATH",
        value=name,
    )
