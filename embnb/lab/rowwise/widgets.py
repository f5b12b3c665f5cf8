"""Notebook 01's explorer: the per-rank load of one key stream under one
routing mode, redrawn by the same functions as the notebook's static bars.

    explorer = LoadExplorer(["strided", "zipf"], ["roundrobin", "hash_roundrobin"])
    display(explorer)                              # in a notebook
    explorer.controls["world_size"].value = 16     # redraws
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import ipywidgets as widgets
import torch
from matplotlib.figure import Figure

from embnb.data import make_keys
from embnb.lab.rowwise import aliasing
from embnb.lab.rowwise.plots import dist_type_bars
from embnb.lab.widgets import Explorer, world_size_slider
from embnb.rowwise.routing import DistType

__all__ = ["LoadExplorer"]


class LoadExplorer(Explorer):
    """Keys per rank (bars) and the hottest key's share (black) of one key
    stream under one dist_type; redrawn on every change of a control.

    Args:
        patterns: key streams of `embnb.data.PATTERNS` to offer.
        dist_types: routing modes to offer; the last one is shown first.
        world_size, num_keys: the starting values.
        max_world_size, max_num_keys: the sliders' ends.
        seed: the key generators' seed.
        pattern_options: extra generator arguments per pattern (zipf's alpha).
        table_rows: rows of the table per pattern for `continuous`, the ids
            mapped into it first (default: sized to the stream's largest
            key), as in `aliasing.load_table`.
    """

    def __init__(
        self,
        patterns: Sequence[str],
        dist_types: Sequence[DistType | str],
        world_size: int = 8,
        num_keys: int = 100_000,
        max_world_size: int = 64,
        max_num_keys: int = 1_000_000,
        seed: int = 0,
        pattern_options: Mapping[str, Mapping[str, Any]] | None = None,
        table_rows: Mapping[str, int] | None = None,
    ):
        if not patterns or not dist_types:
            raise ValueError("patterns and dist_types must not be empty")
        names = [DistType.parse(d).value for d in dist_types]
        self.seed = seed
        self.pattern_options = {k: dict(v) for k, v in (pattern_options or {}).items()}
        self.table_rows = dict(table_rows or {})
        self._keys_cache: dict[tuple, torch.Tensor] = {}
        step = max(1, max_num_keys // 1000)
        super().__init__(
            {
                "pattern": widgets.Dropdown(options=list(patterns), value=patterns[0], description="pattern"),
                "dist_type": widgets.ToggleButtons(options=names, value=names[-1], description="dist_type"),
                "world_size": world_size_slider(world_size, max_world_size),
                "num_keys": widgets.IntSlider(
                    value=num_keys,
                    min=step,
                    max=max(max_num_keys, num_keys),
                    step=step,
                    description="num_keys",
                    continuous_update=False,
                ),
            }
        )

    def _keys(self, pattern: str, num_keys: int) -> torch.Tensor:
        key = (pattern, num_keys)
        if key not in self._keys_cache:
            options = self.pattern_options.get(pattern, {})
            # Keep one stream: toggling dist_type or world_size reuses it.
            self._keys_cache = {key: make_keys(pattern, num_keys, self.seed, **options)}
        return self._keys_cache[key]

    def draw(self, pattern: str, dist_type: str, world_size: int, num_keys: int) -> Figure:
        keys = self._keys(pattern, num_keys)
        # continuous: the ids go into the pattern's table first (aliasing.into_table)
        table_rows = (
            self.table_rows.get(pattern) if DistType.parse(dist_type) is DistType.CONTINUOUS else None
        )
        counts = aliasing.rank_counts(keys, world_size, dist_type, table_rows=table_rows)
        hottest = aliasing.hottest_key_counts(keys, world_size, dist_type, table_rows=table_rows)
        return dist_type_bars(
            {dist_type: counts},
            highlight={dist_type: hottest},
            floor=aliasing.hot_key_floor(keys, world_size),
            ylabel="keys per rank",
            title=f"{pattern}, {num_keys:,} keys, world_size={world_size}, {dist_type}",
        )
