"""Appendix 02a's byte count and the column-wise layouts torchrec itself makes and takes, asked of the
installed torchrec: what each path sent per layout (recorded by `cases.recorded_all_to_all`) next to
what `wire_bytes` says it puts on the wire; the same count at the layouts torchrec's planner makes on
more ranks (`planner_cw_layout`; `planner_bytes_at`: a count, no ranks run); and what torchrec's
EmbeddingCollection says to tables of different widths (`mixed_dims_error`).

    planner_cw_layout(512, 1000, 2)      # PlannerLayout(ranks=[0, 1, 0, 1], widths=[128] * 4)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pandas as pd
import torch

from embnb._checks import check_int
from embnb.lab.columnwise.cases import FEATURE, TABLE, CWRun, make_batches
from embnb.planner.factory import make_reservation
from embnb.planner.topology import make_topology

PATHS = (("torchrec", "torchrec"), ("embnb", "reference"))  # (name in the tables, CWRun path)


@dataclass(frozen=True)
class PlannerLayout:
    """One table's column-wise shards as torchrec's planner placed them, in column order."""

    embedding_dim: int
    ranks: list[int]  # rank of each shard
    widths: list[int]  # columns of each shard


def planner_cw_layout(embedding_dim: int, num_embeddings: int, world_size: int) -> PlannerLayout:
    """The shards torchrec's EmbeddingShardingPlanner makes of one EmbeddingCollection table when it may
    only shard it column-wise (fused kernel), on `world_size` CPU devices of one host."""
    from torchrec import EmbeddingCollection, EmbeddingConfig
    from torchrec.distributed.embedding import EmbeddingCollectionSharder
    from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints

    check_int("embedding_dim", embedding_dim, low=1)
    check_int("num_embeddings", num_embeddings, low=1)
    config = EmbeddingConfig(num_embeddings, embedding_dim, TABLE, feature_names=[FEATURE])
    ec = EmbeddingCollection(tables=[config], device=torch.device("meta"))
    constraints = {TABLE: ParameterConstraints(sharding_types=["column_wise"], compute_kernels=["fused"])}
    # embnb.planner's topology and reservation (torchrec's defaults, without their warnings), no stats table
    topology, reservation = make_topology(world_size, "cpu"), make_reservation("heuristical")
    planner = EmbeddingShardingPlanner(
        topology, constraints=constraints, storage_reservation=reservation, stats=[]
    )
    plan = planner.plan(ec, [EmbeddingCollectionSharder()])
    shards = sorted(plan.plan[""][TABLE].sharding_spec.shards, key=lambda s: s.shard_offsets[1])
    ranks, widths = [s.placement.rank() for s in shards], [s.shard_sizes[1] for s in shards]
    return PlannerLayout(embedding_dim, ranks, widths)


def mixed_dims_error(dims: tuple[int, int] = (4, 8)) -> str:
    """The error torchrec's EmbeddingCollection raises for two tables of `dims` columns."""
    from torchrec import EmbeddingCollection, EmbeddingConfig

    tables = [EmbeddingConfig(4, d, f"t{i}", feature_names=[f"f{i}"]) for i, d in enumerate(dims)]
    try:
        EmbeddingCollection(tables=tables, device=torch.device("meta"))
    except ValueError as error:
        return f"ValueError: {error}"
    return f"no error: tables of {list(dims)} columns were accepted"


def wire_bytes(
    shards: int, owner_ranks: int, embedding_dim: int, ids: int, sequences: int, world_size: int
) -> dict[str, int]:
    """What each path puts on the wire in one forward of one CW table for `ids` in `sequences` (all
    ranks), cut into `shards` shards on `owner_ranks` of `world_size` ranks: int64 ids, lengths and
    counts, fp32 rows. torchrec: every id and every sequence's length once per shard (KJTAllToAll treats
    a shard as a table), 3 split counts per (sender, destination); embnb: every id once per owner rank,
    one count per (sender, destination); both: every looked-up id's full row. Bytes, by part
    (`torchrec_ints`, `embnb_ints`, `rows`) and in total (`torchrec`, `embnb`)."""
    for name, value in (("shards", shards), ("owner_ranks", owner_ranks), ("world_size", world_size)):
        check_int(name, value, low=1)
    if owner_ranks > min(shards, world_size):
        raise ValueError(f"owner_ranks {owner_ranks} > min(shards {shards}, world_size {world_size})")
    pairs = world_size * world_size  # (sender, destination)
    torchrec, embnb = 8 * (shards * (ids + sequences) + 3 * pairs), 8 * (owner_ranks * ids + pairs)
    rows = 4 * ids * embedding_dim
    totals = {"torchrec": torchrec + rows, "embnb": embnb + rows}
    return {"torchrec_ints": torchrec, "embnb_ints": embnb, "rows": rows} | totals


