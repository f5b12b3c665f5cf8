"""An ipywidgets explorer of column-wise placements (notebook 02).

Type shard ranks ("1, 0, 0, 1") and optionally widths ("1, 3, 2, 2"); the
explorer shows the arrival order, the permute indices and
`cw_plots.column_order_figure`. Bad input shows the package's ValueError
message instead of a figure. Needs no display to run:

    explorer = PlacementExplorer("0, 1, 0", world_size=2, embedding_dim=12)
    explorer.shard_ranks.value = "1, 0, 0, 1"   # redraws
    explorer.permute, explorer.figure, explorer.error
"""

from __future__ import annotations

import ipywidgets as widgets
from IPython.display import display
from matplotlib.figure import Figure

from embnb.columnwise import plots as cw_plots
from embnb.columnwise.placement import (
    check_shard_ranks,
    check_widths,
    cw_permute_indices,
    equal_widths,
    rank_order,
)

__all__ = ["PlacementExplorer", "parse_ints"]


def parse_ints(text: str, what: str) -> list[int]:
    """ "1, 0, 0, 1" -> [1, 0, 0, 1]; a ValueError naming `what` otherwise."""
    parts = text.replace(",", " ").split()
    try:
        return [int(p) for p in parts]
    except ValueError:
        raise ValueError(f"{what} {text!r} is not a list of integers like '0, 1, 0'") from None


class PlacementExplorer:
    """Controls `shard_ranks`, `widths` (text; empty = equal split),
    `world_size` and `embedding_dim`; `output` holds the drawing. After each
    change: `permute` and `figure`, or `error` (the message shown)."""

    def __init__(
        self,
        shard_ranks: str = "0, 1, 0",
        world_size: int = 2,
        embedding_dim: int = 12,
        widths: str = "",
        max_world_size: int = 8,
        max_embedding_dim: int = 48,
    ):
        self.shard_ranks = widgets.Text(value=shard_ranks, description="shard_ranks", continuous_update=False)
        self.widths = widgets.Text(
            value=widths, description="widths", placeholder="equal split", continuous_update=False
        )
        self.world_size = widgets.IntSlider(
            value=world_size,
            min=1,
            max=max(max_world_size, world_size),
            description="world_size",
            continuous_update=False,
        )
        self.embedding_dim = widgets.IntSlider(
            value=embedding_dim,
            min=1,
            max=max(max_embedding_dim, embedding_dim),
            description="embedding_dim",
            continuous_update=False,
        )
        self.output = widgets.Output()
        self.permute: list[int] | None = None
        self.figure: Figure | None = None
        self.error: str | None = None
        for control in (self.shard_ranks, self.widths, self.world_size, self.embedding_dim):
            control.observe(lambda _change: self.redraw(), names="value")
        self.widget = widgets.VBox(
            [
                widgets.HBox([self.shard_ranks, self.widths]),
                widgets.HBox([self.world_size, self.embedding_dim]),
                self.output,
            ]
        )
        self.redraw()

    def redraw(self) -> None:
        self.output.clear_output(wait=True)
        try:
            ranks = check_shard_ranks(
                parse_ints(self.shard_ranks.value, "shard_ranks"), self.world_size.value
            )
            widths = (
                check_widths(parse_ints(self.widths.value, "widths"), self.embedding_dim.value, len(ranks))
                if self.widths.value.strip()
                else equal_widths(self.embedding_dim.value, len(ranks))
            )
        except ValueError as exc:
            self.permute, self.figure, self.error = None, None, str(exc)
            with self.output:
                print(f"ValueError: {exc}")
            return
        self.permute, self.error = cw_permute_indices(ranks, self.world_size.value), None
        self.figure = cw_plots.column_order_figure(ranks, widths)
        with self.output:
            print(f"outputs arrive as shards {rank_order(ranks)}; permute indices {self.permute}")
            display(self.figure)

    def _repr_mimebundle_(self, **kwargs):
        return self.widget._repr_mimebundle_(**kwargs)
