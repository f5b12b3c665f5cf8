"""Notebook 02's experiment: one placement on real ranks, through embnb's CW
lookup and torchrec's ShardedEmbeddingCollection, plus the same placement
with uneven widths (embnb's path only), in one launch; and the tables and
results dict the notebook shows.

    experiment = run_placement_experiment(2, 12, [0, 1, 0], [2, 7, 3], device="cpu")
    experiment.checks_table(); experiment.results(notebook_seconds=12.3)
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd
import torch

from embnb.columnwise.cases import CWCase, CWRun, TableSpec, make_batches, run_cw_cases
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

__all__ = ["shard_table", "permute_derivation", "PlacementExperiment", "run_placement_experiment"]

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
    torchrec_skipped: str | None  # why torchrec did not run the seed case, or None
    uneven_torchrec_refusal: str | None  # what torchrec says to the uneven widths
    run_seconds: float  # the launches, including process start
    torchrec_device: str = "cpu"  # where torchrec's path ran: the CPU when fbgemm has no CUDA kernels
    torchrec_device_note: str | None = None  # why torchrec ran elsewhere than the plan's device

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
        return pd.DataFrame(
            {
                "equals unsharded": [
                    run.naive_matches(),
                    run.reference_matches(),
                    run.torchrec_matches() if ran else None,
                ],
                "max |error|": [
                    run.max_abs_error("naive"),
                    run.max_abs_error("reference"),
                    run.max_abs_error("torchrec") if ran else None,
                ],
            },
            index=["naive concatenation", "embnb reference", "torchrec ShardedEmbeddingCollection"],
        )

    def error_panels(self) -> dict[str, torch.Tensor]:
        """|output - unsharded| per looked-up id, by path: what `lookup_error_figure` draws."""
        panels = {
            "naive concatenation in rank order": self.seed_run.abs_errors("naive", FEATURE),
            "embnb reference (permuted)": self.seed_run.abs_errors("reference", FEATURE),
        }
        if self.torchrec_ran:
            panels["torchrec ShardedEmbeddingCollection"] = self.seed_run.abs_errors("torchrec", FEATURE)
        return panels

    def results(self, notebook_seconds: float) -> dict[str, Any]:
        """The notebook's results JSON."""
        case, run, uneven = self.seed_run.case, self.seed_run, self.uneven_run
        backend = self.plan.backend
        shard_ranks = case.placements["t0"]
        permute = cw_permute_indices(shard_ranks)
        torchrec_matches = run.torchrec_matches() if self.torchrec_ran else None
        permutes = self.torchrec_permutes()
        uneven_widths = uneven.case.widths["t0"]
        return {
            "summary": (
                f"shard_ranks {shard_ranks} on {case.world_size} {backend} ranks: permute {permute}; "
                f"naive concat {_verdict(run.naive_matches())}, "
                f"embnb {_verdict(run.reference_matches())}, "
                f"torchrec {_verdict(torchrec_matches)}, "
                f"uneven widths {uneven_widths} {_verdict(uneven.reference_matches())}"
            ),
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
            "torchrec_skipped": self.torchrec_skipped,
            "uneven_widths": uneven_widths,
            "uneven_reference_matches_unsharded": uneven.reference_matches(),
            "uneven_naive_matches_unsharded": uneven.naive_matches(),
            "ids_per_rank": self.ids_per_rank(),
            "run_seconds": round(self.run_seconds, 2),
            "notebook_seconds": round(notebook_seconds, 2),
        }


def run_placement_experiment(
    world_size: int,
    embedding_dim: int,
    shard_ranks: Sequence[int],
    uneven_widths: Sequence[int],
    num_embeddings: int = 32,
    batch_size: int = 4,
    max_length: int = 3,
    seed: int = 0,
    device: str = "auto",
    timeout_s: float = 300.0,
) -> PlacementExperiment:
    """Run one table ("t0", feature "f0") column-wise on `shard_ranks` with
    equal widths (embnb's path and torchrec's, unless torchrec cannot take
    the placement: then `torchrec_skipped` says why) and with `uneven_widths`
    (embnb's path), in one launch on `world_size` ranks."""
    plan = device_plan(device, world_size)
    ranks = check_shard_ranks(shard_ranks, world_size)
    equal_widths(embedding_dim, len(ranks))  # the seed case's widths: refuse before building cases
    tables = (TableSpec("t0", num_embeddings, (FEATURE,)),)
    common = dict(batch_size=batch_size, max_length=max_length, seed=seed)
    seed_case = CWCase(world_size, embedding_dim, tables, {"t0": ranks}, **common)
    torchrec_skipped = seed_case.torchrec_problem()
    if torchrec_skipped is not None:
        seed_case = CWCase(world_size, embedding_dim, tables, {"t0": ranks}, paths=("reference",), **common)
    uneven = dict(widths={"t0": list(uneven_widths)}, **common)
    uneven_case = CWCase(world_size, embedding_dim, tables, {"t0": ranks}, paths=("reference",), **uneven)
    start = time.perf_counter()
    note = fbgemm_cuda_problem() if plan.device == "cuda" and torchrec_skipped is None else None
    if note is None:
        seed_run, uneven_run = run_cw_cases([seed_case, uneven_case], device=device, timeout_s=timeout_s)
    else:  # torchrec's sharded module cannot run on this GPU: compare on the CPU, and say so
        (seed_run,) = run_cw_cases([seed_case], device="cpu", timeout_s=timeout_s)
        (uneven_run,) = run_cw_cases([uneven_case], device=device, timeout_s=timeout_s)
    return PlacementExperiment(
        plan,
        seed_run,
        uneven_run,
        torchrec_skipped,
        CWCase(world_size, embedding_dim, tables, {"t0": ranks}, **uneven).torchrec_problem(),
        time.perf_counter() - start,
        torchrec_device="cpu" if note else plan.device,
        torchrec_device_note=f"torchrec's path ran on the CPU: {note}" if note else None,
    )
