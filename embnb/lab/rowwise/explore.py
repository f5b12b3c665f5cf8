"""Notebook 01's explorer: the per-rank load of one key stream under one routing mode, drawn by
`embnb.lab.plotting.rank_bars` from the same counts as the notebook's sweep."""

from __future__ import annotations

import functools
from collections.abc import Sequence

import ipywidgets as widgets
from matplotlib.figure import Figure

from embnb.lab.plotting import rank_bars
from embnb.lab.rowwise.aliasing import KeyStreams, hot_key_floor, hottest_key_counts, rank_counts
from embnb.lab.widgets import Explorer, world_size_slider
from embnb.rowwise.routing import DistType


class LoadExplorer(Explorer):
    """Keys per rank (bars) and the hottest key's share (black) of one of `streams` (as the notebook's
    sweep generates them) under one of `dist_types` (the last shown first), and the hot-key floor (red);
    `world_size` and `num_keys` start the sliders (which end at 64 ranks and 10**6 keys, or there)."""

    def __init__(
        self,
        streams: KeyStreams,
        dist_types: Sequence[DistType | str],
        world_size: int = 8,
        num_keys: int = 100_000,
    ):
        if not streams.patterns or not dist_types:
            raise ValueError("patterns and dist_types must not be empty")
        names = [DistType.parse(d).value for d in dist_types]
        self.streams, self._keys = streams, functools.lru_cache(maxsize=1)(streams.keys)  # one stream kept
        step, top = 1000, max(10**6, num_keys)
        super().__init__(
            {
                "pattern": widgets.Dropdown(options=list(streams.patterns), description="pattern"),
                "dist_type": widgets.ToggleButtons(options=names, value=names[-1], description="dist_type"),
                "world_size": world_size_slider(world_size, 64),
                "num_keys": widgets.IntSlider(
                    num_keys, min=step, max=top, step=step, description="num_keys", continuous_update=False
                ),
            }
        )

    def draw(self, pattern: str, dist_type: str, world_size: int, num_keys: int) -> Figure:
        keys, rows = self._keys(pattern, num_keys), self.streams.rows_for(pattern, dist_type)
        return rank_bars(
            {dist_type: rank_counts(keys, world_size, dist_type, table_rows=rows)},
            highlight={dist_type: hottest_key_counts(keys, world_size, dist_type, table_rows=rows)},
            floor=hot_key_floor(keys, world_size),
            ylabel="keys per rank",
            title=f"{pattern}, {num_keys:,} keys, world_size={world_size}, {dist_type}",
        )
