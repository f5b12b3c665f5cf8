"""Notebook 02's runs on real ranks, recorded as plain data (dataclasses; the results JSON is their `asdict`).

- `run_seed`: the teaching page's experiment: one placement with equal widths through torchrec's
  ShardedEmbeddingCollection (also with its permute switched off), embnb's lookup and its naive
  concatenation, each against the unsharded EmbeddingCollection;
- `run_appendix`: appendix 02a's: the byte count's layouts, uneven widths in embnb's path, torchrec's pooled
  CW path and, last, torchrec's own `column_wise(size_per_rank=...)` (it fails): one launch on CPU.

    seed = run_seed(SeedTable(2, 12, [0, 1, 0]), "cpu"); pd.DataFrame(seed.results.checks)
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import pandas as pd
import torch

from embnb.columnwise import placement as cw
from embnb.columnwise.torchrec_adapter import compute_kernel_for, fbgemm_cuda_problem
from embnb.dist import device_plan, launch_each
from embnb.lab.columnwise import torchrec_layouts as layouts
from embnb.lab.columnwise.cases import (
    CWCase,
    CWRun,
    TableSpec,
    make_batches,
    run_cw_cases,
    size_per_rank_call,
)
from embnb.lab.columnwise.pooled import PooledRun, pooled_on_rank
from embnb.lab.columnwise.traffic import PlannerBytes, planner_bytes_at, traffic_check_table, traffic_table

FEATURE = "f0"  # the experiment's one table "t0" serves one feature
PATH_TITLES = {
    "naive": "embnb: naive concatenation in rank order",
    "reference": "embnb reference (permuted)",
    "torchrec": "torchrec ShardedEmbeddingCollection",
    "torchrec_unpermuted": "torchrec, its permute switched off",
}


def shard_table(shard_ranks: Sequence[int], widths: Sequence[int]) -> pd.DataFrame:
    """One row per shard: its columns, its rank and where it arrives."""
    ranks = cw.check_shard_ranks(shard_ranks)
    widths = cw.check_widths(widths, sum(widths), len(ranks))
    columns = [f"{o}..{o + w - 1}" for o, w in zip(cw.column_offsets(widths), widths)]
    arrives = [cw.rank_order(ranks).index(s) for s in range(len(ranks))]
    data = {"columns": columns, "rank": ranks, "arrives at position": arrives}
    return pd.DataFrame(data, index=[f"s{s}" for s in range(len(ranks))])


def permute_derivation(shard_ranks: Sequence[int]) -> pd.DataFrame:
    """Each shard's permute index next to its two parts: shards on lower ranks, earlier ones on its own."""
    ranks = cw.check_shard_ranks(shard_ranks)
    data = {
        "rank": ranks,
        "shards on lower ranks": [sum(r < rank for r in ranks) for rank in ranks],
        "earlier shards, same rank": [ranks[:s].count(rank) for s, rank in enumerate(ranks)],
        "permute[s]": cw.cw_permute_indices(ranks),
    }
    return pd.DataFrame(data, index=[f"s{s}" for s in range(len(ranks))])


@dataclass(frozen=True)
class SeedTable:
    """The worked example's one table ("t0", feature "f0") and its batches, column-wise on `shard_ranks`."""

    world_size: int
    embedding_dim: int
    shard_ranks: Sequence[int]
    num_embeddings: int = 32
    batch_size: int = 4  # sequences per rank
    max_length: int = 3  # ids per sequence, at most
    seed: int = 0

    def case(self, ranks: Sequence[int], **options: Any) -> CWCase:
        table = (TableSpec("t0", self.num_embeddings, (FEATURE,)),)
        sizes = dict(batch_size=self.batch_size, max_length=self.max_length, seed=self.seed)
        return CWCase(self.world_size, self.embedding_dim, table, {"t0": list(ranks)}, **sizes, **options)


