"""The balancer bench's GPU runs committed in benchmarks/results (`python -m
embnb.bench balancer --device cuda`), read back for notebook 04 (none outside a checkout)."""

from __future__ import annotations

import json
import pathlib

import pandas as pd

from embnb.lab.balancing.measured import RECSYS_E2E
from embnb.lab.report import COMMITTED_RESULTS

METHOD = "kk_swap"  # the balancer's default: KK + swaps
COLUMNS = ["machine", "file", "width", "distribution", "world_size", "measured", "flop_model", "bound"]


def gpu_speedups(results_dir: pathlib.Path = COMMITTED_RESULTS) -> pd.DataFrame:
    """KK + swaps over the loader's cut on each GPU, a row per file, distribution and W."""
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


HSTU_COLUMNS = ["machine", "file", "world_size", "width", "cut_ms", "measured", "low", "high", "flop_model"]


def gpu_hstu(results_dir: pathlib.Path = COMMITTED_RESULTS) -> pd.DataFrame:
    """KK + swaps over the loader's cut at recsys-examples' shape (`python -m embnb.bench hstu
    --device cuda`, the GPU kit's runs), a row per GPU, W and width."""
    rows = []
    for path in sorted(results_dir.glob("hstu-*.json")):
        payload = json.loads(path.read_text())
        if payload.get("device") != "cuda":
            continue
        for world in payload["worlds"]:
            cut, run = world["runs"][0], next(r for r in world["runs"] if r["method"] == METHOD)
            ratio = run["speedup_vs_cut"]
            where = {"machine": payload["machine"], "file": path.name, "world_size": world["world_size"]}
            rows.append(where | {"width": world["width"], "cut_ms": cut["step_ms_median"],
                                 "measured": ratio["median"], "low": ratio["low"], "high": ratio["high"],
                                 "flop_model": run["flop_model_speedup"]})  # fmt: skip
    return pd.DataFrame(rows, columns=HSTU_COLUMNS)


def hstu_sentence(table: pd.DataFrame) -> str:
    """Per GPU and W, KK + swaps' measured speed-up at recsys-examples' shape beside the FLOP model's."""
    if table.empty:
        return "No GPU run of the HSTU bench is in benchmarks/results here"
    runs = [
        f"{r.machine} W={r.world_size} width {r.width}: {r.measured:.2f}x ({r.low:.2f}-{r.high:.2f}), "
        f"FLOP model {r.flop_model:.2f}x"
        for r in table.itertuples()
    ]
    return (
        "At recsys-examples' shape (HSTU-like, 8 layers, bf16, Zipf(1.2) lengths up to 4096, 32 samples "
        f"per rank), KK + swaps over the loader's cut: {'; '.join(runs)} (recsys-examples: "
        f"{RECSYS_E2E['speedup']}x end to end on 2 x 8 H100)"
    )


EXCHANGE_COLUMNS = ["machine", "file", "world_size", "exchange", "ms_median", "ms_low", "ms_high"]


def gpu_exchanges(results_dir: pathlib.Path = COMMITTED_RESULTS) -> pd.DataFrame:
    """Both exchanges as the committed GPU runs measured them (W ranks sharing one GPU: gloo
    through host memory, `embnb.dist`'s rule), a row per file, W and exchange."""
    rows = []
    for path in sorted(results_dir.glob("balancer-*.json")):
        payload = json.loads(path.read_text())
        if payload.get("device") != "cuda" or "exchanges" not in payload:
            continue
        for row in payload["exchanges"]["measured"]:
            rows.append(
                {"machine": payload["machine"], "file": path.name} | {k: row[k] for k in EXCHANGE_COLUMNS[2:]}
            )
    return pd.DataFrame(rows, columns=EXCHANGE_COLUMNS)


def exchange_sentence(here: list[dict], where: str, gpu: pd.DataFrame) -> str:
    """Per W of `here` (`ExchangeRuns.records()`): all-to-all against all-gather (medians)
    and which was faster, here and on each GPU."""

    def compare(rows: list[dict]) -> str:
        ms = {r["exchange"]: r["ms_median"] for r in rows}
        faster = "faster" if ms["alltoall"] < ms["allgather"] else "slower"
        return f"all-to-all {ms['alltoall']:.1f} ms against all-gather {ms['allgather']:.1f} ms ({faster})"

    parts = []
    for w in sorted({r["world_size"] for r in here}):
        on = [f"{where}: {compare([r for r in here if r['world_size'] == w])}"]
        for machine, group in gpu[gpu["world_size"] == w].groupby("machine", sort=True):
            on.append(f"{machine}: {compare(group.to_dict('records'))}")
        parts.append(f"W={w}, " + "; ".join(on))
    return "Exchange medians, " + " | ".join(parts)
