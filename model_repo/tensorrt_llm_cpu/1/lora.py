"""The repository's LoRA adapters, each request with its own, inside one continuous batch.

peft loads every adapter of the repository (`<version>/lora/<task id>/`, the PEFT folders as built) into
the model; its mixed-batch inference routes by batch row, but transformers' continuous batching packs
every request of a step into ONE row ([1, tokens, hidden]), so we route by token instead: each LoRA
Linear keeps its adapters' A matrices concatenated ([total rank, in]) and their B matrices, with the
adapter's scaling (alpha / r, as peft computes it) folded in ([out, total rank]). Per step a forward
pre-hook on the model reads which request owns which packed tokens and, per token, the task id of the
request's adapter; each layer adds ((x @ A_cat.T) * mask) @ B_cat.T, where the mask keeps, per token,
only its own adapter's rank columns. Two skinny matmuls per layer whatever the number of adapters; a
base-model token gets an exact zero delta, and a step with no adapter token skips the LoRA math.

The prefix cache must know adapters too: transformers hashes KV blocks by token ids only, so a request
on adapter A would reuse blocks the base model (or adapter B) computed for the same prompt, and its
output would be wrong. `key_prefix_cache_by_adapter` salts the first block's hash with the request's
task id: requests of one adapter still share their prefixes, never across adapters.
"""

from __future__ import annotations

import hashlib
import threading
import types
from contextlib import contextmanager
from pathlib import Path

import torch
from transformers.generation.continuous_batching import cache as cb_cache
from transformers.generation.continuous_batching import scheduler as cb_scheduler
from transformers.generation.continuous_batching.cache_allocators import cache_allocator

from lora_tasks import BASE_TASK, AdapterTable

_PATCHED = "_toolkit_keys_prefix_by_adapter"


class AdapterLoadError(RuntimeError):
    """A built-in adapter the engine cannot serve (the model does not load: the repository is broken)."""


def _peft_name(task: int) -> str:
    return f"task{task}"


def load_adapters(model, folder: Path, table: AdapterTable):
    """The model with every adapter of `table` injected (peft's loading of the PEFT folders under `folder`)."""
    from peft import PeftModel

    peft_model = None
    for task, name in sorted(table.names.items()):
        path = folder / str(task)
        try:
            if peft_model is None:
                peft_model = PeftModel.from_pretrained(
                    model, str(path), adapter_name=_peft_name(task)
                )
            else:
                peft_model.load_adapter(str(path), adapter_name=_peft_name(task))
        except Exception as exc:  # noqa: BLE001 - peft raises many kinds; each means this adapter cannot load
            raise AdapterLoadError(
                f"LoRA adapter {task} ({name}) in {path} could not be loaded: {type(exc).__name__}: {exc}; "
                "rebuild the repository with toolkit build --lora"
            ) from exc
    if peft_model is None:
        return model
    peft_model.eval()
    return peft_model.base_model.model  # the transformers model, LoRA layers injected


