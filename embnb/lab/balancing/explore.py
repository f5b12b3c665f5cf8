"""Notebook 04's explorer (`embnb.lab.widgets.Explorer`): every balancer's tokens per rank on one Zipf
batch, redrawn by `plotting.rank_bars` as a control moves (`explorer.controls["num_parts"].value = 16`).
"""

from __future__ import annotations

import ipywidgets as widgets
from matplotlib.figure import Figure

from embnb.balancing.partition import METHODS, balance
from embnb.data import zipf_lengths
from embnb.lab.plotting import rank_bars
from embnb.lab.widgets import Explorer

__all__ = ["BalanceExplorer"]


class BalanceExplorer(Explorer):
    """Tokens per rank of each method of `partition.METHODS` on a Zipf(alpha) batch of `num_samples`
    sequences (up to `max_length`, drawn with `seed`) split into `num_parts` ranks."""

    def __init__(self, alpha=1.5, num_parts=8, num_samples=1024, max_length=8192, seed=0):
        self.max_length, self.seed = max_length, seed
        once = {"continuous_update": False}  # redraw when released, not at every step of a drag
        super().__init__(
            {
                "alpha": widgets.FloatSlider(alpha, min=1.05, max=3, step=0.05, description="skew α", **once),
                "num_parts": widgets.IntSlider(num_parts, min=2, max=64, description="ranks", **once),
                "num_samples": widgets.IntSlider(
                    num_samples, min=64, max=8192, step=64, description="batch size", **once
                ),
            }
        )

    def draw(self, alpha: float, num_parts: int, num_samples: int) -> Figure:
        lengths = zipf_lengths(num_samples, alpha, self.max_length, self.seed)
        title = f"Zipf({alpha:.2f}) lengths, {num_samples} samples into {num_parts} ranks"
        loads = {m: [int(lengths[p].sum()) for p in balance(lengths, num_parts, m)] for m in METHODS}
        return rank_bars(loads, ylabel="tokens per rank", title=title)
