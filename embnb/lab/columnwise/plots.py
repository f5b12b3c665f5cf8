"""Figures of notebook 02 (column-wise sharding): each takes data, returns a Figure.

    fig = column_order_figure([0, 1, 0], [4, 4, 4])    # naive vs permuted stitching
    fig = lookup_error_figure({"naive": err, "embnb": err2}, [0, 4, 8], rows_per_rank=[5, 3])
    fig = traffic_figure(experiment.traffic_table())  # bytes each path sends per id, by layout

Figures come from `embnb.lab.plotting.new_figure` (the shared style); a notebook
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
from embnb.lab.plotting import color, new_figure

__all__ = ["column_order_figure", "lookup_error_figure", "traffic_figure"]

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
    rows_per_rank: Sequence[int] = (),
) -> Figure:
    """|output - unsharded| per looked-up row (y) and column (x), one panel
    per path, on one colour scale; white is exact. `shard_offsets` draws the
    first column of each shard; `rows_per_rank` (ids looked up by each rank,
    in rank order) labels the y axis by rank and draws where ranks change."""
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
        starts = [sum(rows_per_rank[:r]) for r in range(len(rows_per_rank))]
        ax.set_yticks(
            [s + (n - 1) / 2 for s, n in zip(starts, rows_per_rank)],
            [f"rank {r}" for r in range(len(starts))],
        )
        for start in starts[1:]:
            ax.axhline(start - 0.5, color="#444444", linewidth=1)
        ax.set_xticks(range(dim))
    axes[-1].set_xlabel("embedding column (dashed: shard starts)")
    fig.colorbar(image, ax=list(axes), label="|output − unsharded|", shrink=0.9)
    if title:
        fig.suptitle(title, fontsize=10)
    return fig


def traffic_figure(table, title: str | None = None) -> Figure:
    """Bytes per looked-up id that each path sent in one forward
    (`PlacementExperiment.traffic_table`), one panel per source of layouts:
    a bar per path and layout, row values at the bottom (the same for both
    paths) and integers (ids, lengths, split counts) stacked on top, labelled
    with their share of the row bytes."""
    if table.empty:
        raise ValueError("table is empty: nothing to plot")
    sources = list(dict.fromkeys(table["source"]))
    fig = new_figure(max(8.0, 4.4 * len(sources)), 3.9)
    axes = fig.subplots(1, len(sources), squeeze=False)[0]
    bar_width = 0.38
    for ax, source in zip(axes, sources):
        part = table[table["source"] == source]
        for i, path in enumerate(("torchrec", "embnb")):
            where = [x + (i - 0.5) * bar_width for x in range(len(part))]
            rows, ints = part["rows B/id"].tolist(), part[f"{path} int B/id"].tolist()
            path_color = color(path, i)
            ax.bar(where, rows, bar_width, color=path_color, alpha=0.3, label=f"{path}: row values")
            ax.bar(
                where, ints, bar_width, bottom=rows, color=path_color, label=f"{path}: ids, lengths, counts"
            )
            for x, r, n in zip(where, rows, ints):
                ax.annotate(
                    f"+{n / r:.1%}",
                    (x, r + n),
                    xytext=(0, 2),
                    textcoords="offset points",
                    ha="center",
                    va="bottom",
                    fontsize=7,
                    color=path_color,
                )
        ax.set_xticks(range(len(part)), list(part.index), fontsize=8)
        ax.set_xlabel("layout: D = shards x columns per shard")
        dims = sorted(set(part["embedding_dim"]))
        ax.set_title(f"{source} (D = {', '.join(map(str, dims))})", fontsize=9)
        ax.set_ylim(0, 1.15 * max(part["rows B/id"] + part["torchrec int B/id"]))
    axes[0].set_ylabel("bytes sent per looked-up id")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncols=4, fontsize=8)
    fig.suptitle(
        (title + ": " if title else "") + "bytes per looked-up id, all ranks, one forward "
        "(labels: integers as a share of the row bytes)",
        fontsize=10,
    )
    return fig
