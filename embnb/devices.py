"""Which device and backend a launch's ranks get: `device_plan(device,
world_size)` (gloo ranks on the CPU; nccl ranks one per GPU; gloo ranks
sharing GPUs where there are fewer GPUs than ranks), `pick_backend` and
`resolve_device`. `embnb.dist` launches by these rules and re-exports them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from embnb._checks import check_choice, check_int

__all__ = [
    "BACKENDS",
    "DEVICES",
    "DevicePlan",
    "device_plan",
    "pick_backend",
    "resolve_device",
    "visible_gpus",
    "device_cache_bytes",
]

BACKENDS = ("auto", "gloo", "nccl")
DEVICES = ("auto", "cpu", "cuda")


def visible_gpus() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def device_cache_bytes(device: str) -> int | None:
    """The cache one worker of `device` reads tables through: a CPU core's L2 (Linux sysfs), a
    GPU's L2; None where the machine does not say."""
    check_choice("device", device, ("cpu", "cuda"))
    if device == "cuda":
        return int(torch.cuda.get_device_properties(0).L2_cache_size) if visible_gpus() else None
    from pathlib import Path

    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    for index in sorted(Path("/sys/devices/system/cpu/cpu0/cache").glob("index*")):
        try:
            if (index / "level").read_text().strip() == "2":
                size = (index / "size").read_text().strip()
                return int(size[:-1]) * units[size[-1]] if size[-1] in units else int(size)
        except (OSError, ValueError):
            return None
    return None


def pick_backend(backend: str, world_size: int) -> str:
    """Resolve "auto" to nccl when there is one GPU per rank, else gloo."""
    check_choice("backend", backend, BACKENDS)
    gpus = visible_gpus()
    if backend == "auto":
        return "nccl" if gpus >= world_size else "gloo"
    if backend == "nccl" and gpus < world_size:
        raise ValueError(
            f"backend 'nccl' needs one GPU per rank: world_size={world_size}, "
            f"GPUs visible={gpus}; use backend='gloo' or 'auto'"
        )
    return backend


@dataclass(frozen=True)
class DevicePlan:
    """Where `world_size` ranks compute and how they talk: THE device rule."""

    device: str  # "cpu" or "cuda": where each rank computes
    backend: str  # "gloo" or "nccl": the process group's backend
    world_size: int
    gpus: int  # GPUs visible to the parent

    @property
    def shares_gpus(self) -> bool:
        """Ranks share GPUs (fewer GPUs than ranks): nccl refuses that, so
        they compute on CUDA and run their collectives over gloo."""
        return self.device == "cuda" and self.backend == "gloo"

    def rank_device(self, rank: int) -> torch.device:
        """Rank `rank`'s device: GPU `rank % gpus` on CUDA, else the CPU."""
        return torch.device("cuda", rank % self.gpus) if self.device == "cuda" else torch.device("cpu")

    def describe(self) -> str:
        if self.shares_gpus:
            return (
                f"{self.world_size} ranks share {self.gpus} GPU(s): they compute on CUDA and run "
                f"their collectives over gloo through host memory (nccl needs one GPU per rank)"
            )
        return f"{self.world_size} ranks on {self.device} ({self.backend}; {self.gpus} GPUs visible)"


def device_plan(device: str, world_size: int = 1, *, gpus: int | None = None) -> DevicePlan:
    """Map a notebook's or CLI's `device` ("auto", "cpu", "cuda") to a plan.

    "cpu": ranks compute on the CPU and talk over gloo. "cuda": with one GPU
    per rank, each rank has its own GPU and talks over nccl; with fewer GPUs
    than ranks, ranks share the GPUs (rank r on GPU r % gpus), compute on
    CUDA and talk over gloo; with no GPU it raises. "auto": "cuda" when
    there is a GPU, else "cpu". `gpus` overrides the number of visible GPUs
    (to test the rule on a machine without them).
    """
    check_choice("device", device, DEVICES)
    check_int("world_size", world_size, low=1)
    gpus = visible_gpus() if gpus is None else check_int("gpus", gpus, low=0)
    if device == "cuda" and gpus == 0:
        raise ValueError("device 'cuda' needs a GPU, but none is visible; use device='cpu' or 'auto'")
    if device == "auto":
        device = "cuda" if gpus else "cpu"
    if device == "cpu":
        return DevicePlan("cpu", "gloo", world_size, gpus)
    return DevicePlan("cuda", "nccl" if gpus >= world_size else "gloo", world_size, gpus)


def resolve_device(device: str, world_size: int = 1) -> str:
    """`device_plan(device, world_size).device`: "cpu" or "cuda"."""
    return device_plan(device, world_size).device
