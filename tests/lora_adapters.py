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
