"""Notebook 02's byte count as tables: what each path sent per layout, the
same bytes next to `traffic.wire_bytes` (what each path puts on the wire),
and the sentences the notebook prints from them.

    table = traffic_table(experiment.traffic_runs, experiment.traffic_sources)
    traffic_check_table(table, world_size=2)["all equal"]
    for line in traffic_findings(table): print(line)
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from embnb.lab.columnwise.cases import CWRun, make_batches
from embnb.lab.columnwise.torchrec_layouts import planner_cw_layout
from embnb.lab.columnwise.traffic import wire_bytes

__all__ = [
    "traffic_table",
    "traffic_check_table",
    "traffic_findings",
    "planner_bytes_at",
    "planner_bytes_sentence",
]

FEATURE = "f0"  # the traffic runs' one feature, of table "t0"
PATHS = (("torchrec", "torchrec"), ("embnb", "reference"))  # (name in the table, CWRun path)


def _layout_row(run: CWRun, source: str) -> dict:
    ranks, widths = run.case.placements["t0"], run.case.shard_widths("t0")
    batches = make_batches(run.case)
    ids = sum(len(b[FEATURE][1]) for b in batches)
    row = {
        "layout": f"{run.case.embedding_dim} = {len(ranks)} x {widths[0]}",
        "source": source,
        "embedding_dim": run.case.embedding_dim,
        "shards": len(ranks),
        "shard width": widths[0],
        "owner ranks": len(set(ranks)),
        "ids": ids,
        "sequences": sum(len(b[FEATURE][0]) for b in batches),
    }
    for name, path in PATHS:
        per_rank = run.traffic(path)
        row[f"{name} int B"] = sum(r["int_bytes"] for r in per_rank)
        row[f"{name} rows B"] = sum(r["float_bytes"] for r in per_rank)
        row[f"{name} B"] = row[f"{name} int B"] + row[f"{name} rows B"]
    row["torchrec / embnb"] = row["torchrec B"] / row["embnb B"]
    for name, _ in PATHS:
        row[f"{name} int B/id"] = row[f"{name} int B"] / ids
    row["rows B/id"] = row["embnb rows B"] / ids
    row["torchrec int / rows"] = row["torchrec int B"] / row["torchrec rows B"]
    row["2 / shard width"] = 2 / widths[0]
    row["both exact"] = run.torchrec_matches() and run.reference_matches()
    return row


def traffic_table(runs: Sequence[CWRun], sources: Sequence[str]) -> pd.DataFrame:
    """Per layout ("D = shards x width"; `sources[i]` says where run i's
    layout comes from): the bytes all ranks sent through all_to_all_single in
    one forward, by torchrec's path and embnb's: integers (ids, lengths, split
    counts) and row values, in total and per looked-up id; and whether both
    paths returned the unsharded EmbeddingCollection's rows."""
    if len(runs) != len(sources):
        raise ValueError(f"{len(runs)} runs but {len(sources)} sources")
    return pd.DataFrame([_layout_row(run, source) for run, source in zip(runs, sources)]).set_index("layout")


def traffic_check_table(table: pd.DataFrame, world_size: int) -> pd.DataFrame:
    """The counted bytes of `traffic_table` next to `traffic.wire_bytes`,
    the count of what each path puts on the wire (int64 ids and lengths,
    fp32 rows)."""
    rows = []
    for layout, row in table.iterrows():
        model = wire_bytes(
            row["shards"], row["owner ranks"], row["embedding_dim"], row["ids"], row["sequences"], world_size
        )
        torchrec_ints = model.torchrec_ids + model.torchrec_lengths + model.torchrec_splits
        embnb_ints = model.embnb_ids + model.embnb_counts
        rows.append(
            {
                "layout": layout,
                "torchrec ints: counted": row["torchrec int B"],
                "ids + lengths + splits": torchrec_ints,
                "embnb ints: counted": row["embnb int B"],
                "ids + counts": embnb_ints,
                "rows: counted, each path": row["embnb rows B"],
                "ids x D x 4 B": model.rows,
                "all equal": bool(
                    row["torchrec int B"] == torchrec_ints
                    and row["embnb int B"] == embnb_ints
                    and row["torchrec rows B"] == row["embnb rows B"] == model.rows
                ),
            }
        )
    return pd.DataFrame(rows).set_index("layout")


def _span(values: pd.Series, fmt: str) -> str:
    low, high = format(values.min(), fmt), format(values.max(), fmt)
    return low if low == high else f"{low} to {high}"


def traffic_findings(table: pd.DataFrame) -> list[str]:
    """What the byte count shows, as sentences built from `table`'s numbers."""
    lines = []
    same_ids = table[table["shards"] == table["owner ranks"]]
    for layout, row in same_ids.iterrows():
        lines.append(
            f"{layout}: {row['shards']} shards on {row['owner ranks']} owner ranks, so both paths send each "
            f"id {row['shards']} times; torchrec's {row['torchrec / embnb']:.4f}x embnb's bytes is its "
            f"lengths and split counts ({row['torchrec int B'] - row['embnb int B']:,} B)."
        )
    for source, part in table.groupby("source", sort=False):
        widths = _span(part["shard width"], "d")
        lines.append(
            f"{source} layouts (shards of {widths} columns): torchrec sends "
            f"{_span(part['torchrec / embnb'], '.4f')}x embnb's bytes; its integers are "
            f"{_span(part['torchrec int / rows'], '.1%')} of its row bytes (2 / shard width: "
            f"{_span(part['2 / shard width'], '.1%')})."
        )
    return lines


def planner_bytes_at(
    world_size: int,
    embedding_dims: Sequence[int],
    num_embeddings: int,
    ids_per_rank: int,
    sequences_per_rank: int,
) -> pd.DataFrame:
    """Per table width: the column-wise shards torchrec's own planner makes
    at `world_size` ranks (`planner_cw_layout`, a plan, no ranks launched)
    and what each path would put on the wire for a batch of
    `sequences_per_rank` sequences and `ids_per_rank` ids on every rank
    (`traffic.wire_bytes`: a count, not a measurement)."""
    rows = []
    for dim in embedding_dims:
        layout = planner_cw_layout(dim, num_embeddings, world_size)
        owners = len(set(layout.ranks))
        model = wire_bytes(
            len(layout.ranks),
            owners,
            dim,
            ids_per_rank * world_size,
            sequences_per_rank * world_size,
            world_size,
        )
        rows.append(
            {
                "embedding_dim": dim,
                "shard widths": layout.widths,
                "shard ranks": layout.ranks,
                "owner ranks": owners,
                "torchrec B": model.torchrec,
                "embnb B": model.embnb,
                "torchrec / embnb": model.torchrec / model.embnb,
            }
        )
    return pd.DataFrame(rows).set_index("embedding_dim")


def planner_bytes_sentence(table: pd.DataFrame, world_size: int) -> str:
    """What the count at torchrec's own layouts shows, from its numbers."""
    distinct = bool((table["owner ranks"] == table["shard widths"].map(len)).all())
    where = "every shard on a rank of its own" if distinct else "some ranks holding several shards"
    return (
        f"At W={world_size} with torchrec's planner layouts ({where}; counted, no ranks run), torchrec's "
        f"path sends {_span(table['torchrec / embnb'], '.4f')}x embnb's bytes"
    )
