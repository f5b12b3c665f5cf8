"""Notebook 02's runs on real ranks and its teaching tables, as plain data (dicts and DataFrames; the
results JSON is made of them): `run_seed` for the teaching page, `run_appendix` for appendix 02a.

    results, run = run_seed(CWCase(2, 12, [0, 1, 0]), "cpu"); pd.DataFrame(results["checks"])
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict, replace
from importlib.metadata import version

import pandas as pd
import torch

from embnb.columnwise import placement as cw
from embnb.columnwise.torchrec_adapter import fbgemm_cuda_problem
from embnb.dist import device_plan
from embnb.lab.columnwise.cases import (
    CWCase,
    CWRun,
    make_batches,
    pooled_on_rank,
    run_cw_cases,
    size_per_rank_call,
)
from embnb.lab.columnwise.traffic import mixed_dims_error, planner_bytes_at, planner_cw_layout, traffic_table

PATH_TITLES = {
    "naive": "embnb: naive concatenation in rank order",
    "reference": "embnb reference (permuted)",
    "torchrec": "torchrec ShardedEmbeddingCollection",
    "torchrec_unpermuted": "torchrec, its permute switched off",
}


def shard_table(shard_ranks: Sequence[int], widths: Sequence[int]) -> pd.DataFrame:
    """One row per shard: its columns, its rank, and its permute index (where it arrives among the
    rank-ordered outputs) next to its two parts: shards on lower ranks, earlier ones on its own."""
    ranks = cw.check_shard_ranks(shard_ranks)
    widths = cw.check_widths(widths, sum(widths), len(ranks))
    data = {
        "columns": [f"{o}..{o + w - 1}" for o, w in zip(cw.column_offsets(widths), widths)],
        "rank": ranks,
        "shards on lower ranks": [sum(r < rank for r in ranks) for rank in ranks],
        "earlier shards, same rank": [ranks[:s].count(rank) for s, rank in enumerate(ranks)],
        "permute[s]": cw.cw_permute_indices(ranks),
    }
    return pd.DataFrame(data, index=[f"s{s}" for s in range(len(ranks))])


def run_seed(case: CWCase, device: str = "auto", timeout_s: float = 300.0) -> tuple[dict, CWRun]:
    """`case` (equal widths) on `world_size` real ranks: embnb's path and, unless torchrec cannot take the
    placement (then `torchrec_skipped` says why), torchrec's; where fbgemm has no CUDA kernels, torchrec's
    path runs on the CPU (`torchrec_device_note` says why). Returns the results as plain data (the
    widths, device, backend, torchrec's kernel and version, rank order, embnb's and torchrec's permute,
    ids per rank, and per path that ran whether it equals the unsharded EC and its max |error|) and the
    run itself (its tensors)."""
    plan = device_plan(device, case.world_size)
    skipped = case.torchrec_problem()
    if skipped is not None:
        case = replace(case, paths=("reference",))
    note = fbgemm_cuda_problem() if plan.device == "cuda" and skipped is None else None
    start = time.perf_counter()
    (run,) = run_cw_cases([case], "cpu" if note else device, timeout_s)
    ranks, torchrec_device = list(case.shard_ranks), "cpu" if note else plan.device
    paths = ["naive", "reference"] + ([] if skipped else ["torchrec", "torchrec_unpermuted"])
    checks = [
        dict(
            path=p, title=PATH_TITLES[p], equals_unsharded=run.matches(p), max_abs_error=run.max_abs_error(p)
        )
        for p in paths
    ]
    kernels = None if skipped else ", ".join(sorted({k for r in run.ranks for k in r.compute_kernels}))
    return {
        "widths": case.shard_widths(),
        "device": plan.device,
        "backend": plan.backend,
        "compute_kernel": kernels,  # what torchrec's sharded module built on the ranks, where its path ran
        "torchrec_device": torchrec_device,
        "torchrec_device_note": note and f"torchrec's path ran on the CPU: {note}",
        "torchrec_version": version("torchrec"),
        "rank_order": cw.rank_order(ranks),
        "permute_indices": cw.cw_permute_indices(ranks),  # embnb's
        "ids_per_rank": [len(ids) for _, ids in make_batches(case)],
        "torchrec_skipped": skipped,
        "torchrec_permute_indices": None if skipped else [r.torchrec_permute for r in run.ranks],
        "checks": checks,
        "run_seconds": round(time.perf_counter() - start, 2),  # the launch, including process start
    }, run


def error_panels(results: dict, run: CWRun) -> dict[str, torch.Tensor]:
    """|output - unsharded| per looked-up id of the wrong stitchings that ran (the exact paths are zeros)."""
    ran = [c["path"] for c in results["checks"] if c["path"] in ("naive", "torchrec_unpermuted")]
    return {PATH_TITLES[p]: run.abs_errors(p) for p in ran}


def run_appendix(
    case: CWCase,
    uneven_widths: Sequence[int],
    traffic_case: CWCase,
    teaching_shards: Sequence[int],
    planner_dims: Sequence[int],
    count_world_size: int,
    size_per_rank: Sequence[int],
    timeout_s: float = 300.0,
) -> tuple[dict, pd.DataFrame]:
    """Appendix 02a's runs in one launch of `case.world_size` CPU gloo ranks: the byte count (both paths,
    traffic recorded) on `traffic_case`'s batches at the teaching layouts (`teaching_shards` equal shards
    of `traffic_case.embedding_dim` columns dealt round-robin) and at the layouts torchrec's planner makes
    of tables `planner_dims` wide; `case` with `uneven_widths` (embnb's path); torchrec's pooled path on
    `case.shard_ranks`; and torchrec's column_wise plan of `size_per_rank` columns a rank, last (it breaks
    the process group). Returns the results as plain data and the byte count's `traffic_table`."""
    from torchrec.distributed.planner.constants import MIN_CW_DIM

    w, ranks = case.world_size, cw.check_shard_ranks(case.shard_ranks, case.world_size)
    uneven = replace(case, widths=list(uneven_widths), paths=("reference",))
    planned = [planner_cw_layout(d, traffic_case.num_embeddings, w) for d in planner_dims]
    for layout in planned:  # torchrec's planner cuts equal blocks; column_wise(ranks=...) makes the same
        if layout.widths != cw.equal_widths(layout.embedding_dim, len(layout.ranks)):
            raise ValueError(f"torchrec's planner made uneven widths {layout.widths}: not a case this runs")
    dim = traffic_case.embedding_dim
    placements = [(dim, [s % w for s in range(n)], "teaching") for n in teaching_shards]
    placements += [(p.embedding_dim, p.ranks, "torchrec planner") for p in planned]
    traffic_cases = [replace(traffic_case, embedding_dim=d, shard_ranks=r) for d, r, _ in placements]
    calls = [(pooled_on_rank, (case,)), size_per_rank_call(case, size_per_rank)]
    start = time.perf_counter()
    uneven_run, *runs = run_cw_cases([uneven, *traffic_cases], "cpu", timeout_s, calls)
    seconds = time.perf_counter() - start
    traffic_runs, pooled = runs[: len(traffic_cases)], runs[len(traffic_cases)]
    table = traffic_table(traffic_runs, [source for *_, source in placements])
    ids = [len(b[1]) for b in make_batches(traffic_case)]
    mean_ids = round(sum(ids) / len(ids))
    return {
        "torchrec_version": version("torchrec"),
        "torchrec_min_cw_dim": MIN_CW_DIM,
        "planner_layouts": [asdict(p) for p in planned],  # torchrec planner's CW shards at world_size
        "traffic_ids_per_rank": ids,
        "traffic": table.reset_index().to_dict("records"),
        "planner_bytes_at": planner_bytes_at(
            count_world_size, planner_dims, traffic_case.num_embeddings, mean_ids, traffic_case.batch_size
        ),
        "uneven_reference_matches_unsharded": uneven_run.matches("reference"),
        "uneven_naive_matches_unsharded": uneven_run.matches("naive"),
        "uneven_max_abs_error": uneven_run.max_abs_error("reference"),
        "embnb_uneven_check": uneven.torchrec_problem(),  # embnb's own check, before torchrec
        "torchrec_size_per_rank_outcomes": [asdict(o) for o in runs[-1]],
        "torchrec_mixed_dims_error": mixed_dims_error(),
        "pooled": {
            "shard_ranks": ranks,
            "max_abs_error": pooled,  # per rank: its pooled output against the unsharded module's
            "matches": max(pooled) <= 1e-6,  # equal up to float rounding
        },
        "run_seconds": round(seconds, 2),  # the launch, including process start
    }, table
