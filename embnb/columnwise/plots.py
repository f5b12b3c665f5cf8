"""Figures of notebook 02 (column-wise sharding): each takes data, returns a Figure.

    fig = column_order_figure([0, 1, 0], [4, 4, 4])    # naive vs permuted stitching
    fig = lookup_error_figure({"naive": err, "embnb": err2}, [0, 4, 8])

Figures come from `embnb.plotting.new_figure` (the shared style); a notebook
shows one with `display(fig)`. Columns, not ranks, run along these axes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from matplotlib.figure import Figure

from embnb.columnwise.placement import (
    check_shard_ranks,
    check_widths,
    concat_in_rank_order,
    cw_permute_indices,
    rank_order,
    rank_ordered_shard_outputs,
    stitch_cw,
)
from embnb.plotting import color, new_figure

__all__ = ["column_order_figure", "lookup_error_figure"]

COLUMN_CMAP = "viridis"  # column order reads as a smooth ramp, left to right
ERROR_CMAP = "Reds"  # white = exact
RIGHT, WRONG = "#2a7d2a", "#c0392b"


def _draw_strip(
    ax, columns: torch.Tensor, labels: list[str], widths: list[int], dim: int, label_colors: list[str]
) -> None:
    """One row of cells coloured (and numbered) by the column they came from;
    shard labels below it in their rank's colour."""
    ax.imshow(
        columns.view(1, -1).numpy(),
        cmap=COLUMN_CMAP,
        vmin=0,
        vmax=max(dim - 1, 1),
        aspect="auto",
        interpolation="nearest",
    )
    if dim <= 40:
        for x, col in enumerate(columns.tolist()):
            ax.text(
                x,
                0,
                str(int(col)),
                ha="center",
                va="center",
                fontsize=8,
                color="white" if col < 0.6 * dim else "black",
            )
    starts = [sum(widths[:i]) for i in range(len(widths))]
    for start in starts[1:]:
        ax.axvline(start - 0.5, color="white", linewidth=3)
    # Shard names under their blocks, as tick labels.
    ax.set_xticks([start + width / 2 - 0.5 for start, width in zip(starts, widths)], labels, fontsize=8)
    for tick, label_color in zip(ax.get_xticklabels(), label_colors):
        tick.set_color(label_color)
    ax.tick_params(axis="x", length=0)
    ax.set_yticks([])


def column_order_figure(
    shard_ranks: Sequence[int],
    widths: Sequence[int],
    title: str | None = None,
) -> Figure:
    """Three strips of one looked-up row whose values are their column
    indices: the unsharded row, the naive concatenation in rank order, and
    the permuted one. A right stitching reads 0, 1, 2, ... left to right."""
    ranks = check_shard_ranks(shard_ranks)
    widths = check_widths(widths, sum(widths) if widths else 0, len(ranks))
    dim = sum(widths)
    columns = torch.arange(dim, dtype=torch.float32).view(1, dim)
    arrived = rank_ordered_shard_outputs(columns, ranks, widths)
    order, permute = rank_order(ranks), cw_permute_indices(ranks)
    naive, stitched = concat_in_rank_order(arrived), stitch_cw(arrived, ranks)
    naive_right = torch.equal(naive, columns)

    def label(s: int) -> str:
        return f"s{s} (rank {ranks[s]})"

    fig = new_figure(min(max(7.0, 2.4 + 0.42 * dim), 16), 4.2)
    axes = fig.subplots(3, 1)
    strips = [
        ("unsharded EmbeddingCollection (column order)", columns, list(range(len(ranks))), "black"),
        (
            f"naive: concatenate in arrival (rank) order {order} — "
            + ("right only because the ranks are sorted" if naive_right else "WRONG"),
            naive,
            order,
            RIGHT if naive_right else WRONG,
        ),
        (f"permute {permute}, then concatenate — right", stitched, list(range(len(ranks))), RIGHT),
    ]
    for ax, (text, row, shard_order, verdict_color) in zip(axes, strips):
        _draw_strip(
            ax,
            row[0],
            [label(s) for s in shard_order],
            [widths[s] for s in shard_order],
            dim,
            [color(f"rank {ranks[s]}", ranks[s]) for s in shard_order],
        )
        ax.set_title(text, loc="left", fontsize=9, color=verdict_color)
    fig.suptitle(title or f"shard_ranks {ranks}, widths {widths}: cell = source column", fontsize=10)
    return fig


def lookup_error_figure(
    errors: Mapping[str, torch.Tensor],
    shard_offsets: Sequence[int] = (),
    title: str | None = None,
) -> Figure:
    """|output - unsharded| per looked-up row (y) and column (x), one panel
    per path, on one colour scale; white is exact. `shard_offsets` draws the
    first column of each shard."""
    if not errors:
        raise ValueError("errors is empty: nothing to plot")
    shapes = {tuple(e.shape) for e in errors.values()}
    if len(shapes) != 1 or len(next(iter(shapes))) != 2:
        raise ValueError(f"errors must be 2-D and of one shape, got shapes {sorted(shapes)}")
    rows, dim = next(iter(shapes))
    vmax = max([float(e.max()) for e in errors.values() if e.numel()] + [1e-6])
    fig = new_figure(min(2.4 + 0.3 * dim, 16), 0.9 + len(errors) * (0.6 + 0.16 * min(rows, 40)))
    axes = fig.subplots(len(errors), 1, squeeze=False)[:, 0]
    image = None
    for ax, (name, error) in zip(axes, errors.items()):
        worst = float(error.max()) if error.numel() else 0.0
        image = ax.imshow(
            error.numpy(), cmap=ERROR_CMAP, vmin=0, vmax=vmax, aspect="auto", interpolation="nearest"
        )
        for offset in shard_offsets:
            if 0 < offset < dim:
                ax.axvline(offset - 0.5, color="#444444", linewidth=1, linestyle="--")
        ax.set_title(
            f"{name}: max |error| = {worst:.3g}" + ("  (exact)" if worst == 0 else ""),
            loc="left",
            fontsize=9,
            color=RIGHT if worst == 0 else WRONG,
        )
        ax.set_ylabel("looked-up id")
        ax.set_yticks([])
    axes[-1].set_xlabel("embedding column (dashed: shard starts)")
    fig.colorbar(image, ax=list(axes), label="|output − unsharded|", shrink=0.9)
    if title:
        fig.suptitle(title, fontsize=10)
    return fig
