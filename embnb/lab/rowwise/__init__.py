"""Notebook 01's layer over `embnb.rowwise`; notebooks 01 and 01a import it as `lab` and call what
they use from here (each name loads only its module): `reference` (the routing rule in plain ints),
`aliasing` and `hot_keys` (keys per rank under each mode), `table_ids` (ids into a table first),
`kv_experiment` (the sharded KV table on real ranks, its checkpoint and dynamicemb's loader as
embnb replays it), `kernel_timing` (bucketize against FBGEMM), `routed_loads` (torchrec row-wise
tables replayed rank by rank), `job` (the torchrec call a training job writes, run on gloo ranks),
`figures` and `widgets`; and, under their own names, what the pages use from the rest of embnb.
"""

from __future__ import annotations

from embnb.lab.exports import lazy_exports

_HOMES = {
    "reference": ["MASK64", "fmix64", "owner_of", "jump_bucket", "page_core_agrees"],
    "aliasing": ["KeyStreams", "into_table", "block_size_for", "owners", "rank_counts", "hot_key_floor",
                 "worked_example", "load_table", "hash_noise", "balls_into_bins", "zipf_over_seeds",
                 "sign_test", "hottest_key_counts", "make_batches"],
    "hot_keys": ["COUNTED", "counted_placement", "alpha_sweep", "floor_findings"],
    "table_ids": ["out_of_range_lookup", "pipeline_table"],
    "kv_experiment": ["run_kv_lookups", "reshard", "DYNAMICEMB_LOADER", "DYNAMICEMB_COMMIT",
                      "dynamicemb_keys_loaded", "compare_loaders", "mismatch_message"],
    "kernel_timing": ["KernelCases", "fbgemm_ratios"],
    "routed_loads": ["CASES", "ROUTINGS", "LoadsConfig", "case_ids", "measure_loads", "summary_rows",
                     "rank_spread", "step_verdicts"],
    "job": ["TrainConfig", "shard_model", "train_rank", "training_rows"],
    "figures": ["load_heatmap", "zipf_seeds_figure", "dist_type_bars", "routed_loads_figure"],
    "widgets": ["LoadExplorer"],
    # what the pages use from the rest of embnb, under the same names
    "embnb.data": ["make_keys", "zipf_probs"],
    "embnb.dist": ["start_rank_server", "launch_each", "device_plan"],
    "embnb.lab.logs": ["quiet_torch_fx"],
    "embnb.lab.source": ["show_source"],
    "embnb.rowwise": ["checkpoint", "kv"],
}  # fmt: skip
__all__, __getattr__, __dir__ = lazy_exports(__name__, _HOMES)
