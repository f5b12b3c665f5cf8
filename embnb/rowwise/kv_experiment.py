"""Notebook 01's experiment on real ranks: a sharded KV table under every
routing mode, its checkpoint loaded into another world size, and the
notebook's results JSON.

    run = run_kv_lookups(batches, ["roundrobin", "hash_roundrobin"], 16,
                         dump_dir=d, dump_dist_type="hash_roundrobin")
    run.keys_served()          # {dist_type: keys each owner served}
    report = reshard(d, "hash_roundrobin", run.rows_held()["hash_roundrobin"], 3, None, 16, 0)

One launch looks the batches up under every dist_type (`dist.launch_each`),
so the ranks pay their start-up (importing torch) once.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd
import torch

from embnb.dist import device_plan, launch_each
from embnb.metrics import max_over_mean
from embnb.rowwise import checkpoint, kv
from embnb.rowwise.routing import DistType, owner_rank

__all__ = ["KVLookupRun", "run_kv_lookups", "ReshardReport", "reshard", "mismatch_message", "results"]


@dataclass(frozen=True)
class KVLookupRun:
    """Per dist_type, what every rank's lookup returned (rank order)."""

    world_size: int
    backend: str  # the process group's backend
    rows: dict[str, list[torch.Tensor]]  # rows of each rank's batch, input order
    stats: dict[str, list[dict[str, int]]]  # ShardedKVTable.stats() per rank
    seconds: float  # the whole launch

    def keys_served(self) -> dict[str, list[int]]:
        return {d: [s["keys_served"] for s in stats] for d, stats in self.stats.items()}

    def rows_held(self) -> dict[str, list[int]]:
        return {d: [s["rows_held"] for s in stats] for d, stats in self.stats.items()}

    def max_over_mean(self) -> dict[str, float]:
        return {d: max_over_mean(served) for d, served in self.keys_served().items()}

    def rows_match(self, batches: Sequence[kv.Batch], embedding_dim: int, seed: int) -> bool:
        """Whether every lookup returned each key's initial row (a pure
        function of key and seed) in input order, under every dist_type."""
        expected = [kv.init_rows(batch.values(), embedding_dim, seed) for batch in batches]
        return all(torch.equal(got, want) for rows in self.rows.values() for got, want in zip(rows, expected))


def run_kv_lookups(
    batches: Sequence[kv.Batch],
    dist_types: Sequence[DistType | str],
    embedding_dim: int,
    *,
    block_sizes: Mapping[str, int | None] | None = None,
    seed: int = 0,
    dump_dir: str | None = None,
    dump_dist_type: DistType | str | None = None,
    device: str = "auto",
) -> KVLookupRun:
    """One rank per batch; per dist_type a fresh `ShardedKVTable` looks up
    each rank's batch. With `dump_dir`, the `dump_dist_type` table saves its
    shards there (table name `kv.TABLE_NAME`)."""
    world_size = len(batches)
    plan = device_plan(device, world_size)
    modes = [DistType.parse(d) for d in dist_types]
    dump_mode = None if dump_dist_type is None else DistType.parse(dump_dist_type)
    block_sizes = dict(block_sizes or {})
    # JaggedBatches: unpickling KJTs would import torchrec on every rank.
    plain = [kv.JaggedBatch.from_kjt(b) if not isinstance(b, kv.JaggedBatch) else b for b in batches]
    calls = [
        (
            kv.lookup_on_rank,
            (
                mode,
                plain,
                embedding_dim,
                block_sizes.get(mode.value),
                seed,
                dump_dir if mode is dump_mode else None,
            ),
        )
        for mode in modes
    ]
    start = time.perf_counter()
    per_mode = launch_each(calls, world_size, backend=plan.backend)
    seconds = time.perf_counter() - start
    return KVLookupRun(
        world_size=world_size,
        backend=plan.backend,
        rows={m.value: [r["rows"] for r in results] for m, results in zip(modes, per_mode)},
        stats={m.value: [r["stats"] for r in results] for m, results in zip(modes, per_mode)},
        seconds=seconds,
    )


