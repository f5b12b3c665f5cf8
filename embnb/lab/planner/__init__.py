"""Notebook 03's layer over `embnb.planner`: notebooks 03 and 03a import it as `lab` and call what they
use from here (`_HOMES`: each name loads only its module).
"""

from __future__ import annotations

from embnb.lab.exports import lazy_exports

_HOMES = {
    "models": ["Model", "make_model", "fused_table_gb", "Enumerated", "enumerate_options", "hosts_of"],
    "core": [
        "knapsack_choices",
        "backtrack",
        "least_perf_by_enumeration",
        "page_core_agrees",
        "capped_runs_agree",
    ],
    "explain": [
        "options_table",
        "SmallKnapsack",
        "small_knapsack",
        "memory_ratio",
        "knapsack_frontier",
        "PlanExtremes",
        "plan_extremes",
        "TINY_LIMITS",
        "SMALL_LIMITS",
        "tiny_instance",
        "summed_vs_rated",
        "share_by_tightness",
    ],
    "brute_force": ["PlanRater", "brute_force_rating", "rate_every_plan", "option_label"],
    "quality": ["random_instance", "quality_study", "quality_summary"],
    "planning": [
        "PlanRun",
        "run_planner",
        "EndToEnd",
        "time_end_to_end",
        "rank_loads",
        "records",
        "plain",
        "quiet_logs",
    ],
    "comparison": ["Planning", "default_proposers", "compare_proposers", "timing_breakdown", "budget_sweep"],
    "ablation": ["LADDER", "ablation_table"],
    "candidates": [
        "PLANNERS",
        "POOR",
        "candidate_plans",
        "plan_shape",
        "MeasuredCandidates",
        "measure_candidates",
    ],
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
        "option_code",
        "knapsack_choices_figure",
        "proposer_comparison",
        "planned_title",
        "measured_figure",
        "calibration_scatter",
    ],
    "explore": ["ExplorerStart", "PlannerExplorer"],
}
__all__, __getattr__, __dir__ = lazy_exports(__name__, _HOMES)
