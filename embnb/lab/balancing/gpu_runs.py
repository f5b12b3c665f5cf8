"""What the balancer bench measured rank by rank on GPUs: the GPU kit's
results files committed in benchmarks/results (`python -m embnb.bench
balancer --device cuda`), read back so that notebook 04 prints them beside
its own CPU measurements. Outside a checkout (an installed wheel) there are
none, and the table is empty."""

from __future__ import annotations

import json
import pathlib

import pandas as pd

import embnb

RESULTS_DIR = pathlib.Path(embnb.__file__).resolve().parent.parent / "benchmarks" / "results"
METHOD = "kk_swap"  # the balancer's default: KK + swaps
COLUMNS = ["machine", "file", "width", "distribution", "world_size", "measured", "flop_model", "bound"]


def gpu_speedups(results_dir: pathlib.Path = RESULTS_DIR) -> pd.DataFrame:
    """KK + swaps over the loader's cut, measured rank by rank on each GPU
    (one row per file, distribution and W), with the FLOP model's prediction
    and its bound."""
    rows = []
    for path in sorted(results_dir.glob("balancer-*.json")):
        payload = json.loads(path.read_text())
        measured = payload.get("rank_by_rank") or {}
        config = measured.get("measured_config") or {}
        if config.get("device") != "cuda":
            continue
        for row in measured["measured_speedups"]:
            if row["method"] == METHOD:
                rows.append({"machine": payload["machine"], "file": path.name, "width": config["width"]}
                            | {k: row[k] for k in COLUMNS[3:]})  # fmt: skip
    return pd.DataFrame(rows, columns=COLUMNS)


def gpu_sentence(table: pd.DataFrame) -> str:
    """One sentence per the table: each GPU's measured range, the FLOP model's largest prediction."""
    if table.empty:
        return "No GPU run of the balancer bench is in benchmarks/results here"
    runs = []
    for machine, group in table.groupby("machine", sort=True):
        low, high = group["measured"].min(), group["measured"].max()
        runs.append(f"{machine} (width {group['width'].iloc[0]}) {low:.2f}x-{high:.2f}x")
    return (
        f"On GPUs, measured rank by rank (the GPU kit's committed runs), KK + swaps over the loader's cut: "
        f"{'; '.join(runs)}, where the FLOP model predicted up to {table['flop_model'].max():.2f}x"
    )
