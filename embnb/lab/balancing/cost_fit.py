"""Does a rank's time follow its work? Least squares of ms over GFLOPs and a constant per rank (`WORK`,
issue 70's check: where the constant is most of a rank's time, fixed costs bound the step, not the
work a balancer moves), or also over distinct lengths and tokens (`WORK_AND_LENGTHS`).
"""

from __future__ import annotations

import pathlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from embnb.results import load_runs

__all__ = ["RankTimeFit", "fit_rank_time", "rank_rows", "time_vs_work", "gpu_rank_rows"]

WORK = ("gflops", "per_rank")
WORK_AND_LENGTHS = ("gflops", "distinct_lengths", "tokens", "per_rank")  # SequenceDense: kernels per length
FIXED_SHARE_LIMIT = 0.10  # issue 70's acceptance check for a dense block: the fixed part at most 10%
GPU_COLUMNS = ["source", "machine", "file", "bench", "world_size", "method", "ms", "gflops"]


@dataclass(frozen=True)
class RankTimeFit:
    """ms per unit of each feature over `ranks` ranks; `r`: measured ms against GFLOPs; `fixed_share`:
    the constant over the mean measured ms."""

    features: list[str]
    coefficients: dict[str, float]
    ranks: int
    r: float
    fixed_share: float
    max_relative_residual: float

    def predict(self, row: Mapping[str, float]) -> float:
        return sum(c * row[f] for f, c in self.coefficients.items())


def fit_rank_time(rows: Sequence[Mapping[str, float]], features: Sequence[str] = WORK) -> RankTimeFit:
    """Least squares (minimum norm: columns may be collinear) of ms over `features`; "per_rank" is
    the constant 1. Raises ValueError on fewer than 2 rows."""
    if len(rows) < 2:
        raise ValueError(f"need at least 2 ranks to fit, got {len(rows)}")
    x = np.array([[1.0 if f == "per_rank" else float(r[f]) for f in features] for r in rows])
    y, gflops = (np.array([float(r[k]) for r in rows]) for k in ("ms", "gflops"))
    beta = np.linalg.lstsq(x, y, rcond=None)[0]
    r = float(np.corrcoef(gflops, y)[0, 1]) if gflops.std() > 0 and y.std() > 0 else 0.0
    coefficients = dict(zip(features, beta.tolist()))
    fixed_share = coefficients.get("per_rank", 0.0) / float(y.mean())
    residual = float((abs(y - x @ beta) / y).max())
    return RankTimeFit(list(features), coefficients, len(rows), r, fixed_share, residual)


def rank_rows(runs: Mapping[Any, Any]) -> list[dict[str, float]]:
    """One row per rank of every `measured.RankStep` in `runs`: its ms on its clock and its work."""
    return [
        {"ms": ms, "gflops": f / 1e9, "distinct_lengths": n, "tokens": t, "per_rank": 1.0}
        for step in runs.values()
        for ms, f, n, t in zip(step.ms, step.flops, step.distinct_lengths, step.tokens)
    ]


def time_vs_work(ranks: pd.DataFrame) -> pd.DataFrame:
    """Per source of `ranks` (rows of source, ms, gflops; one per measured rank): the `WORK` fit's
    fixed ms and ms per GFLOP, r, the fixed share of the mean rank, the achieved TFLOPS (all GFLOPs
    over all ms), and whether time follows work (fixed share at most `FIXED_SHARE_LIMIT`)."""
    rows = []
    for source, group in ranks.groupby("source", sort=False):
        fit = fit_rank_time(group.to_dict("records"), WORK)
        rows.append(
            {
                "source": source,
                "ranks": fit.ranks,
                "r": fit.r,
                "fixed_ms": fit.coefficients["per_rank"],
                "ms_per_gflop": fit.coefficients["gflops"],
                "fixed_share": fit.fixed_share,
                "tflops": group["gflops"].sum() / group["ms"].sum(),  # GFLOP per ms = TFLOP per s
                "time_follows_work": fit.fixed_share <= FIXED_SHARE_LIMIT,
            }
        )
    return pd.DataFrame(rows).set_index("source")


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
            measured = run.data["rank_by_rank"]
            width = measured["measured_config"]["width"]
            per_rank = [  # files before the interleaved rounds named each rank's ms by its clock
                (r["world_size"], r["method"], r["ms"] if "ms" in r else r[f"{r['clock']}_ms"], r["flops"])
                for r in measured["measured_runs"]
            ]
        else:
            width, worlds = run.data["worlds"][0]["width"], run.data["worlds"]
            per_rank = [
                (w["world_size"], r["method"], r["rank_ms_median"], r["rank_flops"])
                for w in worlds
                for r in w["runs"]
            ]
        source = f"{run.machine.removeprefix('NVIDIA ')} {run.date}, {run.benchmark}, width {width}"
        rows += [
            {"source": source, **where, "world_size": w, "method": method, "ms": m, "gflops": f / 1e9}
            for w, method, ms, flops in per_rank
            for m, f in zip(ms, flops)
        ]
    return pd.DataFrame(rows, columns=GPU_COLUMNS)
