"""ipywidgets controls that redraw the notebooks' figures.

Widgets only call the package functions the static figures use, so what a
reader sees while dragging a slider is what the tests check. Nothing here
needs a display: a builder returns an object holding the controls, the
Output they draw into and the last Figure, and `display(explorer)` shows it.

    explorer = load_explorer(["strided", "zipf"], ["roundrobin", "hash_roundrobin"])
    display(explorer)           # in a notebook
    explorer.world_size.value = 16   # redraws; explorer.figure is the new Figure
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import ipywidgets as widgets
import torch
from matplotlib.figure import Figure

from embnb.data import make_keys
from embnb.rowwise import aliasing, plots
from embnb.rowwise.routing import DistType

__all__ = ["LoadExplorer", "load_explorer"]


class LoadExplorer:
    """Per-rank load of one key pattern under one dist_type, redrawn on
    every change of its controls (attributes `pattern`, `dist_type`,
    `world_size`, `num_keys`; `output` holds the drawing, `figure` the last
    Figure, `widget` the whole box)."""

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
    ):
        if not patterns or not dist_types:
            raise ValueError("patterns and dist_types must not be empty")
        names = [DistType.parse(d).value for d in dist_types]
        self.seed = seed
        self.pattern_options = {k: dict(v) for k, v in (pattern_options or {}).items()}
        self.pattern = widgets.Dropdown(options=list(patterns), value=patterns[0], description="pattern")
        self.dist_type = widgets.ToggleButtons(options=names, value=names[-1], description="dist_type")
        self.world_size = widgets.IntSlider(
            value=world_size,
            min=1,
            max=max(max_world_size, world_size),
            description="world_size",
            continuous_update=False,
        )
        step = max(1, max_num_keys // 1000)
        self.num_keys = widgets.IntSlider(
            value=num_keys,
            min=step,
            max=max(max_num_keys, num_keys),
            step=step,
            description="num_keys",
            continuous_update=False,
        )
        self.output = widgets.Output()
        self.figure: Figure | None = None
        self._keys_cache: dict[tuple, torch.Tensor] = {}
        controls = [self.pattern, self.dist_type, self.world_size, self.num_keys]
        for control in controls:
            control.observe(self._on_change, names="value")
        self.widget = widgets.VBox([*controls, self.output])
        self.redraw()

    def _keys(self, pattern: str, num_keys: int, world_size: int) -> torch.Tensor:
        key = (pattern, num_keys, world_size)
        if key not in self._keys_cache:
            self._keys_cache = {  # keep one: toggling dist_type reuses it
                key: make_keys(
                    pattern, num_keys, world_size, self.seed, **self.pattern_options.get(pattern, {})
                )
            }
        return self._keys_cache[key]

    def _on_change(self, change: dict) -> None:
        self.redraw()

    def redraw(self) -> Figure:
        """Recompute the load for the current controls and draw it."""
        pattern, mode = self.pattern.value, self.dist_type.value
        world_size, num_keys = self.world_size.value, self.num_keys.value
        keys = self._keys(pattern, num_keys, world_size)
        counts = aliasing.rank_counts(keys, world_size, mode)
        hottest = aliasing.hottest_key_counts(keys, world_size, mode)
        self.figure = plots.rank_load_bars(
            {mode: counts},
            highlight={mode: hottest},
            title=f"{pattern}, {num_keys:,} keys, world_size={world_size}",
        )
        self.output.clear_output(wait=True)
        with self.output:
            from IPython.display import display

            display(self.figure)
        return self.figure

    def _repr_mimebundle_(self, **kwargs):
        return self.widget._repr_mimebundle_(**kwargs)


def load_explorer(
    patterns: Sequence[str],
    dist_types: Sequence[DistType | str],
    world_size: int = 8,
    num_keys: int = 100_000,
    seed: int = 0,
    pattern_options: Mapping[str, Mapping[str, Any]] | None = None,
    **limits: int,
) -> LoadExplorer:
    """A LoadExplorer drawn once; `limits`: max_world_size, max_num_keys."""
    return LoadExplorer(
        patterns, dist_types, world_size, num_keys, seed=seed, pattern_options=pattern_options, **limits
    )
