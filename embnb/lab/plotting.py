"""The figure style every notebook shares: one palette, rank ticks, rank bars.

Figures are `matplotlib.figure.Figure`s, not pyplot's (nothing lingers in pyplot's global list): a
notebook shows one with `display(fig)`, a widget redraws into its Output, a test counts axes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import matplotlib
import torch
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.ticker import EngFormatter

__all__ = ["PALETTE", "color", "new_figure", "values_of", "rank_ticks", "rank_bars"]

# One colour per named thing, the same in every figure of every notebook.
PALETTE = {
    # routing modes (notebook 01)
    "continuous": "#4c72b0",
    "roundrobin": "#dd8452",
    "hash_roundrobin": "#55a868",
    # balancers (notebook 04)
    "contiguous": "#8c8c8c",
    "greedy_lpt": "#dd8452",
    "karmarkar_karp": "#4c72b0",
    "kk_swap": "#55a868",
    # proposers (notebook 03)
    "embnb DP": "#55a868",
    "torchrec DP": "#4c72b0",
    "Greedy": "#dd8452",
    "Uniform": "#8172b3",
    "GridSearch": "#937860",
    "torchrec default": "#c44e52",
}
MEAN_STYLE = {"color": "0.3", "linestyle": "--", "linewidth": 1}
MAX_RANK_LABELS = 8  # more rank labels than this run together in a 3-inch panel


def color(name: str, index: int = 0) -> str:
    """The palette's colour of `name`, else the `index`-th of matplotlib's cycle."""
    if name in PALETTE:
        return PALETTE[name]
    cycle = matplotlib.rcParams["axes.prop_cycle"].by_key()["color"]
    return cycle[index % len(cycle)]


def new_figure(width: float, height: float) -> Figure:
    """A Figure with constrained layout (labels never overlap the axes)."""
    return Figure(figsize=(width, height), layout="constrained")


def values_of(data: Sequence[float] | torch.Tensor, what: str) -> list[float]:
    """`data` as a list of floats; raise ValueError naming `what` if empty."""
    values = torch.as_tensor(data, dtype=torch.float64).reshape(-1).tolist()
    if not values:
        raise ValueError(f"{what} is empty: nothing to plot")
    return values


def rank_ticks(ax, num_ranks: int) -> None:
    """Label the x axis with rank numbers, thinned to at most MAX_RANK_LABELS
    (every k-th rank from 0) so that they stay legible."""
    ranks = list(range(num_ranks))
    stride = max(1, -(-num_ranks // MAX_RANK_LABELS))  # ceil
    ax.set_xticks(ranks[::stride])
    ax.set_xlabel("rank")


def rank_bars(
    loads_by_name: Mapping[str, Sequence[float] | torch.Tensor],
    *,
    highlight: Mapping[str, Sequence[float] | torch.Tensor] | None = None,
    highlight_label: str = "hottest key",
    floor: float | None = None,
    floor_label: str = "hot-key floor",
    ylabel: str = "load per rank",
    title: str | None = None,
) -> Figure:
    """Bars of each rank's load, one panel per name, sharing the y axis; the mean dashed and max/mean
    in the title. `highlight[name]` (per-rank values, a part of the totals such as the hottest key's
    lookups) is drawn over the bars in black; `floor` (a max/mean no layout can go below) at
    `floor * mean`. The legend sits below the panels, so it never hides a bar."""
    if not loads_by_name:
        raise ValueError("loads_by_name is empty: nothing to plot")
    names = list(loads_by_name)
    fig = new_figure(0.6 + 3.2 * len(names), 3.6)
    axes = fig.subplots(1, len(names), sharey=True, squeeze=False)[0]
    for i, (ax, name) in enumerate(zip(axes, names)):
        loads = values_of(loads_by_name[name], f"loads of {name!r}")
        ranks = list(range(len(loads)))
        mean = sum(loads) / len(loads)
        ax.bar(ranks, loads, color=color(name, i), label="all")
        if highlight is not None and name in highlight:
            part = values_of(highlight[name], f"highlight of {name!r}")
            ax.bar(ranks, part, color="black", width=0.4, label=highlight_label)
        ax.axhline(mean, **MEAN_STYLE, label="mean")
        if floor is not None:
            ax.axhline(floor * mean, color="#c44e52", linestyle=":", linewidth=1.5, label=floor_label)
        ax.set_title(f"{name}\nmax/mean {max(loads) / mean:.3f}" if mean else name)
        rank_ticks(ax, len(loads))
        ax.yaxis.set_major_formatter(EngFormatter(sep=""))
    axes[0].set_ylabel(ylabel)
    handles, labels = axes[0].get_legend_handles_labels()
    handles[labels.index("all")] = Patch(facecolor="0.6", label="all")
    fig.legend(handles, labels, loc="outside lower center", ncols=len(labels), fontsize=8, frameon=False)
    if title:
        fig.suptitle(title)
    return fig
