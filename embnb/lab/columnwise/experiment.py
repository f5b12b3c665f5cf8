"""Notebook 02's experiment: one placement on real ranks, through embnb's CW
lookup and torchrec's ShardedEmbeddingCollection (also with torchrec's
permute switched off), the same placement with uneven widths (embnb's path),
and layouts whose all-to-all bytes are recorded on a batch of realistic size
(teaching layouts of more and more shards, and the layouts torchrec's own
planner makes), in one launch; then torchrec's own
`column_wise(size_per_rank=...)` in a launch of its own (it fails on some
ranks); and the tables and results dict the notebook shows.

    seed_table = SeedTable(world_size=2, embedding_dim=12, shard_ranks=[0, 1, 0], uneven_widths=[2, 7, 3])
    experiment = run_placement_experiment(
        seed_table, device="cpu", traffic_shards=[2, 12], traffic_batch=TrafficBatch()
    )
    experiment.checks_table(); experiment.traffic_table()
    experiment.results(notebook_seconds=12.3)
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import torch

from embnb.columnwise.placement import (
    check_shard_ranks,
    check_widths,
    column_offsets,
    cw_permute_indices,
    equal_widths,
    rank_order,
)
from embnb.columnwise.torchrec_adapter import compute_kernel_for, fbgemm_cuda_problem
from embnb.dist import DevicePlan, device_plan
from embnb.lab.columnwise.cases import (
    CWCase,
    CWRun,
    TableSpec,
    TorchrecOutcome,
    make_batches,
    run_cw_cases,
    run_torchrec_size_per_rank,
)
from embnb.lab.columnwise.torchrec_layouts import (
    PlannerLayout,
    mixed_dims_error,
    planner_cw_layout,
    torchrec_min_cw_dim,
    uneven_ec_places,
)
from embnb.lab.columnwise.traffic_tables import traffic_check_table, traffic_findings, traffic_table

__all__ = [
    "shard_table",
    "permute_derivation",
    "PlacementExperiment",
    "TrafficBatch",
    "SeedTable",
    "run_placement_experiment",
    "torchrec_uneven_table",
    "torchrec_version",
]

FEATURE = "f0"  # the experiment's one table "t0" serves one feature


def shard_table(shard_ranks: Sequence[int], widths: Sequence[int]) -> pd.DataFrame:
    """One row per shard: its columns, its rank and where it arrives."""
    ranks = check_shard_ranks(shard_ranks)
    widths = check_widths(widths, sum(widths), len(ranks))
    arrival = rank_order(ranks)
    return pd.DataFrame(
        {
            "columns": [f"{o}..{o + w - 1}" for o, w in zip(column_offsets(widths), widths)],
            "rank": ranks,
            "arrives at position": [arrival.index(s) for s in range(len(ranks))],
        },
        index=[f"s{s}" for s in range(len(ranks))],
    )


def permute_derivation(shard_ranks: Sequence[int]) -> pd.DataFrame:
    """The permute index of each shard next to its two parts: the shards on
    lower ranks and the earlier shards on its own rank (their sum)."""
    ranks = check_shard_ranks(shard_ranks)
    return pd.DataFrame(
        {
            "rank": ranks,
            "shards on lower ranks": [sum(r < ranks[s] for r in ranks) for s in range(len(ranks))],
            "earlier shards, same rank": [ranks[:s].count(ranks[s]) for s in range(len(ranks))],
            "permute[s]": cw_permute_indices(ranks),
        },
        index=[f"s{s}" for s in range(len(ranks))],
    )


def _verdict(ok: bool | None) -> str:
    return "n/a" if ok is None else ("exact" if ok else "WRONG")


@dataclass
class PlacementExperiment:
    """The runs of `run_placement_experiment` and what the notebook reports."""

    plan: DevicePlan
    seed_run: CWRun  # equal widths, both paths (torchrec's unless it cannot take them)
    uneven_run: CWRun  # uneven widths, embnb's path
    traffic_runs: list[CWRun]  # layouts on the same ranks, both paths, traffic recorded
    traffic_sources: list[str]  # per traffic run: "teaching" or "torchrec planner"
    torchrec_skipped: str | None  # why torchrec did not run the seed case, or None
    embnb_uneven_check: str | None  # embnb's own check's verdict on the uneven widths for torchrec
    size_per_rank: list[int] | None  # torchrec's column_wise(size_per_rank=...) widths run
    torchrec_uneven: list[TorchrecOutcome] | None  # what each rank got from torchrec with them
    run_seconds: float  # the launches, including process start
    torchrec_device: str = "cpu"  # where torchrec's path ran: the CPU when fbgemm has no CUDA kernels
    torchrec_device_note: str | None = None  # why torchrec ran elsewhere than the plan's device
    planner_layouts: list[PlannerLayout] = field(default_factory=list)  # torchrec planner's CW shards

    @property
    def torchrec_ran(self) -> bool:
        return self.torchrec_skipped is None

    def ids_per_rank(self) -> list[int]:
        return [len(batch[FEATURE][1]) for batch in make_batches(self.seed_run.case)]

    def torchrec_permutes(self) -> list[list[int]] | None:
        """The permute indices torchrec computed, per rank."""
        return [r.torchrec_permute[FEATURE] for r in self.seed_run.ranks] if self.torchrec_ran else None

    def checks_table(self) -> pd.DataFrame:
        """Does each stitching equal the unsharded EmbeddingCollection, and by how much not."""
        run, ran = self.seed_run, self.torchrec_ran
        paths = {
            "embnb: naive concatenation in rank order": "naive",
            "embnb reference (permuted)": "reference",
        }
        if ran:
            paths["torchrec ShardedEmbeddingCollection"] = "torchrec"
            paths["torchrec, its permute switched off"] = "torchrec_unpermuted"
        return pd.DataFrame(
            {
                "equals unsharded": [run.abs_errors(p, FEATURE).max().item() == 0 for p in paths.values()],
                "max |error|": [run.max_abs_error(p) for p in paths.values()],
            },
            index=list(paths),
        )

    def error_panels(self) -> dict[str, torch.Tensor]:
        """|output - unsharded| per looked-up id, by wrong stitching: what
        `lookup_error_figure` draws (the exact paths are all zeros)."""
        panels = {"embnb: naive concatenation in rank order": self.seed_run.abs_errors("naive", FEATURE)}
        if self.torchrec_ran:
            panels["torchrec, its permute switched off"] = self.seed_run.abs_errors(
                "torchrec_unpermuted", FEATURE
            )
        return panels

    def traffic_ids_per_rank(self) -> list[int]:
        """Ids each rank looks up in the traffic count (every traffic run has the same batches)."""
        if not self.traffic_runs:
            return []
        return [len(batch[FEATURE][1]) for batch in make_batches(self.traffic_runs[0].case)]

    def traffic_table(self) -> pd.DataFrame:
        """Bytes each path sent per layout (`traffic_tables.traffic_table`)."""
        return traffic_table(self.traffic_runs, self.traffic_sources)

    def traffic_check_table(self) -> pd.DataFrame:
        """The counted bytes next to the count of what each path puts on the wire."""
        return traffic_check_table(self.traffic_table(), self.seed_run.case.world_size)

    def traffic_findings(self) -> list[str]:
        """What the byte count shows, as sentences built from its numbers."""
        return traffic_findings(self.traffic_table())

    def planner_layout_table(self) -> pd.DataFrame:
        """The column-wise shards torchrec's planner made of each table."""
        return pd.DataFrame(
            {
                "shard widths": [layout.widths for layout in self.planner_layouts],
                "shard ranks": [layout.ranks for layout in self.planner_layouts],
            },
            index=pd.Index([layout.embedding_dim for layout in self.planner_layouts], name="embedding_dim"),
        )

    def uneven_outcome_table(self) -> pd.DataFrame:
        """Per rank, torchrec's `column_wise(size_per_rank=...)` run: the
        columns it holds, the width torchrec views its lookups as, what it got."""
        outcomes = self.torchrec_uneven or []
        return pd.DataFrame(
            {
                "columns held": [o.own_width for o in outcomes],
                "torchrec's local width": [o.local_embedding_dim for o in outcomes],
                "outcome": [o.describe() for o in outcomes],
            },
            index=pd.Index(range(len(outcomes)), name="rank"),
        )

    def results(self, notebook_seconds: float) -> dict[str, Any]:
        """The notebook's results JSON."""
        case, run, uneven = self.seed_run.case, self.seed_run, self.uneven_run
        backend = self.plan.backend
        shard_ranks = case.placements["t0"]
        permute = cw_permute_indices(shard_ranks)
        torchrec_matches = run.torchrec_matches() if self.torchrec_ran else None
        unpermuted = run.torchrec_unpermuted_matches() if self.torchrec_ran else None
        permutes = self.torchrec_permutes()
        uneven_widths = uneven.case.widths["t0"]
        outcomes = [o.describe() for o in self.torchrec_uneven] if self.torchrec_uneven else None
        traffic = self.traffic_table().reset_index().to_dict(orient="records") if self.traffic_runs else []
        checks = self.traffic_check_table()["all equal"].tolist() if self.traffic_runs else []
        return {
            "summary": (
                f"shard_ranks {shard_ranks} on {case.world_size} {backend} ranks: permute {permute}; "
                f"naive concat {_verdict(run.naive_matches())}, "
                f"embnb {_verdict(run.reference_matches())}, "
                f"torchrec {_verdict(torchrec_matches)}, "
                f"torchrec without its permute {_verdict(unpermuted)}, "
                f"uneven widths {uneven_widths} in embnb {_verdict(uneven.reference_matches())}"
                + (
                    f"; torchrec EC with size_per_rank {self.size_per_rank} (unsupported): failed on "
                    f"{sum(o.error is not None for o in self.torchrec_uneven)} of {len(outcomes)} ranks"
                    if outcomes
                    else ""
                )
            ),
            "torchrec_version": torchrec_version(),
            "world_size": case.world_size,
            "embedding_dim": case.embedding_dim,
            "shard_ranks": shard_ranks,
            "widths": case.shard_widths("t0"),
            "device": self.plan.device,
            "backend": self.plan.backend,
            "compute_kernel": compute_kernel_for(self.torchrec_device),
            "torchrec_device": self.torchrec_device,
            "torchrec_device_note": self.torchrec_device_note,
            "rank_order": rank_order(shard_ranks),
            "permute_indices": permute,
            "torchrec_permute_indices": permutes,
            "torchrec_permute_matches": all(p == permute for p in permutes) if self.torchrec_ran else None,
            "naive_matches_unsharded": run.naive_matches(),
            "naive_max_abs_error": run.max_abs_error("naive"),
            "reference_matches_unsharded": run.reference_matches(),
            "torchrec_matches_unsharded": torchrec_matches,
            "torchrec_unpermuted_matches_unsharded": unpermuted,
            "torchrec_unpermuted_max_abs_error": run.max_abs_error("torchrec_unpermuted")
            if self.torchrec_ran
            else None,
            "torchrec_skipped": self.torchrec_skipped,
            "embnb_uneven_check": self.embnb_uneven_check,
            "torchrec_size_per_rank": self.size_per_rank,
            "torchrec_size_per_rank_outcomes": outcomes,
            "torchrec_size_per_rank_widths": [
                {"columns_held": o.own_width, "local_embedding_dim": o.local_embedding_dim}
                for o in self.torchrec_uneven or []
            ],
            "torchrec_mixed_dims_error": mixed_dims_error(),
            "torchrec_uneven_places": {place.function: place.where for _, place in uneven_ec_places()},
            "torchrec_min_cw_dim": torchrec_min_cw_dim(),
            "planner_layouts": [
                {"embedding_dim": p.embedding_dim, "ranks": p.ranks, "widths": p.widths}
                for p in self.planner_layouts
            ],
            "traffic": traffic,
            "traffic_counts_equal_model": checks,
            "traffic_ids_per_rank": self.traffic_ids_per_rank(),
            "uneven_widths": uneven_widths,
            "uneven_reference_matches_unsharded": uneven.reference_matches(),
            "uneven_naive_matches_unsharded": uneven.naive_matches(),
            "ids_per_rank": self.ids_per_rank(),
            "run_seconds": round(self.run_seconds, 2),
            "notebook_seconds": round(notebook_seconds, 2),
        }


