"""Notebook 02's experiment: one placement on real ranks through embnb's CW lookup and torchrec's
ShardedEmbeddingCollection (also with its permute switched off), the same placement with uneven widths
(embnb's path), layouts whose all-to-all bytes are recorded on a batch of realistic size, torchrec's
pooled CW path and, last, torchrec's own `column_wise(size_per_rank=...)` (it fails), in one launch on CPU.
Its numbers are gathered per section in dataclasses; the results JSON is their `asdict`.

    experiment = run_placement_experiment(SeedTable(2, 12, [0, 1, 0], [2, 7, 3]), "cpu", TrafficBatch())
    experiment.checks_table(); experiment.results(notebook_seconds=12.3)
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import pandas as pd
import torch

from embnb.columnwise import placement as cw
from embnb.columnwise.torchrec_adapter import compute_kernel_for, fbgemm_cuda_problem
from embnb.dist import DevicePlan, device_plan, launch_each
from embnb.lab.columnwise import torchrec_layouts as layouts
from embnb.lab.columnwise.cases import (
    CWCase,
    CWRun,
    TableSpec,
    TorchrecOutcome,
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
    """The worked example's one table ("t0", feature "f0") and its batches: column-wise on `shard_ranks`
    with equal widths, and with `uneven_widths`."""

    world_size: int
    embedding_dim: int
    shard_ranks: Sequence[int]
    uneven_widths: Sequence[int]
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
    """The byte count's batches and tables: realistic sizes (thousands of ids per rank)."""

    batch_size: int = 64  # sequences per rank
    max_length: int = 100  # ids per sequence, at most (uniform from 0)
    num_embeddings: int = 1000  # rows of each traffic table
    teaching_dim: int = 48  # columns of the table the teaching layouts cut
    teaching_shards: tuple[int, ...] = (2, 4, 6, 12)  # equal shards dealt round-robin over the ranks
    planner_dims: tuple[int, ...] = (256, 512, 1024)  # tables torchrec's planner shards column-wise
    count_world_size: int = 8  # ranks of the count at the planner's layouts (counted: no ranks run)


@dataclass
class SeedResults:
    """Section 3: the seed placement on real ranks, each path against the unsharded EmbeddingCollection."""

    world_size: int
    embedding_dim: int
    shard_ranks: list[int]
    widths: list[int]
    device: str
    backend: str
    compute_kernel: str  # torchrec's, where its path ran
    torchrec_device: str  # where torchrec's path ran: the CPU when fbgemm has no CUDA kernels
    torchrec_device_note: str | None  # why torchrec ran elsewhere than the plan's device
    rank_order: list[int]
    permute_indices: list[int]
    ids_per_rank: list[int]
    naive_matches_unsharded: bool
    naive_max_abs_error: float
    reference_matches_unsharded: bool
    torchrec_skipped: str | None  # why torchrec did not run (embnb's check), or None
    torchrec_permute_indices: list[list[int]] | None = None  # per rank
    torchrec_permute_matches: bool | None = None
    torchrec_matches_unsharded: bool | None = None
    torchrec_unpermuted_matches_unsharded: bool | None = None  # torchrec with its permute switched off
    torchrec_unpermuted_max_abs_error: float | None = None


@dataclass
class TrafficResults:
    """Section 4: the bytes each path sent per layout (`traffic.traffic_table` rows)."""

    torchrec_min_cw_dim: int
    planner_layouts: list[layouts.PlannerLayout]  # torchrec planner's CW shards at world_size
    traffic_ids_per_rank: list[int]
    traffic: list[dict]
    traffic_counts_equal_model: list[bool]  # per layout: counted bytes == `traffic.wire_bytes`
    planner_bytes_at: PlannerBytes | None  # the count at count_world_size


@dataclass
class UnevenResults:
    """Section 5: uneven widths in embnb's path, and torchrec's `column_wise(size_per_rank=...)`."""

    uneven_widths: list[int]
    uneven_reference_matches_unsharded: bool
    uneven_naive_matches_unsharded: bool
    embnb_uneven_check: str | None  # embnb's own check's verdict on these widths for torchrec
    torchrec_size_per_rank: list[int] | None
    torchrec_size_per_rank_outcomes: list[str] | None  # per rank, `TorchrecOutcome.describe`
    torchrec_size_per_rank_widths: list[dict]  # per rank: columns held, torchrec's local width
    torchrec_mixed_dims_error: str
    torchrec_uneven_places: dict[str, str]  # function -> its line in the installed torchrec


