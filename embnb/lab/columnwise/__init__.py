"""Notebook 02's layer over `embnb.columnwise`; notebooks 02 and 02a import it as `lab` and call what they
use from here (each name loads only its module): `cases` (runs on real ranks, both paths, all-to-alls
recorded), `experiment` (the teaching run and the appendix's, as data), `traffic` (the byte count),
`torchrec_layouts` (what torchrec's planner and source do), `pooled`, `reference` (the page's core, checked),
`figures` (the column order, the lookup error), `widgets`.
"""

from __future__ import annotations

import importlib

_HOMES = {
    "embnb.dist": ["start_rank_server", "device_plan"],
    "embnb.lab.logs": ["quiet_torch_fx"],
    "embnb.lab.source": ["show_source"],
    "embnb.columnwise.placement": ["check_shard_ranks", "check_widths", "equal_widths", "column_offsets",
                                   "rank_order", "cw_permute_indices", "rank_ordered_shard_outputs",
                                   "concat_in_rank_order", "stitch_cw", "check_permute_answer"],
    "embnb.columnwise.torchrec_adapter": ["cw_sharding_plan"],
    f"{__name__}.experiment": ["SeedTable", "TrafficBatch", "run_seed", "run_appendix", "shard_table",
                               "permute_derivation"],
    f"{__name__}.torchrec_layouts": ["torchrec_version", "source_places", "UNEVEN_EC_STEPS",
                                     "POOLED_PERMUTE_STEPS"],
    f"{__name__}.reference": ["all_placements", "page_core_agrees"],
    f"{__name__}.figures": ["column_order_figure", "lookup_error_figure"],
    f"{__name__}.widgets": ["PlacementExplorer"],
}  # fmt: skip
_HOME_OF = {name: module for module, names in _HOMES.items() for name in names}
__all__ = sorted(_HOME_OF)


def __getattr__(name: str):
    if name not in _HOME_OF:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_HOME_OF[name]), name)


def __dir__() -> list[str]:
    return __all__
