"""LoRA adapters made in the test with peft, on a checkpoint made in the test (tests/tiny.py).

    make_lora_adapter(checkpoint, folder, ...) -> folder       one PEFT adapter (adapter_config.json +
                                                               adapter_model.safetensors)
    make_two_adapters(checkpoint, root) -> {name: folder}      two adapters that change the greedy answer
    peft_model(checkpoint, folder)                             transformers + peft over them: the reference

The adapters' weights are random and scaled up (`strength`), so each moves the tiny model's greedy
tokens away from the base model's and from each other's.
"""

from __future__ import annotations

from pathlib import Path

ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP = ("gate_proj", "up_proj", "down_proj")
# The two adapters of make_two_adapters: name -> (rank, alpha, target modules, seed).
TWO_ADAPTERS = {
    "alpha": (4, 8, ("q_proj", "v_proj"), 1),
    "beta": (8, 16, (*ATTENTION, *MLP), 2),
}


def make_lora_adapter(
    checkpoint: Path,
    folder: Path,
    *,
    rank: int = 4,
    alpha: int = 8,
    target_modules: tuple[str, ...] = ("q_proj", "v_proj"),
    seed: int = 0,
    strength: float = 4.0,
) -> Path:
    """A LoRA adapter of `checkpoint` saved by peft in `folder` (base_model_name_or_path: the checkpoint's
    path). lora_A and lora_B are random (not peft's zero B), B scaled by `strength`."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32)
    config = LoraConfig(
        r=rank,
        lora_alpha=alpha,
        target_modules=list(target_modules),
        lora_dropout=0.0,
        bias="none",
        task_type="CAUSAL_LM",
        init_lora_weights=False,
    )
    torch.manual_seed(seed)
    model = get_peft_model(base, config)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.mul_(strength)
    model.save_pretrained(folder)
    return Path(folder)


def make_two_adapters(checkpoint: Path, root: Path) -> dict[str, Path]:
    """TWO_ADAPTERS made in root/<name>: `alpha` (rank 4, q/v) and `beta` (rank 8, every linear layer)."""
    return {
        name: make_lora_adapter(
            checkpoint, Path(root) / name, rank=rank, alpha=alpha, target_modules=modules, seed=seed
        )
        for name, (rank, alpha, modules, seed) in TWO_ADAPTERS.items()
    }


def peft_model(checkpoint: Path, folder: Path):
    """transformers' model of `checkpoint` with peft's adapter from `folder`, fp32, eval mode."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32)
    return PeftModel.from_pretrained(base, folder).eval()


def write_lora_adapter(
    folder: Path,
    config: dict,
    *,
    base: str,
    rank: int = 8,
    alpha: int = 16,
    modules: tuple[str, ...] = ("q_proj", "v_proj"),
    layers: tuple[int, ...] = (0, 1),
    seed: int = 0,
) -> Path:
    """A PEFT LoRA folder for a model known by its config.json only (the GPU tests' 8B configs): random
    float16 tensors of the shapes peft would save for `modules` of `layers`, named as peft names them."""
    import json

    import numpy as np
    from safetensors.numpy import save_file

    hidden, inner = config["hidden_size"], config["intermediate_size"]
    heads, kv_heads = (
        config["num_attention_heads"],
        config.get("num_key_value_heads", config["num_attention_heads"]),
    )
    head_dim = config.get("head_dim") or hidden // heads
    features = {
        "q_proj": (hidden, heads * head_dim),
        "k_proj": (hidden, kv_heads * head_dim),
        "v_proj": (hidden, kv_heads * head_dim),
        "o_proj": (heads * head_dim, hidden),
        "gate_proj": (hidden, inner),
        "up_proj": (hidden, inner),
        "down_proj": (inner, hidden),
        # Phi-3's fused layers
        "qkv_proj": (hidden, (heads + 2 * kv_heads) * head_dim),
        "gate_up_proj": (hidden, 2 * inner),
    }
    random = np.random.default_rng(seed)
    tensors = {}
    for layer in layers:
        for module in modules:
            part = "self_attn" if module in (*ATTENTION, "qkv_proj") else "mlp"
            prefix = f"base_model.model.model.layers.{layer}.{part}.{module}"
            fan_in, fan_out = features[module]
            tensors[f"{prefix}.lora_A.weight"] = random.normal(0, 0.02, (rank, fan_in)).astype(
                np.float16
            )
            tensors[f"{prefix}.lora_B.weight"] = random.normal(0, 0.02, (fan_out, rank)).astype(
                np.float16
            )
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, folder / "adapter_model.safetensors")
    adapter_config = {
        "peft_type": "LORA",
        "base_model_name_or_path": base,
        "r": rank,
        "lora_alpha": alpha,
        "target_modules": list(modules),
        "layers_to_transform": list(layers),
        "bias": "none",
        "task_type": "CAUSAL_LM",
    }
    (folder / "adapter_config.json").write_text(json.dumps(adapter_config))
    return folder