@dataclass(frozen=True)
class TrafficBatch:
    """The byte count's batches and tables."""

    batch_size: int = 64  # sequences per rank
    max_length: int = 100  # ids per sequence, at most (uniform from 0)
    num_embeddings: int = 1000  # rows of each traffic table
    teaching_dim: int = 48  # columns of the table the teaching layouts cut
    teaching_shards: tuple[int, ...] = (2, 4, 6, 12)  # equal shards dealt round-robin over the ranks
    planner_dims: tuple[int, ...] = (256, 512, 1024)  # tables torchrec's planner shards column-wise
    count_world_size: int = 8  # ranks of the count at the planner's layouts (counted: no ranks run)


@dataclass
class SeedResults:
    """The seed placement on real ranks, each path against the unsharded EmbeddingCollection."""

    world_size: int
    embedding_dim: int
    shard_ranks: list[int]
    widths: list[int]
    device: str
    backend: str
    compute_kernel: str  # torchrec's, where its path ran
    torchrec_device: str  # where torchrec's path ran: the CPU when fbgemm has no CUDA kernels
    torchrec_device_note: str | None  # why torchrec ran elsewhere than the plan's device
    torchrec_version: str
    rank_order: list[int]
    permute_indices: list[int]  # embnb's
    ids_per_rank: list[int]
    torchrec_skipped: str | None  # why torchrec did not run (embnb's check), or None
    torchrec_permute_indices: list[list[int]] | None  # per rank, as torchrec computed them
    checks: list[dict]  # per path that ran: equals_unsharded, max_abs_error
    run_seconds: float  # the launch, including process start

    def check(self, path: str) -> dict | None:
        return next((c for c in self.checks if c["path"] == path), None)


@dataclass
class SeedRun:
    run: CWRun
    results: SeedResults

    def error_panels(self) -> dict[str, torch.Tensor]:
        """|output - unsharded| per looked-up id of the wrong stitchings (the exact paths are all zeros)."""
        ran = [c["path"] for c in self.results.checks if c["path"] in ("naive", "torchrec_unpermuted")]
        return {PATH_TITLES[p]: self.run.abs_errors(p, FEATURE) for p in ran}


def _checks(run: CWRun, paths: Sequence[str]) -> list[dict]:
    return [
        {
            "path": p,
            "title": PATH_TITLES[p],
            "equals_unsharded": run.matches(p),
            "max_abs_error": run.max_abs_error(p),
        }
        for p in paths
    ]


def run_seed(table: SeedTable, device: str = "auto", timeout_s: float = 300.0) -> SeedRun:
    """`table` column-wise on its `shard_ranks` with equal widths on `world_size` real ranks: embnb's path
    and, unless torchrec cannot take the placement (then `torchrec_skipped` says why), torchrec's."""
    plan = device_plan(device, table.world_size)
    ranks = cw.check_shard_ranks(table.shard_ranks, table.world_size)
    cw.equal_widths(table.embedding_dim, len(ranks))  # refuse before building cases
    case = table.case(ranks)
    skipped = case.torchrec_problem()
    if skipped is not None:
        case = table.case(ranks, paths=("reference",))
    note = fbgemm_cuda_problem() if plan.device == "cuda" and skipped is None else None
    start = time.perf_counter()
    (run,) = run_cw_cases([case], "cpu" if note else device, timeout_s)
    seconds = time.perf_counter() - start
    torchrec_device = "cpu" if note else plan.device
    paths = ["naive", "reference"] + ([] if skipped else ["torchrec", "torchrec_unpermuted"])
    results = SeedResults(
        case.world_size,
        case.embedding_dim,
        ranks,
        case.shard_widths("t0"),
        plan.device,
        plan.backend,
        compute_kernel_for(torchrec_device),
        torchrec_device,
        note and f"torchrec's path ran on the CPU: {note}",
        layouts.torchrec_version(),
        cw.rank_order(ranks),
        cw.cw_permute_indices(ranks),
        [len(batch[FEATURE][1]) for batch in make_batches(case)],
        skipped,
        None if skipped else [r.torchrec_permute[FEATURE] for r in run.ranks],
        _checks(run, paths),
        round(seconds, 2),
    )
    return SeedRun(run, results)


