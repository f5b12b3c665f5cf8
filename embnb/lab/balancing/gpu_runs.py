"""The GPU kit's committed runs of the balancer and HSTU benches (`embnb.results.load_runs`), read
back for appendix 04a as one row per measured rank, for the check any GPU result must pass first:
does a rank's time follow its work (`cost_fit.time_vs_work`)?

    cost_fit.time_vs_work(gpu_rank_rows())   # a row per committed GPU file
"""

from __future__ import annotations

import pathlib

import pandas as pd

from embnb.results import load_runs

__all__ = ["gpu_rank_rows"]

COLUMNS = ["source", "machine", "file", "bench", "world_size", "method", "ms", "gflops"]


def gpu_rank_rows(results_dir: str | pathlib.Path | None = None) -> pd.DataFrame:
    """Every rank of every partition the committed GPU runs (device "cuda") measured: its source
    (the GPU, the bench and the model width), file, bench, W, method, ms (median over repeats; the
    run's clock) and GFLOPs. `results_dir`: None reads the committed results."""
    rows = []
    for run in [*load_runs("balancer", results_dir), *load_runs("hstu", results_dir)]:
        if run.data.get("device") != "cuda":
            continue
        where = {"machine": run.machine, "file": run.name, "bench": run.benchmark}
        if run.benchmark == "balancer":
            width = run.data["rank_by_rank"]["measured_config"]["width"]
            per_rank = [
                (
                    r["world_size"],
                    r["method"],
                    r["wall_ms" if r.get("clock") == "wall" else "cpu_ms"],
                    r["flops"],
                )
                for r in run.data["rank_by_rank"]["measured_runs"]
            ]
        else:
            width = run.data["worlds"][0]["width"]
            per_rank = [
                (world["world_size"], r["method"], r["rank_ms_median"], r["rank_flops"])
                for world in run.data["worlds"]
                for r in world["runs"]
            ]
        source = f"{run.machine.removeprefix('NVIDIA ')}, {run.benchmark}, width {width}"
        rows += [
            {"source": source, **where, "world_size": w, "method": method, "ms": m, "gflops": f / 1e9}
            for w, method, ms, flops in per_rank
            for m, f in zip(ms, flops)
        ]
    return pd.DataFrame(rows, columns=COLUMNS)
