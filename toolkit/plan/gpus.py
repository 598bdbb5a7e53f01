"""GPU profiles: memory, bandwidth and dense tensor throughput.

Memory is what the driver reports as the card's total (`nvidia-smi --query-gpu=memory.total`, in
MiB), the number TensorRT-LLM's runtime and trtllm-bench work from; it is less than the physical
HBM (ECC and firmware keep the rest). The planner then holds back a stated reserve of it
(toolkit.plan.memory.ACTIVATION_RESERVE_FRACTION). Bandwidth and throughput come from NVIDIA's
datasheets; throughput is *dense* (datasheets print the 2:4-sparsity figure with an asterisk;
dense is half of it).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from toolkit.errors import PlanError
from toolkit.registry import by_name

GB = 10**9
TB = 10**12
MIB = 2**20


@dataclass(frozen=True)
class GpuProfile:
    name: str
    description: str
    memory_bytes: int
    bandwidth_bytes_per_s: float
    bf16_tflops: float  # dense
    fp8_tflops: float | None  # dense; None where the chip has no FP8 tensor cores
    sm: str  # compute capability as nvidia-smi --query-gpu=compute_cap prints it, e.g. "9.0"
    # The node label values of this card: GPU Feature Discovery labels each node
    # nvidia.com/gpu.product with the NVML device name (what `nvidia-smi --query-gpu=name` prints),
    # spaces turned into '-' (NVIDIA/k8s-device-plugin, internal/lm/resource.go, sanitise()).
    gpu_products: tuple[str, ...] = ()
    # What one GPU sends to its peers per second in one direction over its GPU-to-GPU link (NVLink, or
    # PCIe where a card has none): half the bidirectional figure datasheets print. Tensor-parallel
    # all-reduce runs over it (toolkit.plan.estimate).
    interconnect_bytes_per_s: float = 0.0

    @property
    def supports_fp8(self) -> bool:
        return self.fp8_tflops is not None

    def to_dict(self) -> dict:
        return {**asdict(self), "gpu_products": list(self.gpu_products)}


GPU_PROFILES: dict[str, GpuProfile] = by_name(
    # NVIDIA H100 Tensor Core GPU datasheet (2023), "H100 SXM" column: 80 GB HBM3, 3.35 TB/s,
    # BF16 1,979 TFLOPS* and FP8 3,958 TFLOPS* with sparsity -> 989.5 / 1,979 dense. Hopper: SM 9.0.
    # nvidia-smi on "NVIDIA H100 80GB HBM3": memory.total 81559 MiB.
    GpuProfile(
        "h100-sxm",
        "NVIDIA H100 SXM 80GB",
        81559 * MIB,
        3.35 * TB,
        989.5,
        1979.0,
        "9.0",
        gpu_products=("NVIDIA-H100-80GB-HBM3",),
        interconnect_bytes_per_s=450 * GB,  # NVLink 900 GB/s
    ),
    # Same datasheet, "H100 PCIe" column: 80 GB HBM2e, 2 TB/s, BF16 1,513* / FP8 3,026* (sparse);
    # nvidia-smi on "NVIDIA H100 PCIe": 81559 MiB.
    GpuProfile(
        "h100-pcie",
        "NVIDIA H100 PCIe 80GB",
        81559 * MIB,
        2.0 * TB,
        756.5,
        1513.0,
        "9.0",
        gpu_products=("NVIDIA-H100-PCIe",),
        interconnect_bytes_per_s=64 * GB,  # PCIe Gen5 128 GB/s (the NVLink bridge is optional)
    ),
    # Same datasheet, "H100 NVL" column: 94 GB HBM3, 3.9 TB/s, BF16 1,671* / FP8 3,341* (sparse).
    # The datasheet's 94 GB (decimal): no nvidia-smi figure we could cite; errs low.
    GpuProfile(
        "h100-nvl",
        "NVIDIA H100 NVL 94GB",
        94 * GB,
        3.9 * TB,
        835.5,
        1670.5,
        "9.0",
        gpu_products=("NVIDIA-H100-NVL",),
        interconnect_bytes_per_s=300 * GB,  # NVLink bridge 600 GB/s (pairs of cards)
    ),
    # NVIDIA H200 Tensor Core GPU datasheet (2024), "H200 SXM": 141 GB HBM3e, 4.8 TB/s,
    # BF16 1,979* / FP8 3,958* (sparse), same Hopper compute as H100 SXM; nvidia-smi: 143771 MiB.
    GpuProfile(
        "h200",
        "NVIDIA H200 SXM 141GB",
        143771 * MIB,
        4.8 * TB,
        989.5,
        1979.0,
        "9.0",
        gpu_products=("NVIDIA-H200",),
        interconnect_bytes_per_s=450 * GB,  # NVLink 900 GB/s
    ),
    # NVIDIA A100 Tensor Core GPU datasheet (2021), "A100 80GB SXM": 80 GB HBM2e, 2,039 GB/s,
    # BF16 312 TFLOPS dense (624 sparse); no FP8. Ampere: SM 8.0. nvidia-smi: 81920 MiB.
    GpuProfile(
        "a100-80gb",
        "NVIDIA A100 SXM 80GB",
        81920 * MIB,
        2.039 * TB,
        312.0,
        None,
        "8.0",
        gpu_products=("NVIDIA-A100-SXM4-80GB",),
        interconnect_bytes_per_s=300 * GB,  # NVLink 600 GB/s
    ),
    # NVIDIA L40S datasheet (2023): 48 GB GDDR6, 864 GB/s, BF16 362.05 dense (733 sparse),
    # FP8 733 dense (1,466 sparse). Ada Lovelace: SM 8.9. nvidia-smi: 46068 MiB.
    GpuProfile(
        "l40s",
        "NVIDIA L40S 48GB",
        46068 * MIB,
        0.864 * TB,
        362.05,
        733.0,
        "8.9",
        gpu_products=("NVIDIA-L40S",),
        interconnect_bytes_per_s=32 * GB,  # no NVLink: PCIe Gen4 x16 64 GB/s
    ),
)


def get_gpu(name: str) -> GpuProfile:
    """The profile for a --gpu/--target name; PlanError naming the known ones otherwise."""
    key = name.strip().lower()
    if key not in GPU_PROFILES:
        raise PlanError(
            f"no GPU profile named {name!r}",
            hint=f"use one of: {', '.join(GPU_PROFILES)}",
        )
    return GPU_PROFILES[key]