@dataclass(frozen=True)
class TrafficBatch:
    """The batches and table rows of the traffic count: realistic sizes
    (thousands of ids per rank), apart from the small worked example."""

    batch_size: int = 64  # sequences per rank
    max_length: int = 100  # ids per sequence, at most (uniform from 0)
    num_embeddings: int = 1000  # rows of each traffic table
    teaching_dim: int = 48  # columns of the table the teaching layouts cut
    planner_dims: tuple[int, ...] = (256, 512, 1024)  # tables torchrec's planner shards column-wise


def _traffic_cases(
    world_size: int, traffic_shards: Sequence[int], batch: TrafficBatch, seed: int
) -> tuple[list[CWCase], list[str], list[PlannerLayout]]:
    """The traffic runs' cases, each's source ("teaching": `traffic_shards`
    equal shards of `batch.teaching_dim` columns dealt round-robin; "torchrec
    planner": the shards torchrec's planner makes), and the planner's layouts."""
    layouts = [planner_cw_layout(d, batch.num_embeddings, world_size) for d in batch.planner_dims]
    for layout in layouts:  # torchrec's planner cuts equal blocks; column_wise(ranks=...) makes the same
        if layout.widths != equal_widths(layout.embedding_dim, len(layout.ranks)):
            raise ValueError(f"torchrec's planner made uneven widths {layout.widths}: not a case this runs")
    placements = [
        (batch.teaching_dim, [s % world_size for s in range(n)], "teaching") for n in traffic_shards
    ] + [(layout.embedding_dim, layout.ranks, "torchrec planner") for layout in layouts]
    common = dict(batch_size=batch.batch_size, max_length=batch.max_length, seed=seed)
    table = (TableSpec("t0", batch.num_embeddings, (FEATURE,)),)
    cases = [CWCase(world_size, dim, table, {"t0": ranks}, **common) for dim, ranks, _ in placements]
    for case in cases:
        case.check_torchrec()  # before any rank starts
    return cases, [source for *_, source in placements], layouts