@dataclass(frozen=True)
class ReshardReport:
    """A checkpoint written by W ranks, loaded into another world size."""

    dist_type: str
    saved_world_size: int
    load_world_size: int
    rows_saved: list[int]
    rows_loaded: list[int]
    distinct_keys_loaded: int
    every_key_on_owner: bool  # each loaded key sits on its owner under the new W
    rows_exact: bool  # loaded rows are bit-identical to the saved ones
    naive_loader_misplaced_fraction: float  # rows a `key % W == rank` loader gets wrong

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def reshard(
    directory: str,
    dist_type: DistType | str,
    rows_saved: Sequence[int],
    load_world_size: int,
    block_size: int | None,
    embedding_dim: int,
    seed: int,
) -> ReshardReport:
    """Load the saved KV table into `load_world_size` ranks and check it.

    The table's rows are initial rows (looked up, never trained), so the
    exact rows are `kv.init_rows(keys, embedding_dim, seed)`.
    """
    mode = DistType.parse(dist_type)
    loaded = [
        checkpoint.load(directory, kv.TABLE_NAME, rank, load_world_size, mode, block_size=block_size)
        for rank in range(load_world_size)
    ]
    keys = torch.cat([k for k, _ in loaded])
    true_owner = owner_rank(keys, load_world_size, mode, block_size)
    naive_owner = torch.remainder(keys, load_world_size)  # dynamicemb's loader
    return ReshardReport(
        dist_type=mode.value,
        saved_world_size=len(rows_saved),
        load_world_size=load_world_size,
        rows_saved=list(rows_saved),
        rows_loaded=[len(k) for k, _ in loaded],
        distinct_keys_loaded=keys.unique().numel(),
        every_key_on_owner=all(
            bool((owner_rank(k, load_world_size, mode, block_size) == rank).all())
            for rank, (k, _) in enumerate(loaded)
        ),
        rows_exact=all(torch.equal(rows, kv.init_rows(k, embedding_dim, seed)) for k, rows in loaded),
        naive_loader_misplaced_fraction=float((naive_owner != true_owner).double().mean()),
    )


def mismatch_message(directory: str, load_world_size: int, dist_type: DistType | str) -> str | None:
    """The ValueError `checkpoint.load` raises when asked for another
    dist_type than the one saved, or None if it (wrongly) loaded."""
    try:
        checkpoint.load(directory, kv.TABLE_NAME, 0, load_world_size, dist_type)
    except ValueError as error:
        return str(error)
    return None


def results(
    *,
    world_size: int,
    num_keys: int,
    zipf_alpha: float,
    sweep: pd.DataFrame,
    max_over_mean_grid: dict[str, dict[str, float]],
    zipf_floor: float,
    kv_run: KVLookupRun,
    kv_pattern: str,
    kv_rows_match: bool,
    reshard_report: ReshardReport,
    wrong_dist_type: str,
    mismatch: str | None,
    kernel: dict[str, Any],
    seconds: dict[str, float],
) -> dict[str, Any]:
    """Notebook 01's results JSON: its key numbers, for `make run` and the tests."""

    def ratio(pattern: str, dist_type: str) -> float:
        return max_over_mean_grid.get(pattern, {}).get(dist_type, float("nan"))

    kv_ratios = kv_run.max_over_mean()
    keys_looked_up = sum(len(r) for r in next(iter(kv_run.rows.values())))
    summary = "; ".join(
        [
            f"strided W={world_size}: roundrobin max/mean {ratio('strided', 'roundrobin'):.2f} "
            f"vs hash {ratio('strided', 'hash_roundrobin'):.2f}",
            f"zipf: {ratio('zipf', 'roundrobin'):.2f} vs {ratio('zipf', 'hash_roundrobin'):.2f} "
            f"(floor {zipf_floor:.2f})",
            f"KV {kv_run.world_size} ranks: {kv_ratios.get('roundrobin', 0):.2f} "
            f"vs {kv_ratios.get('hash_roundrobin', 0):.2f}",
            f"checkpoint {sum(reshard_report.rows_saved)} rows "
            f"{reshard_report.saved_world_size}->{reshard_report.load_world_size} "
            f"ranks: {sum(reshard_report.rows_loaded)} loaded",
        ]
    )
    return {
        "world_size": world_size,
        "num_keys": num_keys,
        "zipf_alpha": zipf_alpha,
        "max_over_mean": max_over_mean_grid,
        "zipf_hot_key_floor": zipf_floor,
        "sweep": sweep.to_dict(orient="records"),
        "kv": {
            "world_size": kv_run.world_size,
            "pattern": kv_pattern,
            "backend": kv_run.backend,
            "keys_looked_up": keys_looked_up,
            "keys_served": kv_run.keys_served(),
            "rows_held": kv_run.rows_held(),
            "max_over_mean": kv_ratios,
            "rows_match": kv_rows_match,
            "seconds": kv_run.seconds,
        },
        "checkpoint": reshard_report.as_dict(),
        "mismatch": {"asked_dist_type": wrong_dist_type, "raised": mismatch is not None, "message": mismatch},
        "kernel": kernel,
        "seconds": seconds,
        "summary": summary,
    }