@dataclass
class PlacementExperiment:
    """The runs of `run_placement_experiment` and their numbers, per section."""

    seed_run: CWRun
    uneven_run: CWRun
    traffic_runs: list[CWRun]
    traffic_sources: list[str]  # per traffic run: "teaching" or "torchrec planner"
    seed: SeedResults
    traffic: TrafficResults
    uneven: UnevenResults
    torchrec_uneven: list[TorchrecOutcome] | None
    pooled: PooledRun | None
    run_seconds: float  # the launches, including process start

    def _paths(self, *paths: str) -> dict[str, str]:  # title -> CWRun path, of those that ran
        ran = [p for p in paths if self.seed.torchrec_skipped is None or not p.startswith("torchrec")]
        return {PATH_TITLES[p]: p for p in ran}

    def checks_table(self) -> pd.DataFrame:
        """Does each stitching equal the unsharded EmbeddingCollection, and by how much not."""
        paths = self._paths("naive", "reference", "torchrec", "torchrec_unpermuted")
        data = {"equals unsharded": [self.seed_run.matches(p) for p in paths.values()]}
        data["max |error|"] = [self.seed_run.max_abs_error(p) for p in paths.values()]
        return pd.DataFrame(data, index=list(paths))

    def error_panels(self) -> dict[str, torch.Tensor]:
        """|output - unsharded| per looked-up id of the wrong stitchings (the exact paths are all zeros)."""
        paths = self._paths("naive", "torchrec_unpermuted")
        return {title: self.seed_run.abs_errors(path, FEATURE) for title, path in paths.items()}

    def traffic_table(self) -> pd.DataFrame:
        return traffic_table(self.traffic_runs, self.traffic_sources)

    def traffic_check_table(self) -> pd.DataFrame:
        return traffic_check_table(self.traffic_table(), self.seed.world_size)

    def summary(self) -> str:
        s, u = self.seed, self.uneven

        def verdict(ok: bool | None) -> str:
            return "n/a" if ok is None else ("exact" if ok else "WRONG")

        text = (
            f"shard_ranks {s.shard_ranks} on {s.world_size} {s.backend} ranks: permute {s.permute_indices}; "
            f"naive concat {verdict(s.naive_matches_unsharded)}, "
            f"embnb {verdict(s.reference_matches_unsharded)}, "
            f"torchrec {verdict(s.torchrec_matches_unsharded)}, "
            f"torchrec without its permute {verdict(s.torchrec_unpermuted_matches_unsharded)}, "
            f"uneven widths {u.uneven_widths} in embnb {verdict(u.uneven_reference_matches_unsharded)}"
        )
        if self.torchrec_uneven:
            failed = sum(o.error is not None for o in self.torchrec_uneven)
            text += (
                f"; torchrec EC with size_per_rank {u.torchrec_size_per_rank} (unsupported): failed on "
                f"{failed} of {len(self.torchrec_uneven)} ranks"
            )
        if self.traffic.planner_bytes_at:
            text += f"; {self.traffic.planner_bytes_at.finding}"
        return text + (f"; {self.pooled.sentence()}" if self.pooled else "")

    def results(self, notebook_seconds: float) -> dict[str, Any]:
        """The notebook's results JSON: each section's numbers, flat, as the tests read them."""
        pooled = self.pooled and {**asdict(self.pooled), "matches": self.pooled.matches}
        if pooled:
            places = layouts.source_places(layouts.POOLED_PERMUTE_STEPS)
            pooled.update(sentence=self.pooled.sentence(), places=[asdict(p) for p in places])
        return {
            "summary": self.summary(),
            "torchrec_version": layouts.torchrec_version(),
            **asdict(self.seed),
            **asdict(self.traffic),
            **asdict(self.uneven),
            "pooled": pooled,
            "run_seconds": round(self.run_seconds, 2),
            "notebook_seconds": round(notebook_seconds, 2),
        }


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


def _traffic_results(runs: list[CWRun], sources: list[str], planned: list, batch: TrafficBatch | None):
    if not runs:
        return TrafficResults(layouts.torchrec_min_cw_dim(), [], [], [], [], None)
    table = traffic_table(runs, sources)
    ids = [len(b[FEATURE][1]) for b in make_batches(runs[0].case)]  # every traffic run has these batches
    mean_ids = round(sum(ids) / len(ids))
    dims, rows, w = batch.planner_dims, batch.num_embeddings, batch.count_world_size
    return TrafficResults(
        layouts.torchrec_min_cw_dim(),
        planned,
        ids,
        table.reset_index().to_dict(orient="records"),
        traffic_check_table(table, runs[0].case.world_size)["all equal"].tolist(),
        planner_bytes_at(w, dims, rows, mean_ids, batch.batch_size),
    )