@dataclass(frozen=True)
class SeedTable:
    """The worked example's one table ("t0", feature "f0") and its batches:
    column-wise on `shard_ranks` with equal widths, and with `uneven_widths`."""

    world_size: int
    embedding_dim: int
    shard_ranks: Sequence[int]
    uneven_widths: Sequence[int]
    num_embeddings: int = 32
    batch_size: int = 4  # sequences per rank
    max_length: int = 3  # ids per sequence, at most
    seed: int = 0


def run_placement_experiment(
    table: SeedTable,
    device: str = "auto",
    timeout_s: float = 300.0,
    traffic_shards: Sequence[int] = (),
    traffic_batch: TrafficBatch | None = None,
    size_per_rank: Sequence[int] | None = None,
) -> PlacementExperiment:
    """Run `table` ("t0", feature "f0") column-wise on its `shard_ranks` with
    equal widths (embnb's path and torchrec's, unless torchrec cannot take
    the placement: then `torchrec_skipped` says why) and with `uneven_widths`
    (embnb's path); and, on `traffic_batch`'s batches (no traffic count
    without one), the teaching layouts (`traffic_shards` equal shards) and
    the layouts torchrec's planner makes, both paths, traffic recorded; all
    in one launch on `world_size` ranks. Then, with `size_per_rank`,
    torchrec's uneven column_wise plan in a launch of its own (shard i on rank i)."""
    world_size, embedding_dim, seed = table.world_size, table.embedding_dim, table.seed
    plan = device_plan(device, world_size)
    ranks = check_shard_ranks(table.shard_ranks, world_size)
    equal_widths(embedding_dim, len(ranks))  # the seed case's widths: refuse before building cases
    tables = (TableSpec("t0", table.num_embeddings, (FEATURE,)),)
    common = dict(batch_size=table.batch_size, max_length=table.max_length, seed=seed)
    seed_case = CWCase(world_size, embedding_dim, tables, {"t0": ranks}, **common)
    torchrec_skipped = seed_case.torchrec_problem()
    if torchrec_skipped is not None:
        seed_case = CWCase(world_size, embedding_dim, tables, {"t0": ranks}, paths=("reference",), **common)
    uneven = dict(widths={"t0": list(table.uneven_widths)}, **common)
    uneven_case = CWCase(world_size, embedding_dim, tables, {"t0": ranks}, paths=("reference",), **uneven)
    traffic_cases, traffic_sources, layouts = (
        _traffic_cases(world_size, traffic_shards, traffic_batch, seed) if traffic_batch else ([], [], [])
    )
    start = time.perf_counter()
    note = fbgemm_cuda_problem() if plan.device == "cuda" and torchrec_skipped is None else None
    if note is None:
        seed_run, uneven_run, *traffic_runs = run_cw_cases(
            [seed_case, uneven_case, *traffic_cases], device=device, timeout_s=timeout_s
        )
    else:  # torchrec's sharded module cannot run on this GPU: compare on the CPU, and say so
        seed_run, *traffic_runs = run_cw_cases([seed_case, *traffic_cases], device="cpu", timeout_s=timeout_s)
        (uneven_run,) = run_cw_cases([uneven_case], device=device, timeout_s=timeout_s)
    torchrec_uneven = None
    if size_per_rank is not None:
        uneven_case_for_torchrec = CWCase(
            world_size, embedding_dim, tables, {"t0": list(range(len(size_per_rank)))}, **common
        )
        torchrec_uneven = run_torchrec_size_per_rank(
            uneven_case_for_torchrec, size_per_rank, device="cpu" if note else device, timeout_s=timeout_s
        )
    return PlacementExperiment(
        plan,
        seed_run,
        uneven_run,
        traffic_runs,
        traffic_sources,
        torchrec_skipped,
        CWCase(world_size, embedding_dim, tables, {"t0": ranks}, **uneven).torchrec_problem(),
        None if size_per_rank is None else list(size_per_rank),
        torchrec_uneven,
        time.perf_counter() - start,
        torchrec_device="cpu" if note else plan.device,
        torchrec_device_note=f"torchrec's path ran on the CPU: {note}" if note else None,
        planner_layouts=layouts,
    )


def torchrec_uneven_table() -> pd.DataFrame:
    """What each step of the installed torchrec does with uneven CW widths
    in an EmbeddingCollection, and the line that does it."""
    places = uneven_ec_places()
    return pd.DataFrame(
        {f"where (torchrec {torchrec_version()})": [place.where for _, place in places]},
        index=pd.Index([what for what, _ in places], name="step"),
    )


def torchrec_version() -> str:
    """The installed torchrec's version: what the notebook's torchrec claims are about."""
    from importlib.metadata import version

    return version("torchrec")
