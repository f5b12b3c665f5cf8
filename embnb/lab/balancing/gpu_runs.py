"""The GPU kit's committed runs of the balancer and HSTU benches (benchmarks/results), read back
for notebook 04a with the check any GPU figure must pass first: does a rank's time follow its work?

    gpu_speedups()   # KK + swaps over the loader's cut, a row per file, distribution and W
    gpu_time_vs_work()  # per file: ms = fixed + per-GFLOP x GFLOPs over every rank measured
"""

from __future__ import annotations

import json
import pathlib

import pandas as pd

from embnb.lab.balancing.cost_fit import WORK, fit_rank_time
from embnb.lab.report import COMMITTED_RESULTS

__all__ = ["gpu_speedups", "gpu_rank_rows", "gpu_time_vs_work", "FIXED_SHARE_LIMIT"]

METHOD = "kk_swap"  # the balancer's default: KK + swaps
# issue 70's acceptance check for a dense block: compare only where the fixed part is at most 10%
FIXED_SHARE_LIMIT = 0.10


def _gpu_files(results_dir: pathlib.Path) -> list[tuple[pathlib.Path, dict]]:
    files = sorted([*results_dir.glob("balancer-*.json"), *results_dir.glob("hstu-*.json")])
    payloads = [(path, json.loads(path.read_text())) for path in files]
    return [(p, d) for p, d in payloads if d.get("device") == "cuda"]


def gpu_rank_rows(results_dir: pathlib.Path = COMMITTED_RESULTS) -> pd.DataFrame:
    """Every rank of every partition the committed GPU runs measured: file, bench, W, method,
    its ms (median over repeats) and GFLOPs."""
    rows = []
    for path, payload in _gpu_files(results_dir):
        where = {"machine": payload["machine"], "file": path.name}
        if path.name.startswith("balancer-"):
            for run in payload["rank_by_rank"]["measured_runs"]:
                ms = run["wall_ms"] if run.get("clock") == "wall" else run["cpu_ms"]
                rows += [
                    {**where, "bench": "balancer", "world_size": run["world_size"], "method": run["method"],
                     "ms": m, "gflops": f / 1e9}
                    for m, f in zip(ms, run["flops"])
                ]  # fmt: skip
        else:
            for world in payload["worlds"]:
                for run in world["runs"]:
                    rows += [
                        {**where, "bench": "hstu", "world_size": world["world_size"], "method": run["method"],
                         "ms": m, "gflops": f / 1e9}
                        for m, f in zip(run["rank_ms_median"], run["rank_flops"])
                    ]  # fmt: skip
    return pd.DataFrame(rows, columns=["machine", "file", "bench", "world_size", "method", "ms", "gflops"])


def gpu_time_vs_work(results_dir: pathlib.Path = COMMITTED_RESULTS) -> pd.DataFrame:
    """Per committed GPU file, over every rank it measured: the fit ms = fixed + per-GFLOP x GFLOPs
    (`cost_fit.WORK`), the correlation r, the fixed share of the mean rank, the achieved TFLOPS of
    the mean rank, and whether time follows work (fixed share at most `FIXED_SHARE_LIMIT`)."""
    rows = []
    for (machine, name), ranks in gpu_rank_rows(results_dir).groupby(["machine", "file"], sort=True):
        fit = fit_rank_time(ranks.to_dict("records"), WORK)
        rows.append(
            {"machine": machine, "file": name, "ranks": fit.ranks, "r": fit.r,
             "fixed_ms": fit.coefficients["per_rank"], "ms_per_gflop": fit.coefficients["gflops"],
             "fixed_share": fit.fixed_share,
             "tflops": ranks["gflops"].mean() / ranks["ms"].mean(),  # GFLOP per ms = TFLOP per s
             "time_follows_work": fit.fixed_share <= FIXED_SHARE_LIMIT}
        )  # fmt: skip
    return pd.DataFrame(rows)


COLUMNS = ["machine", "file", "bench", "width", "distribution", "world_size", "measured", "flop_model"]


def gpu_speedups(results_dir: pathlib.Path = COMMITTED_RESULTS) -> pd.DataFrame:
    """KK + swaps over the loader's cut in each committed GPU run, beside the FLOP model's."""
    rows = []
    for path, payload in _gpu_files(results_dir):
        where = {"machine": payload["machine"], "file": path.name}
        if path.name.startswith("balancer-"):
            measured = payload["rank_by_rank"]
            width = measured["measured_config"]["width"]
            rows += [
                {**where, "bench": "balancer", "width": width} | {k: row[k] for k in COLUMNS[4:]}
                for row in measured["measured_speedups"]
                if row["method"] == METHOD
            ]
        else:
            for world in payload["worlds"]:
                run = next(r for r in world["runs"] if r["method"] == METHOD)
                rows.append(
                    {**where, "bench": "hstu", "width": world["width"], "distribution": "zipf",
                     "world_size": world["world_size"], "measured": run["speedup_vs_cut"]["median"],
                     "flop_model": run["flop_model_speedup"]}
                )  # fmt: skip
    return pd.DataFrame(rows, columns=COLUMNS)
