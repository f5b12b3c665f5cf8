"""A cap on what sets a rank's peak memory: activation bytes, not tokens.

A rank's measured peak (`steptime.memory`) also holds what grows faster than its tokens (attention
works on a whole sample at once, and `SequenceDense` runs the samples of one length together). So
appendix 04a also caps **modelled activation bytes per rank**: each sample's
`per_token * L + per_token_squared * L**2`, fitted by non-negative least squares (with a constant
for what every step allocates, such as the gradients) to peaks measured for single samples on the
steps' device; a rank's modelled bytes are its samples' sum, an estimate of what its forward keeps
for backward. `measured.measure_capped(..., sizes=model.sample_bytes(lengths))` measures the real
peaks under that cap.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import nnls

from embnb.steptime.memory import peak_step_bytes

__all__ = ["ActivationModel"]


@dataclass(frozen=True)
class ActivationModel:
    """Peak bytes of one sample of L tokens, fixed + per_token * L + per_token_squared * L**2,
    fitted to the measured peaks of single samples (`lengths`, `measured`) of
    `SequenceDense(width, hidden)` on `device`."""

    fixed: float
    per_token: float
    per_token_squared: float
    lengths: list[int]
    measured: list[int]
    device: str

    @classmethod
    def fit(cls, lengths: Sequence[int], width: int, hidden: Sequence[int], device: str) -> ActivationModel:
        """Raises ValueError on fewer than 3 distinct lengths (3 terms)."""
        if len(set(lengths)) < 3:
            raise ValueError(f"need at least 3 distinct lengths to fit 3 terms, got {sorted(set(lengths))}")
        measured = [peak_step_bytes([n], width, hidden, device) for n in lengths]
        x = np.asarray(lengths, dtype=float)
        # non-negative terms: a sample never frees more than it allocates
        terms = nnls(np.stack([np.ones_like(x), x, x * x], axis=1), np.asarray(measured, dtype=float))[0]
        return cls(*map(float, terms), list(lengths), measured, device)

    def sample_bytes(self, lengths: Sequence[int]) -> list[float]:
        """Each sample's modelled activation bytes (the constant left out: every rank pays it once)."""
        return [self.per_token * n + self.per_token_squared * n * n for n in lengths]

    def max_relative_residual(self) -> float:
        """The fit's largest error on the lengths it was fitted to, relative to the measured peak."""
        predicted = [self.fixed + b for b in self.sample_bytes(self.lengths)]
        return max(abs(p - m) / m for p, m in zip(predicted, self.measured))