@dataclass
class TrafficResults:
    """The bytes each path sent per layout (`traffic.traffic_table` rows) and the count at more ranks."""

    torchrec_min_cw_dim: int
    planner_layouts: list[layouts.PlannerLayout]  # torchrec planner's CW shards at world_size
    traffic_ids_per_rank: list[int]
    traffic: list[dict]
    traffic_counts_equal_model: list[bool]  # per layout: counted bytes == `traffic.wire_bytes`
    planner_bytes_at: PlannerBytes  # the count at count_world_size


@dataclass
class UnevenResults:
    """Uneven widths in embnb's path, and torchrec's `column_wise(size_per_rank=...)`."""

    uneven_widths: list[int]
    uneven_reference_matches_unsharded: bool
    uneven_naive_matches_unsharded: bool
    uneven_max_abs_error: float  # embnb's reference path
    embnb_uneven_check: str | None  # embnb's own check's verdict on these widths for torchrec
    torchrec_size_per_rank: list[int] | None
    torchrec_size_per_rank_outcomes: list[dict]  # per rank: `cases.TorchrecOutcome` as a dict
    torchrec_mixed_dims_error: str
    torchrec_uneven_places: dict[str, str]  # function -> its line in the installed torchrec


@dataclass
class AppendixRun:
    """Appendix 02a's runs and their numbers."""

    traffic_runs: list[CWRun]
    traffic_sources: list[str]  # per traffic run: "teaching" or "torchrec planner"
    traffic: TrafficResults
    uneven_run: CWRun
    uneven: UnevenResults
    pooled: PooledRun | None
    run_seconds: float  # the launches, including process start
    pooled_places: list[dict] = field(default_factory=list)  # where torchrec permutes the pooled output

    def traffic_table(self) -> pd.DataFrame:
        return traffic_table(self.traffic_runs, self.traffic_sources)

    def traffic_check_table(self) -> pd.DataFrame:
        return traffic_check_table(self.traffic_table(), self.traffic_runs[0].case.world_size)


def _traffic_cases(table: SeedTable, batch: TrafficBatch) -> tuple[list[CWCase], list[str], list]:
    """The byte count's cases: the teaching layouts (equal shards of `teaching_dim` columns dealt round-robin)
    and those torchrec's planner makes on `table.world_size` ranks; each's source; the planner's layouts."""
    w = table.world_size
    planned = [layouts.planner_cw_layout(d, batch.num_embeddings, w) for d in batch.planner_dims]
    for layout in planned:  # torchrec's planner cuts equal blocks; column_wise(ranks=...) makes the same
        if layout.widths != cw.equal_widths(layout.embedding_dim, len(layout.ranks)):
            raise ValueError(f"torchrec's planner made uneven widths {layout.widths}: not a case this runs")
    placements = [(batch.teaching_dim, [s % w for s in range(n)], "teaching") for n in batch.teaching_shards]
    placements += [(p.embedding_dim, p.ranks, "torchrec planner") for p in planned]
    sizes = dict(batch_size=batch.batch_size, max_length=batch.max_length, seed=table.seed)
    spec = (TableSpec("t0", batch.num_embeddings, (FEATURE,)),)
    cases = [CWCase(w, dim, spec, {"t0": ranks}, **sizes) for dim, ranks, _ in placements]
    for case in cases:
        if case.torchrec_problem():
            raise ValueError(case.torchrec_problem())  # before any rank starts
    return cases, [source for *_, source in placements], planned