def _layout_row(run: CWRun, source: str) -> dict:
    ranks, width = list(run.case.shard_ranks), run.case.shard_widths()[0]
    batches = make_batches(run.case)
    ids, sequences = sum(len(b[1]) for b in batches), sum(len(b[0]) for b in batches)
    row = {"layout": f"{run.case.embedding_dim} = {len(ranks)} x {width}", "source": source}
    row |= {"embedding_dim": run.case.embedding_dim, "shards": len(ranks), "shard width": width}
    row |= {"owner ranks": len(set(ranks)), "ids": ids, "sequences": sequences}
    for name, path in PATHS:
        per_rank = run.traffic(path)
        row[f"{name} int B"] = sum(r["int_bytes"] for r in per_rank)
        row[f"{name} rows B"] = sum(r["float_bytes"] for r in per_rank)
        row[f"{name} B"] = row[f"{name} int B"] + row[f"{name} rows B"]
        row[f"{name} all-to-alls"] = max(r["calls"] for r in per_rank)  # per rank, one forward
        row[f"{name} int B/id"] = row[f"{name} int B"] / ids
    row["torchrec / embnb"] = row["torchrec B"] / row["embnb B"]
    row["rows B/id"] = row["embnb rows B"] / ids
    row["torchrec int / rows"] = row["torchrec int B"] / row["torchrec rows B"]
    row["2 / shard width"] = 2 / width
    case = run.case
    count = wire_bytes(len(ranks), len(set(ranks)), case.embedding_dim, ids, sequences, case.world_size)
    row |= {"torchrec int B, counted": count["torchrec_ints"], "embnb int B, counted": count["embnb_ints"]}
    row["rows B, counted"] = count["rows"]
    counted = (row["torchrec int B"], row["embnb int B"], row["torchrec rows B"], row["embnb rows B"])
    row["equals the count"] = counted == (count["torchrec_ints"], count["embnb_ints"], *[count["rows"]] * 2)
    row["both exact"] = run.matches("torchrec") and run.matches("reference")
    return row


def traffic_table(runs: Sequence[CWRun], sources: Sequence[str]) -> pd.DataFrame:
    """Per layout ("D = shards x width", from `sources[i]`): the bytes all ranks sent through
    all_to_all_single in one forward by each path, integers (ids, lengths, split counts) and row values,
    in total and per looked-up id, next to `wire_bytes` ("..., counted") and whether they are equal; and
    whether both paths returned the unsharded EC's rows."""
    if len(runs) != len(sources):
        raise ValueError(f"{len(runs)} runs but {len(sources)} sources")
    return pd.DataFrame([_layout_row(run, source) for run, source in zip(runs, sources)]).set_index("layout")


def planner_bytes_at(
    world_size: int,
    embedding_dims: Sequence[int],
    num_embeddings: int,
    ids_per_rank: int,
    sequences_per_rank: int,
) -> dict:
    """Per table width: the CW shards torchrec's planner makes at `world_size` ranks (`planner_cw_layout`)
    and what each path would put on the wire (`wire_bytes`) for the given batch on every rank: a count,
    no ranks run. `rows`: one dict per width."""
    rows, ids, sequences = [], ids_per_rank * world_size, sequences_per_rank * world_size
    for dim in embedding_dims:
        layout = planner_cw_layout(dim, num_embeddings, world_size)
        owners = len(set(layout.ranks))
        count = wire_bytes(len(layout.ranks), owners, dim, ids, sequences, world_size)
        row = {"embedding_dim": dim, "shard widths": layout.widths, "shard ranks": layout.ranks}
        row |= {"owner ranks": owners, "torchrec B": count["torchrec"], "embnb B": count["embnb"]}
        rows.append(row | {"torchrec / embnb": count["torchrec"] / count["embnb"]})
    sizes = {"world_size": world_size, "ids_per_rank": ids_per_rank, "sequences_per_rank": sequences_per_rank}
    return sizes | {"rows": rows}
