"""Sequence-length distributions the balancers are compared on, since their conclusions depend on the
shape: Zipf (`embnb.data.zipf_lengths`: median 2 at alpha 1.5, a few samples thousands long, so with
many parts the longest sample alone often exceeds a fair share) and log-normal (a median of tens to
hundreds of items, as user histories after a minimum-activity filter, and a milder tail).

    lengths = LengthDistribution("lognormal", median=128, sigma=1.0).draw(1024, max_length=8192, seed=0)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from embnb._checks import check_choice, check_int, check_number
from embnb.data import zipf_lengths

__all__ = ["KINDS", "LengthDistribution"]

KINDS = ("zipf", "lognormal")


@dataclass(frozen=True)
class LengthDistribution:
    """One length distribution: `kind` "zipf" (uses `alpha`) or "lognormal"
    (uses `median` and `sigma`)."""

    kind: str = "zipf"
    alpha: float = 1.5  # zipf: P(L) ~ L**-alpha
    median: float = 128.0  # lognormal: the median length
    sigma: float = 1.0  # lognormal: the standard deviation of log L

    def __post_init__(self) -> None:
        check_choice("kind", self.kind, KINDS)
        check_number("alpha", self.alpha, low=0, low_open=True)
        check_number("median", self.median, low=1)
        check_number("sigma", self.sigma, low=0)

    def draw(self, num_samples: int, max_length: int = 8192, seed: int = 0) -> torch.Tensor:
        """`num_samples` int64 lengths in [1, max_length], the same for the same arguments;
        lognormal: exp(log median + sigma * Normal(0, 1)), rounded and clipped."""
        if self.kind == "zipf":
            return zipf_lengths(num_samples, self.alpha, max_length, seed)
        check_int("num_samples", num_samples, low=0)
        check_int("max_length", max_length, low=1)
        gen = torch.Generator().manual_seed(seed)
        normal = torch.randn(num_samples, generator=gen, dtype=torch.float64)
        lengths = torch.exp(math.log(self.median) + self.sigma * normal).round()
        return lengths.clamp(1, max_length).to(torch.int64)
