"""Notebook 02's byte count: what each path sent per layout (recorded by `cases.recorded_all_to_all`), the
count of what each path puts on the wire (`wire_bytes`) next to it, and the same count at the layouts
torchrec's planner makes on more ranks (`planner_bytes_at`: a count, no ranks run)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pandas as pd

from embnb._checks import check_int
from embnb.lab.columnwise.cases import CWRun, make_batches
from embnb.lab.columnwise.torchrec_layouts import planner_cw_layout

PATHS = (("torchrec", "torchrec"), ("embnb", "reference"))  # (name in the tables, CWRun path)


@dataclass(frozen=True)
class WireBytes:
    """Bytes all ranks send in one forward of one CW table, by what they are."""

    torchrec_ids: int  # every id once per shard (KJTAllToAll treats a shard as a table)
    torchrec_lengths: int  # every sequence's length once per shard
    torchrec_splits: int  # per rank and destination: lengths, values and stride counts
    embnb_ids: int  # every id once per owner rank
    embnb_counts: int  # per rank and destination: one id count
    rows: int  # every looked-up id's full row, either path

    @property
    def torchrec(self) -> int:
        return self.torchrec_ids + self.torchrec_lengths + self.torchrec_splits + self.rows

    @property
    def embnb(self) -> int:
        return self.embnb_ids + self.embnb_counts + self.rows


def wire_bytes(
    shards: int, owner_ranks: int, embedding_dim: int, ids: int, sequences: int, world_size: int
) -> WireBytes:
    """What each path puts on the wire for `ids` in `sequences` (all ranks) in a table of `embedding_dim`
    columns cut into `shards` shards on `owner_ranks` of `world_size` ranks: int64 ids, lengths and counts,
    fp32 rows. Per id: `shards` x 8 B of ids for torchrec, `owner_ranks` x 8 B for embnb, D x 4 B of rows."""
    for name, value in (("shards", shards), ("owner_ranks", owner_ranks), ("world_size", world_size)):
        check_int(name, value, low=1)
    if owner_ranks > min(shards, world_size):
        raise ValueError(f"owner_ranks {owner_ranks} > min(shards {shards}, world_size {world_size})")
    pairs = world_size * world_size  # (sender, destination)
    return WireBytes(
        8 * shards * ids,
        8 * shards * sequences,
        8 * 3 * pairs,
        8 * owner_ranks * ids,
        8 * pairs,
        4 * ids * embedding_dim,
    )


def _layout_row(run: CWRun, source: str) -> dict:
    ranks, width = run.case.placements["t0"], run.case.shard_widths("t0")[0]
    batches = make_batches(run.case)
    ids = sum(len(b["f0"][1]) for b in batches)
    row = {"layout": f"{run.case.embedding_dim} = {len(ranks)} x {width}", "source": source}
    row.update({"embedding_dim": run.case.embedding_dim, "shards": len(ranks), "shard width": width})
    row.update(
        {"owner ranks": len(set(ranks)), "ids": ids, "sequences": sum(len(b["f0"][0]) for b in batches)}
    )
    for name, path in PATHS:
        per_rank = run.traffic(path)
        row[f"{name} int B"] = sum(r["int_bytes"] for r in per_rank)
        row[f"{name} rows B"] = sum(r["float_bytes"] for r in per_rank)
        row[f"{name} B"] = row[f"{name} int B"] + row[f"{name} rows B"]
        row[f"{name} all-to-alls"] = max(r["calls"] for r in per_rank)  # per rank, one forward
    row["torchrec / embnb"] = row["torchrec B"] / row["embnb B"]
    row.update({f"{name} int B/id": row[f"{name} int B"] / ids for name, _ in PATHS})
    row["rows B/id"] = row["embnb rows B"] / ids
    row["torchrec int / rows"] = row["torchrec int B"] / row["torchrec rows B"]
    row["2 / shard width"] = 2 / width
    row["both exact"] = run.matches("torchrec") and run.matches("reference")
    return row


def traffic_table(runs: Sequence[CWRun], sources: Sequence[str]) -> pd.DataFrame:
    """Per layout ("D = shards x width", from `sources[i]`): the bytes all ranks sent through
    all_to_all_single in one forward by each path, integers (ids, lengths, split counts) and row values,
    in total and per looked-up id; and whether both paths returned the unsharded EC's rows."""
    if len(runs) != len(sources):
        raise ValueError(f"{len(runs)} runs but {len(sources)} sources")
    return pd.DataFrame([_layout_row(run, source) for run, source in zip(runs, sources)]).set_index("layout")


def traffic_check_table(table: pd.DataFrame, world_size: int) -> pd.DataFrame:
    """The counted bytes of `traffic_table` next to `wire_bytes`."""
    rows = []
    for layout, row in table.iterrows():
        count = wire_bytes(*row[["shards", "owner ranks", "embedding_dim", "ids", "sequences"]], world_size)
        counted = (row["torchrec int B"], row["embnb int B"], row["embnb rows B"])
        ints = (count.torchrec - count.rows, count.embnb - count.rows)
        rows.append(
            {
                "layout": layout,
                "torchrec ints: counted": counted[0],
                "ids + lengths + splits": ints[0],
                "embnb ints: counted": counted[1],
                "ids + counts": ints[1],
                "rows: counted, each path": counted[2],
                "ids x D x 4 B": count.rows,
                "all equal": counted == (*ints, count.rows) and row["torchrec rows B"] == count.rows,
            }
        )
    return pd.DataFrame(rows).set_index("layout")


@dataclass
class PlannerBytes:
    """The byte count at torchrec's own planner layouts on `world_size` ranks (counted, no ranks run)."""

    world_size: int
    ids_per_rank: int
    sequences_per_rank: int
    rows: list[dict]  # per table width: the planner's shards and what each path would send

    def table(self) -> pd.DataFrame:
        return pd.DataFrame(self.rows).set_index("embedding_dim")


def planner_bytes_at(
    world_size: int,
    embedding_dims: Sequence[int],
    num_embeddings: int,
    ids_per_rank: int,
    sequences_per_rank: int,
) -> PlannerBytes:
    """Per table width: the CW shards torchrec's planner makes at `world_size` ranks (`planner_cw_layout`)
    and what each path would put on the wire (`wire_bytes`) for the given batch on every rank."""
    rows = []
    for dim in embedding_dims:
        layout = planner_cw_layout(dim, num_embeddings, world_size)
        owners = len(set(layout.ranks))
        ids, sequences = ids_per_rank * world_size, sequences_per_rank * world_size
        count = wire_bytes(len(layout.ranks), owners, dim, ids, sequences, world_size)
        rows.append(
            {"embedding_dim": dim, "shard widths": layout.widths, "shard ranks": layout.ranks}
            | {"owner ranks": owners, "torchrec B": count.torchrec, "embnb B": count.embnb}
            | {"torchrec / embnb": count.torchrec / count.embnb}
        )
    return PlannerBytes(world_size, ids_per_rank, sequences_per_rank, rows)
