"""Notebook 02's placement explorer: type shard ranks ("1, 0, 0, 1") and optionally widths; it draws
`figures.column_order_figure` for them with the same `embnb.columnwise` functions, or shows the error
of a bad value (an embedding_dim the shards cannot split equally, a rank past world_size)."""

from __future__ import annotations

import ipywidgets as widgets
from matplotlib.figure import Figure

from embnb.columnwise import placement
from embnb.lab.columnwise.figures import column_order_figure
from embnb.lab.widgets import Explorer, world_size_slider

__all__ = ["PlacementExplorer", "parse_ints"]


def parse_ints(text: str, what: str) -> list[int]:
    """ "1, 0, 0, 1" -> [1, 0, 0, 1]; a ValueError naming `what` otherwise."""
    try:
        return [int(p) for p in text.replace(",", " ").split()]
    except ValueError:
        raise ValueError(f"{what} {text!r} is not a list of integers like '0, 1, 0'") from None


class PlacementExplorer(Explorer):
    """Controls `shard_ranks`, `widths` (text; empty = torchrec's equal split), `world_size` (1 to 8)
    and `embedding_dim` (1 to 48, or to the one given if wider)."""

    def __init__(self, shard_ranks: str = "0, 1, 0", world_size: int = 2, embedding_dim: int = 12):
        text = {"continuous_update": False}
        super().__init__(
            {
                "shard_ranks": widgets.Text(value=shard_ranks, description="shard_ranks", **text),
                "widths": widgets.Text(description="widths", placeholder="equal split", **text),
                "world_size": world_size_slider(world_size, 8),
                "embedding_dim": widgets.IntSlider(
                    embedding_dim, min=1, max=max(48, embedding_dim), description="embedding_dim", **text
                ),
            }
        )

    def draw(self, shard_ranks: str, widths: str, world_size: int, embedding_dim: int) -> Figure:
        ranks = placement.check_shard_ranks(parse_ints(shard_ranks, "shard_ranks"), world_size)
        if widths.strip():
            shard_widths = placement.check_widths(parse_ints(widths, "widths"), embedding_dim, len(ranks))
        else:
            shard_widths = placement.equal_widths(embedding_dim, len(ranks))
        permute = placement.cw_permute_indices(ranks, world_size)
        title = (
            f"shard_ranks {ranks} on {world_size} ranks, embedding_dim {embedding_dim}, "
            f"widths {shard_widths}: arrive as {placement.rank_order(ranks)}, permute {permute}"
        )
        return column_order_figure(ranks, shard_widths, title=title)
