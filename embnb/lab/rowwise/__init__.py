"""Notebook 01's layer over `embnb.rowwise`: notebooks 01 and 01a import it as `lab` and call what they
use from here (`_HOMES`: each name loads only its module), what they use from the rest of embnb too.
"""

from __future__ import annotations

from embnb.lab.exports import lazy_exports

_HOMES = {
    "core": ["page_core_agrees"],
    "aliasing": [
        "KeyStreams",
        "block_size_for",
        "worked_example",
        "load_table",
        "hash_noise",
        "balls_into_bins",
        "zipf_over_seeds",
        "sign_test",
        "COUNTED",
        "pipeline_table",
        "out_of_range_lookup",
    ],
    "kv_experiment": ["make_batches", "run_kv_lookups", "reload", "DYNAMICEMB_LOADER", "mismatch_message"],
    "kernel_timing": ["KernelCases"],
    "routed_loads": [
        "ROUTINGS",
        "LoadsConfig",
        "measure_loads",
        "case_table",
        "rank_spread",
        "step_verdicts",
    ],
    "job": ["TrainConfig", "shard_model", "train_rank", "training_rows"],
    "figures": ["load_heatmap", "zipf_seeds_figure", "routed_loads_figure"],
    "explore": ["LoadExplorer"],
    # what the pages use from the rest of embnb, under the same names
    "embnb.data": ["make_keys"],
    "embnb.dist": ["start_rank_server", "launch_each", "device_plan"],
    "embnb.lab.logs": ["quiet_torch_fx"],
    "embnb.lab.source": ["show_source"],
    "embnb.timing": ["machine_name"],
}
__all__, __getattr__, __dir__ = lazy_exports(__name__, _HOMES)
