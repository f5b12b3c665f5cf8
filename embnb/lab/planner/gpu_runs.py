"""The UVM regime measured on a GPU: the GPU kit's committed runs of `python -m embnb.bench steptime
--hbm-gib GIB --device cuda` (notebook 03's plans at an HBM per device below the model's share, so
the planners put tables in UVM; FBGEMM runs those kernels only on a GPU), read back for notebook 03."""

from __future__ import annotations

import json
import pathlib

import pandas as pd

from embnb.lab.report import COMMITTED_RESULTS

__all__ = ["gpu_uvm_runs", "uvm_sentence"]

COLUMNS = ["machine", "file", "world_size", "hbm_cap_gb", "plan", "measured_ms", "rating_ms", "kernels"]
PLANNED = ("embnb DP", "torchrec DP", "Greedy", "torchrec default")  # the planners' plans, not the poor ones


def gpu_uvm_runs(results_dir: pathlib.Path = COMMITTED_RESULTS) -> pd.DataFrame:
    """Each planner's plan measured at a capped HBM on a GPU: its critical path (the slowest rank's
    step, synchronized wall time), torchrec's rating and the plan's compute kernels."""
    rows = []
    for path in sorted(pathlib.Path(results_dir).glob("steptime_capped-*.json")):
        payload = json.loads(path.read_text())
        if payload["device"] != "cuda":
            continue
        for world in payload["worlds"]:
            for plan in world["plans"]:
                if plan["plan"] in PLANNED and plan["measured"]:
                    kernels = ", ".join(f"{n} {k}" for k, n in (plan.get("kernels") or {}).items())
                    rows.append({"machine": payload["machine"], "file": path.name,
                                 "world_size": world["world_size"], "hbm_cap_gb": world["hbm_cap_gb"],
                                 "plan": plan["plan"], "measured_ms": plan["critical_path_s"] * 1e3,
                                 "rating_ms": plan["rating_s"] * 1e3, "kernels": kernels})  # fmt: skip
    return pd.DataFrame(rows, columns=COLUMNS)


def uvm_sentence(table: pd.DataFrame) -> str:
    """Per GPU run: embnb DP's measured critical path against torchrec's default plan's, beside the
    ratio torchrec's ratings of the two gave."""
    if table.empty:
        return "The UVM regime was not measured on a GPU (no steptime_capped results file here)"
    parts = []
    runs = table.groupby(["machine", "file", "world_size", "hbm_cap_gb"], sort=True)  # a file is one run
    for (machine, file, world_size, cap), run in runs:
        by_plan = run.set_index("plan")
        ours, theirs = by_plan.loc["embnb DP"], by_plan.loc["torchrec default"]
        fastest = by_plan.measured_ms.idxmin()
        parts.append(
            f"{machine} ({file}), W = {world_size}, {cap:g} GiB HBM per device: "
            f"embnb DP {ours.measured_ms:.2f} ms "
            f"against torchrec's default plan {theirs.measured_ms:.2f} ms "
            f"({theirs.measured_ms / ours.measured_ms:.2f}x; torchrec's ratings said "
            f"{theirs.rating_ms / ours.rating_ms:.2f}x), fastest of the planners' plans: {fastest}"
        )
    return "The UVM regime measured on a GPU (the GPU kit's committed runs): " + "; ".join(parts)
