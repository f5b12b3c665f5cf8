"""Notebook 02's placement explorer: type shard ranks ("1, 0, 0, 1") and optionally widths; it draws
`figures.column_order_figure` for them, or shows the error of a bad value. The embedding_dim slider offers
only multiples of the shard count (torchrec's equal split), or follows the widths' sum.

    explorer = PlacementExplorer("0, 1, 0", world_size=2, embedding_dim=12)
    explorer.controls["shard_ranks"].value = "1, 0, 0, 1"   # redraws
"""

from __future__ import annotations

import ipywidgets as widgets
from matplotlib.figure import Figure

from embnb.columnwise import placement
from embnb.lab.columnwise.figures import column_order_figure
from embnb.lab.widgets import Explorer, world_size_slider


def parse_ints(text: str, what: str) -> list[int]:
    """ "1, 0, 0, 1" -> [1, 0, 0, 1]; a ValueError naming `what` otherwise."""
    try:
        return [int(p) for p in text.replace(",", " ").split()]
    except ValueError:
        raise ValueError(f"{what} {text!r} is not a list of integers like '0, 1, 0'") from None


class PlacementExplorer(Explorer):
    """Controls `shard_ranks`, `widths` (text; empty = equal split), `world_size` and `embedding_dim`."""

    def __init__(
        self,
        shard_ranks: str = "0, 1, 0",
        world_size: int = 2,
        embedding_dim: int = 12,
        widths: str = "",
        max_world_size: int = 8,
        max_embedding_dim: int = 48,
    ):
        self.max_embedding_dim = max(max_embedding_dim, embedding_dim)
        self._fitting = False  # set while the embedding_dim slider is being refitted
        text = {"continuous_update": False}
        controls = {
            "shard_ranks": widgets.Text(value=shard_ranks, description="shard_ranks", **text),
            "widths": widgets.Text(value=widths, description="widths", placeholder="equal split", **text),
            "world_size": world_size_slider(world_size, max_world_size),
            "embedding_dim": widgets.IntSlider(
                value=embedding_dim, min=1, max=self.max_embedding_dim, description="embedding_dim", **text
            ),
        }
        self._fit_embedding_dim(controls)
        super().__init__(controls)

    def draw(self, shard_ranks: str, widths: str, world_size: int, embedding_dim: int) -> Figure:
        ranks = placement.check_shard_ranks(parse_ints(shard_ranks, "shard_ranks"), world_size)
        if widths.strip():
            shard_widths = placement.check_widths(parse_ints(widths, "widths"), embedding_dim, len(ranks))
        else:
            shard_widths = placement.equal_widths(embedding_dim, len(ranks))
        title = (
            f"shard_ranks {ranks} on {world_size} ranks, embedding_dim {embedding_dim}, "
            f"widths {shard_widths}: arrive as {placement.rank_order(ranks)}, "
            f"permute {placement.cw_permute_indices(ranks, world_size)}; cell = source column"
        )
        return column_order_figure(ranks, shard_widths, title=title)

    def _on_change(self, change: dict) -> None:
        if self._fitting:  # the refit's own value changes: one redraw follows it
            return
        if change["owner"] in (self.controls["shard_ranks"], self.controls["widths"]):
            self._fit_embedding_dim(self.controls)
        super()._on_change(change)

    def _fit_embedding_dim(self, controls: dict[str, widgets.ValueWidget]) -> None:
        """Offer only embedding_dims the shards can take; text that does not parse leaves the slider as it
        is (draw shows why)."""
        slider = controls["embedding_dim"]
        try:
            num_shards = len(parse_ints(controls["shard_ranks"].value, "shard_ranks"))
            widths = parse_ints(controls["widths"].value, "widths")
        except ValueError:
            return
        if num_shards == 0:
            return
        self._fitting = True
        try:
            if widths:  # the dependent value follows the widths
                total = max(sum(widths), 1)
                slider.min, slider.step, slider.max = 1, 1, max(self.max_embedding_dim, total)
                slider.value, slider.disabled = total, True
            else:
                top = max(num_shards, self.max_embedding_dim // num_shards * num_shards)
                nearest = min(max(num_shards, round(slider.value / num_shards) * num_shards), top)
                slider.min, slider.max = 1, top  # widen first: value, min and max stay consistent
                slider.value = nearest
                slider.min, slider.step, slider.disabled = num_shards, num_shards, False
        finally:
            self._fitting = False