def _traffic_results(runs: list[CWRun], sources: list[str], planned: list, batch: TrafficBatch):
    table = traffic_table(runs, sources)
    ids = [len(b[FEATURE][1]) for b in make_batches(runs[0].case)]  # every traffic run has these batches
    return TrafficResults(
        layouts.torchrec_min_cw_dim(),
        planned,
        ids,
        table.reset_index().to_dict(orient="records"),
        traffic_check_table(table, runs[0].case.world_size)["all equal"].tolist(),
        planner_bytes_at(
            batch.count_world_size,
            batch.planner_dims,
            batch.num_embeddings,
            round(sum(ids) / len(ids)),
            batch.batch_size,
        ),
    )


def run_appendix(
    table: SeedTable,
    uneven_widths: Sequence[int],
    device: str = "auto",
    traffic_batch: TrafficBatch | None = None,
    size_per_rank: Sequence[int] | None = None,
    timeout_s: float = 300.0,
) -> AppendixRun:
    """The byte count's layouts (both paths, traffic recorded), `table` with `uneven_widths` (embnb's path),
    torchrec's pooled path on `table.shard_ranks` and, with `size_per_rank`, torchrec's uneven column_wise
    plan, last (it breaks the process group): on CPU all in one launch of `world_size` ranks."""
    batch = traffic_batch or TrafficBatch()
    plan = device_plan(device, table.world_size)
    ranks = cw.check_shard_ranks(table.shard_ranks, table.world_size)
    uneven_case = table.case(ranks, paths=("reference",), widths={"t0": list(uneven_widths)})
    traffic_cases, sources, planned = _traffic_cases(table, batch)
    pooled_calls = [(pooled_on_rank, (list(ranks), table.embedding_dim, table.seed))]
    uneven_calls = []  # torchrec's own uneven plan: shard i on rank i
    if size_per_rank is not None:
        uneven_calls = [size_per_rank_call(table.case(range(len(size_per_rank))), size_per_rank)]
    extra, n = pooled_calls + uneven_calls, len(traffic_cases)

    def launch(calls: list, where: str) -> list:
        return launch_each(calls, table.world_size, device=where, timeout_s=timeout_s) if calls else []

    start = time.perf_counter()
    note = fbgemm_cuda_problem() if plan.device == "cuda" else None
    if plan.device == "cpu":  # one launch
        uneven_run, *rest = run_cw_cases([uneven_case, *traffic_cases], "cpu", timeout_s, extra)
        traffic_runs, tail = rest[:n], rest[n:]
    elif note is None:  # all on the GPUs but the pooled run (gloo, on the CPU)
        uneven_run, *traffic_runs = run_cw_cases([uneven_case, *traffic_cases], device, timeout_s)
        tail = launch(pooled_calls, "cpu") + launch(uneven_calls, device)
    else:  # torchrec's sharded modules cannot run on this GPU: they run on the CPU
        rest = run_cw_cases(traffic_cases, "cpu", timeout_s, extra)
        traffic_runs, tail = rest[:n], rest[n:]
        (uneven_run,) = run_cw_cases([uneven_case], device, timeout_s)
    seconds = time.perf_counter() - start
    pooled = PooledRun(list(ranks), table.world_size, table.embedding_dim, tail[0])
    outcomes = tail[-1] if uneven_calls else []
    uneven = UnevenResults(
        uneven_case.shard_widths("t0"),
        uneven_run.matches("reference"),
        uneven_run.matches("naive"),
        uneven_run.max_abs_error("reference"),
        table.case(ranks, widths={"t0": list(uneven_widths)}).torchrec_problem(),
        None if size_per_rank is None else list(size_per_rank),
        [asdict(o) for o in outcomes],
        layouts.mixed_dims_error(),
        {p.function: p.where for p in layouts.source_places(layouts.UNEVEN_EC_STEPS)},
    )
    traffic = _traffic_results(traffic_runs, sources, planned, batch)
    places = [asdict(p) for p in layouts.source_places(layouts.POOLED_PERMUTE_STEPS)]
    return AppendixRun(traffic_runs, sources, traffic, uneven_run, uneven, pooled, round(seconds, 2), places)
