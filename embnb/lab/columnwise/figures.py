"""Figures of notebook 02 (column-wise sharding): each takes data and returns a Figure (shared style from
`embnb.lab.plotting`). Columns, not ranks, run along these axes.

    column_order_figure([0, 1, 0], [4, 4, 4])    # naive vs permuted stitching
    lookup_error_figure({"naive": err}, [0, 4, 8], rows_per_rank=[5, 3])
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from matplotlib.figure import Figure

from embnb.columnwise import placement as cw
from embnb.lab.plotting import color, new_figure

RIGHT, WRONG = "#2a7d2a", "#c0392b"
LINE = {"color": "#444444", "linewidth": 1}
IMAGE = {"aspect": "auto", "interpolation": "nearest"}


def column_order_figure(
    shard_ranks: Sequence[int], widths: Sequence[int], title: str | None = None
) -> Figure:
    """Three strips of one looked-up row whose values are their column indices: the unsharded row, the
    naive concatenation in rank order, and the permuted one. A right stitching reads 0, 1, 2, ..."""
    ranks = cw.check_shard_ranks(shard_ranks)
    widths = cw.check_widths(widths, sum(widths) if widths else 0, len(ranks))
    dim = sum(widths)
    columns = torch.arange(dim, dtype=torch.float32).view(1, dim)
    arrived = cw.rank_ordered_shard_outputs(columns, ranks, widths)
    order, in_order = cw.rank_order(ranks), list(range(len(ranks)))
    naive = cw.concat_in_rank_order(arrived)
    naive_right = torch.equal(naive, columns)
    verdict = "right only because the ranks are sorted" if naive_right else "WRONG"
    naive_title = f"naive: concatenate in arrival (rank) order {order} — {verdict}"
    permuted_title = f"permute {cw.cw_permute_indices(ranks)}, then concatenate — right"
    strips = [
        ("unsharded EmbeddingCollection (column order)", columns, in_order, "black"),
        (naive_title, naive, order, (WRONG, RIGHT)[naive_right]),
        (permuted_title, cw.stitch_cw(arrived, ranks), in_order, RIGHT),
    ]
    fig = new_figure(min(max(7.0, 2.4 + 0.42 * dim), 16), 4.2)
    for ax, (text, row, shards, text_color) in zip(fig.subplots(3, 1), strips):
        # cells coloured and numbered by source column; under each block its shard, in its rank's colour
        ax.imshow(row.numpy(), cmap="viridis", vmin=0, vmax=max(dim - 1, 1), **IMAGE)
        for x, col in enumerate(row[0].tolist() if dim <= 40 else []):
            ax.text(x, 0, str(int(col)), ha="center", va="center", fontsize=8, color="wk"[col >= 0.6 * dim])
        starts = [sum(widths[s] for s in shards[:i]) for i in range(len(shards))]
        for start in starts[1:]:
            ax.axvline(start - 0.5, color="white", linewidth=3)
        labels = [f"s{s} (rank {ranks[s]})" for s in shards]
        ax.set_xticks([start + widths[s] / 2 - 0.5 for start, s in zip(starts, shards)], labels, fontsize=8)
        for tick, s in zip(ax.get_xticklabels(), shards):
            tick.set_color(color(f"rank {ranks[s]}", ranks[s]))
        ax.tick_params(axis="x", length=0)
        ax.set_yticks([])
        ax.set_title(text, loc="left", fontsize=9, color=text_color)
    fig.suptitle(title or f"shard_ranks {ranks}, widths {widths}: cell = source column", fontsize=10)
    return fig


def lookup_error_figure(
    errors: Mapping[str, torch.Tensor],
    shard_offsets: Sequence[int] = (),
    title: str | None = None,
    rows_per_rank: Sequence[int] = (),
) -> Figure:
    """|output - unsharded| per looked-up row (y) and column (x), a panel per path, one colour scale (white
    is exact). `shard_offsets`: each shard's first column, dashed; `rows_per_rank`: ids looked up by each
    rank, in rank order, labels the y axis by rank with a line where ranks change."""
    if not errors:
        raise ValueError("errors is empty: nothing to plot")
    shapes = {tuple(e.shape) for e in errors.values()}
    if len(shapes) != 1 or len(next(iter(shapes))) != 2:
        raise ValueError(f"errors must be 2-D and of one shape, got shapes {sorted(shapes)}")
    rows, dim = next(iter(shapes))
    vmax = max([float(e.max()) for e in errors.values() if e.numel()] + [1e-6])
    fig = new_figure(min(2.4 + 0.3 * dim, 16), 0.9 + len(errors) * (0.6 + 0.16 * min(rows, 40)))
    axes = fig.subplots(len(errors), 1, squeeze=False)[:, 0]
    starts = [sum(rows_per_rank[:r]) for r in range(len(rows_per_rank))]
    for ax, (name, error) in zip(axes, errors.items()):
        worst = float(error.max()) if error.numel() else 0.0
        image = ax.imshow(error.numpy(), cmap="Reds", vmin=0, vmax=vmax, **IMAGE)
        for offset in shard_offsets:
            if 0 < offset < dim:
                ax.axvline(offset - 0.5, linestyle="--", **LINE)
        title_color = RIGHT if worst == 0 else WRONG
        exact = "  (exact)" if worst == 0 else ""
        ax.set_title(f"{name}: max |error| = {worst:.3g}{exact}", loc="left", fontsize=9, color=title_color)
        ax.set_ylabel("looked-up id")
        ranks = [f"rank {r}" for r in range(len(starts))]
        ax.set_yticks([s + (n - 1) / 2 for s, n in zip(starts, rows_per_rank)], ranks)
        for start in starts[1:]:
            ax.axhline(start - 0.5, **LINE)
        ax.set_xticks(range(dim))
    axes[-1].set_xlabel("embedding column (dashed: shard starts)")
    fig.colorbar(image, ax=list(axes), label="|output − unsharded|", shrink=0.9)
    if title:
        fig.suptitle(title, fontsize=10)
    return fig