class TokenRoute:
    """This step's task id per packed token (None: no adapter token in the step), set by the pre-hook, and
    the step's column masks, one per column layout (layers the same adapters target share theirs)."""

    def __init__(self):
        self.tasks: torch.Tensor | None = None
        self.masks: dict[int, torch.Tensor] = {}
        self.layouts: dict[tuple[int, ...], torch.Tensor] = {}

    def set_tasks(self, tasks: torch.Tensor | None) -> None:
        self.tasks = tasks
        self.masks = {}

    def layout(self, columns: torch.Tensor) -> torch.Tensor:
        """One tensor per distinct column layout, so its mask is built once a step."""
        return self.layouts.setdefault(tuple(columns.tolist()), columns)

    def mask(self, tasks: torch.Tensor, columns: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """[tokens, total rank]: 1 where the token's adapter owns the column, else 0."""
        found = self.masks.get(id(columns))
        if found is None:
            found = (tasks.unsqueeze(1) == columns.unsqueeze(0)).to(dtype)
            self.masks[id(columns)] = found
        return found


def route_adapters(model, manager, table: AdapterTable) -> int:
    """Make every LoRA layer of `model` token-routed and rebuild the route each step; the layers routed."""
    from peft.tuners.lora.layer import Linear as LoraLinear
    from peft.tuners.lora.layer import LoraLayer

    route = TokenRoute()
    tasks = sorted(table.names)
    routed = 0
    for name, module in model.named_modules():
        if not isinstance(module, LoraLayer):
            continue
        if not isinstance(module, LoraLinear) or any(module.use_dora.values()):
            raise AdapterLoadError(
                f"LoRA layer {name} ({type(module).__name__}) is not a plain LoRA Linear: the CPU engine "
                "serves LoRA on linear layers only (no DoRA, embeddings or convolutions)"
            )
        _concatenate(module, tasks)
        if module._toolkit_columns is not None:
            module._toolkit_columns = route.layout(module._toolkit_columns)
        module._toolkit_route = route
        module.forward = types.MethodType(_routed_forward, module)
        routed += 1
    model.register_forward_pre_hook(_route_hook(manager, route), with_kwargs=True)
    return routed


def _concatenate(module, tasks: list[int]) -> None:
    """The layer's adapters as one A [total rank, in], one scaled B [out, total rank], the task per column."""
    a_parts, b_parts, columns = [], [], []
    for task in tasks:
        key = _peft_name(task)
        if key not in module.lora_A:  # this adapter does not target this layer
            continue
        a = module.lora_A[key].weight.detach()
        b = module.lora_B[key].weight.detach() * float(module.scaling[key])
        a_parts.append(a)
        b_parts.append(b)
        columns.append(torch.full((a.shape[0],), task, dtype=torch.long))
    module._toolkit_a = torch.cat(a_parts, 0) if a_parts else None
    module._toolkit_b = torch.cat(b_parts, 1) if b_parts else None
    module._toolkit_columns = torch.cat(columns) if columns else None


def _routed_forward(self, x, *args, **kwargs):
    result = self.base_layer(x, *args, **kwargs)
    route = self._toolkit_route
    tasks = route.tasks
    if tasks is None or self._toolkit_a is None:
        return result
    flat = x.reshape(-1, x.shape[-1])
    if flat.shape[0] != tasks.shape[0]:
        raise RuntimeError(
            f"LoRA route covers {tasks.shape[0]} tokens, the step has {flat.shape[0]}"
        )
    hidden = torch.nn.functional.linear(flat, self._toolkit_a)  # [tokens, total rank]
    hidden.mul_(route.mask(tasks, self._toolkit_columns, hidden.dtype))
    delta = torch.nn.functional.linear(hidden, self._toolkit_b)  # [tokens, out]
    return result.add_(delta.view(result.shape))


def _route_hook(manager, route: TokenRoute):
    """Before each forward: the task id of every packed token, from the batch the manager prepared."""

    def hook(module, args, kwargs):
        route.set_tasks(None)
        processor = manager.batch_processor
        input_ids = kwargs.get("input_ids")
        if processor is None or input_ids is None:
            return
        io = processor.inputs_and_outputs
        requests = io.requests_in_batch
        bounds = io.cumulative_seqlens_q[: len(requests) + 1].tolist()
        owners = [task_of(future.state) for future in requests]
        if not any(owners):
            return
        tasks = torch.full((input_ids.shape[-1],), BASE_TASK, dtype=torch.long)
        for index, task in enumerate(owners):
            if task:
                tasks[bounds[index] : bounds[index + 1]] = task
        route.set_tasks(tasks)

    return hook


def task_of(state) -> int:
    """The adapter task id a request state runs on (0: the base model)."""
    decoding = state.logit_processor_kwargs.get("decoding")
    return getattr(decoding, "adapter", BASE_TASK)


# --- the prefix cache, keyed by adapter ------------------------------------------------------------
_salt = threading.local()


def _task_salt(task: int) -> int:
    digest = hashlib.blake2b(f"toolkit-lora-task:{task}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little", signed=False)  # compute_block_hash takes 8 bytes


@contextmanager
def _salted(state):
    previous = getattr(_salt, "task", BASE_TASK)
    _salt.task = task_of(state)
    try:
        yield
    finally:
        _salt.task = previous


def key_prefix_cache_by_adapter() -> None:
    """Chain every request's block hashes from its adapter's salt (once per process; base requests unchanged).

    The scheduler matches a waiting request's prompt (`_infer_request_tokens`) and the cache registers the
    blocks a forward completed (`mark_complete_blocks`), both in the generation thread: each runs with the
    request's task id set, and the first block's hash (parent None) starts from that task's salt."""
    if getattr(cache_allocator, _PATCHED, False):
        return
    original_hash = cache_allocator.compute_block_hash

    def compute_block_hash(parent_hash, tokens):
        task = getattr(_salt, "task", BASE_TASK)
        if parent_hash is None and task != BASE_TASK:
            parent_hash = _task_salt(task)
        return original_hash(parent_hash, tokens)

    original_infer = cb_scheduler.Scheduler._infer_request_tokens
    original_mark = cb_cache.PagedAttentionCache.mark_complete_blocks

    def _infer_request_tokens(self, state, *args, **kwargs):
        with _salted(state):
            return original_infer(self, state, *args, **kwargs)

    def mark_complete_blocks(self, state, *args, **kwargs):
        with _salted(state):
            return original_mark(self, state, *args, **kwargs)

    cache_allocator.compute_block_hash = compute_block_hash
    cb_scheduler.Scheduler._infer_request_tokens = _infer_request_tokens
    cb_cache.PagedAttentionCache.mark_complete_blocks = mark_complete_blocks
    setattr(cache_allocator, _PATCHED, True)
