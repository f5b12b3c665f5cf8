"""Notebook 02's layer over `embnb.columnwise`: notebooks 02 and 02a import it as `lab` and call what they
use from here (`_HOMES`: each name loads only its module), what they use from the rest of embnb too.
"""

from __future__ import annotations

from embnb.lab.exports import lazy_exports

_HOMES = {
    "core": ["all_placements", "page_core_agrees"],
    "cases": ["CWCase"],
    "traffic": ["wire_bytes"],
    "experiment": ["run_seed", "error_panels", "run_appendix", "shard_table"],
    "figures": ["column_order_figure", "lookup_error_figure"],
    "explore": ["PlacementExplorer"],
    # what the pages use from the rest of embnb, under the same names
    "embnb.dist": ["start_rank_server", "device_plan"],
    "embnb.lab.logs": ["quiet_torch_fx"],
    "embnb.columnwise.placement": [
        "check_shard_ranks",
        "equal_widths",
        "column_offsets",
        "rank_order",
        "cw_permute_indices",
        "rank_ordered_shard_outputs",
        "concat_in_rank_order",
        "stitch_cw",
        "check_permute_answer",
    ],
}
__all__, __getattr__, __dir__ = lazy_exports(__name__, _HOMES)
