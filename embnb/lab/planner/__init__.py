"""Notebook 03's layer over `embnb.planner`: notebooks 03 and 03a import it as `lab` and call what they
use from here (`_HOMES`: each name loads only its module); the benches and tests import the modules.
"""

from __future__ import annotations

from embnb.lab.exports import lazy_exports

_HOMES = {
    "models": ["make_model", "fused_table_gb", "enumerate_options"],
    "core": ["least_perf_by_enumeration", "page_core_agrees", "capped_runs_agree"],
    "explain": [
        "small_knapsack",
        "memory_ratio",
        "knapsack_frontier",
        "plan_extremes",
        "SMALL_LIMITS",
        "tiny_instance",
        "summed_vs_rated",
        "share_by_tightness",
        "rate_every_plan",
    ],
    "planning": ["time_end_to_end", "rank_loads", "records", "plain", "quiet_logs"],
    "comparison": [
        "Planning",
        "default_proposers",
        "compare_proposers",
        "timing_breakdown",
        "budget_sweep",
        "quality_study",
        "quality_summary",
        "ablation_table",
    ],
    "candidates": ["measure_candidates"],
    "calibrated": [
        "GOAL",
        "load_calibration_bench",
        "heldout_ranks",
        "heldout_errors",
        "measured_plans",
        "calibration_record",
        "gpu_uvm_runs",
        "load_gpu_refit",
        "gpu_refit_record",
    ],
    "figures": [
        "knapsack_choices_figure",
        "proposer_comparison",
        "planned_title",
        "measured_figure",
        "calibration_scatter",
    ],
    "explore": ["ExplorerStart", "PlannerExplorer"],
}
__all__, __getattr__, __dir__ = lazy_exports(__name__, _HOMES)
