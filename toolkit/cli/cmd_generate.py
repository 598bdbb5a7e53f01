"""`toolkit generate`: one prompt to a served repository, text printed as it arrives."""

from __future__ import annotations

import click

from toolkit.cli.options import (
    json_option,
    model_option,
    repo_option,
    timeout_option,
    triton_url_option,
)
from toolkit.cli.render import emit_json, note
from toolkit.client.adapters import adapters_of_repository, adapters_of_server, lora_task_id
from toolkit.client.chat import render_chat_prompt
from toolkit.client.generate import GenerateRequest, generate_grpc, generate_http

DEFAULT_URLS = {"grpc": "127.0.0.1:8001", "http": "127.0.0.1:8000"}
INT32_MAX = 2**31 - 1  # max_tokens, top_k: INT32 tensors
UINT64_MAX = 2**64 - 1  # seed: a UINT64 tensor


@click.command("generate")
@click.argument("prompt")
@triton_url_option(
    "-u", "--url", default=None, help="Server address [grpc: 127.0.0.1:8001, http: 127.0.0.1:8000]."
)
@click.option(
    "-p",
    "--protocol",
    type=click.Choice(["grpc", "http"]),
    default="grpc",
    help="grpc streams; http uses Triton's generate endpoint.",
)
@model_option("ensemble or tensorrt_llm_bls.", default="ensemble")
@click.option(
    "-n",
    "--max-tokens",
    type=click.IntRange(1, INT32_MAX),
    default=128,
    help="Most tokens to generate.",
)
@click.option(
    "--temperature",
    type=click.FloatRange(min=0),
    default=None,
    help="Sampling temperature; 0 or unset: greedy (alone, it samples from the whole distribution: top-p 1).",
)
@click.option(
    "--top-k",
    type=click.IntRange(0, INT32_MAX),
    default=None,
    help="Sample from the k most likely tokens (0: off).",
)
@click.option(
    "--top-p",
    type=click.FloatRange(0, 1),
    default=None,
    help="Sample from the smallest set of tokens whose probability reaches p.",
)
@click.option(
    "--seed", type=click.IntRange(0, UINT64_MAX), default=None, help="Same seed, same sampled text."
)
@click.option(
    "--stop", "stop_words", multiple=True, help="Stop when this text is generated (repeatable)."
)
@click.option(
    "--raw", is_flag=True, help="Send the prompt as is, without the model's chat template."
)
@click.option(
    "--lora",
    "lora",
    default=None,
    metavar="NAME",
    help="Generate with this LoRA adapter of the repository (built with --lora NAME=PATH).",
)
@repo_option(
    "Repository whose chat template to apply [default: ask the server's model].", exists=True
)
@timeout_option("Seconds to wait for the answer.", default=600.0, minimum=0.1)
@json_option
def command(prompt, url, protocol, model, raw, lora, repo, timeout, as_json, **sampling):
    """Generate text for PROMPT from a served repository."""
    url = url or DEFAULT_URLS[protocol]
    text = prompt
    if not raw:
        text, templated = render_chat_prompt(prompt, repo=repo, url=url, protocol=protocol)
        if not templated:
            note("the repository has no chat template; sending the prompt as is")
    # The sampling options (max tokens, temperature, top-k/p, seed, stop words) are the request's fields.
    request = GenerateRequest(
        prompt=text,
        lora_task_id=None if lora is None else _lora_task(lora, repo, url, protocol),
        **sampling,
    )
    if protocol == "http":
        result = generate_http(url, request, model=model, timeout_s=timeout)
        if not as_json:
            click.echo(result.text)
    else:
        echo = (lambda piece: None) if as_json else (lambda piece: click.echo(piece, nl=False))
        result = generate_grpc(url, request, model=model, on_piece=echo, timeout_s=timeout)
        if not as_json:
            click.echo()
    if as_json:
        emit_json(
            {
                "text": result.text,
                "pieces": len(result.pieces),
                "time_to_first_piece_s": result.time_to_first_piece_s,
                "total_s": result.total_s,
                "protocol": protocol,
                "model": model,
                "lora": lora,
            }
        )


def _lora_task(name: str, repo, url: str, protocol: str) -> int:
    adapters = adapters_of_repository(repo) if repo else adapters_of_server(url, protocol)
    return lora_task_id(name, adapters)