def _seed_results(run: CWRun, plan: DevicePlan, torchrec_device: str, note: str | None) -> SeedResults:
    case, ran = run.case, "torchrec" in run.case.paths
    ranks = case.placements["t0"]
    permute = cw.cw_permute_indices(ranks)
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
        cw.rank_order(ranks),
        permute,
        [len(batch[FEATURE][1]) for batch in make_batches(case)],
        run.matches("naive"),
        run.max_abs_error("naive"),
        run.matches("reference"),
        case.torchrec_problem() if not ran else None,
    )
    if ran:
        results.torchrec_permute_indices = [r.torchrec_permute[FEATURE] for r in run.ranks]
        results.torchrec_permute_matches = all(p == permute for p in results.torchrec_permute_indices)
        results.torchrec_matches_unsharded = run.matches("torchrec")
        results.torchrec_unpermuted_matches_unsharded = run.matches("torchrec_unpermuted")
        results.torchrec_unpermuted_max_abs_error = run.max_abs_error("torchrec_unpermuted")
    return results


def run_placement_experiment(
    table: SeedTable,
    device: str = "auto",
    traffic_batch: TrafficBatch | None = None,
    size_per_rank: Sequence[int] | None = None,
    timeout_s: float = 300.0,
) -> PlacementExperiment:
    """Run `table` column-wise on its `shard_ranks` with equal widths (both paths, unless torchrec cannot
    take the placement) and with `uneven_widths` (embnb's path); with `traffic_batch`, the byte count's
    layouts (both paths, traffic recorded) and torchrec's pooled path; and with `size_per_rank`, torchrec's
    uneven column_wise plan, last (it breaks the process group): on CPU all in one launch of `world_size`."""
    plan = device_plan(device, table.world_size)
    ranks = cw.check_shard_ranks(table.shard_ranks, table.world_size)
    cw.equal_widths(table.embedding_dim, len(ranks))  # the seed case's widths: refuse before building cases
    seed_case = table.case(ranks)
    if seed_case.torchrec_problem() is not None:
        seed_case = table.case(ranks, paths=("reference",))
    uneven_case = table.case(ranks, paths=("reference",), widths={"t0": list(table.uneven_widths)})
    traffic_cases, sources, planned = _traffic_cases(table, traffic_batch) if traffic_batch else ([], [], [])
    pooled_calls = [(pooled_on_rank, (list(ranks), table.embedding_dim, table.seed))] if traffic_batch else []
    uneven_calls = []  # torchrec's own uneven plan: shard i on rank i
    if size_per_rank is not None:
        uneven_calls = [size_per_rank_call(table.case(range(len(size_per_rank))), size_per_rank)]
    extra = pooled_calls + uneven_calls  # torchrec's uneven plan may break the process group: it runs last
    cases, n = [seed_case, uneven_case, *traffic_cases], len(traffic_cases)

    def launch(calls: list, where: str) -> list:
        return launch_each(calls, table.world_size, device=where, timeout_s=timeout_s) if calls else []

    start = time.perf_counter()
    note = fbgemm_cuda_problem() if plan.device == "cuda" and "torchrec" in seed_case.paths else None
    if plan.device == "cpu":  # one launch
        seed_run, uneven_run, *rest = run_cw_cases(cases, "cpu", timeout_s, extra)
        traffic_runs, tail = rest[:n], rest[n:]
    elif note is None:  # all on the GPUs but the pooled run (gloo, on the CPU)
        seed_run, uneven_run, *traffic_runs = run_cw_cases(cases, device, timeout_s)
        tail = launch(pooled_calls, "cpu") + launch(uneven_calls, device)
    else:  # torchrec's sharded module cannot run on this GPU: compare on the CPU, and say so
        seed_run, *rest = run_cw_cases([seed_case, *traffic_cases], "cpu", timeout_s, extra)
        traffic_runs, tail = rest[:n], rest[n:]
        (uneven_run,) = run_cw_cases([uneven_case], device, timeout_s)
    pooled = PooledRun(list(ranks), table.world_size, table.embedding_dim, tail[0]) if pooled_calls else None
    outcomes = tail[-1] if uneven_calls else None
    seconds = time.perf_counter() - start
    traffic = _traffic_results(traffic_runs, sources, planned, traffic_batch)
    uneven = UnevenResults(
        uneven_case.shard_widths("t0"),
        uneven_run.matches("reference"),
        uneven_run.matches("naive"),
        table.case(ranks, widths={"t0": list(table.uneven_widths)}).torchrec_problem(),
        None if size_per_rank is None else list(size_per_rank),
        None if outcomes is None else [o.describe() for o in outcomes],
        [{"columns_held": o.own_width, "local_embedding_dim": o.local_embedding_dim} for o in outcomes or []],
        layouts.mixed_dims_error(),
        {p.function: p.where for p in layouts.source_places(layouts.UNEVEN_EC_STEPS)},
    )
    torchrec_device = "cpu" if note else plan.device
    seed = _seed_results(seed_run, plan, torchrec_device, note)
    return PlacementExperiment(
        seed_run, uneven_run, traffic_runs, sources, seed, traffic, uneven, outcomes, pooled, seconds
    )
