"""Raw ids into a torchrec table, then row-wise blocks (appendix 01a).

torchrec needs `0 <= id < num_embeddings`: `out_of_range_lookup` runs the peers on one id past the
table (torchrec's EmbeddingBagCollection raises; FBGEMM's TBE, under torchrec's fused tables, raises
with `bounds_check_mode` FATAL, logs and reads row 0 with WARNING, its default). A pipeline maps raw
ids into the table first (`aliasing.into_table`); `pipeline_table` measures what is left: the load per
rank, and how many distinct ids share a row (`id % rows` keeps the ids' common factors).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import pandas as pd
import torch

from embnb._stderr import native_stderr
from embnb.lab.rowwise.aliasing import into_table, rank_counts
from embnb.metrics import max_over_mean

__all__ = ["out_of_range_lookup", "pipeline_table", "HOWS", "PIPELINE_DIST_TYPES"]

HOWS = ("modulo", "hash")  # how ids go into the table: id % rows, fmix64(id) % rows
# After the mapping a key is a row: torchrec cuts rows into blocks (continuous);
# `row % W` shows what a modulo on top of a modulo keeps.
PIPELINE_DIST_TYPES = ("continuous", "roundrobin")
PIPELINE_COLUMNS = (
    "table_rows into_table world_size dist_type max_over_mean distinct_ids rows_used ids_sharing_a_row "
    "ids_sharing_a_row_random"
).split()


def _outcome(call) -> tuple[str, torch.Tensor | None]:
    try:
        return "returned", call()
    except Exception as error:  # the peer's own refusal is the result
        return f"raised {type(error).__name__}: {str(error).splitlines()[0][:120]}", None


def _log_message(line: str) -> str:
    """A C++ log line without its "[E1125 13:06:36.89 file.cpp:111] " prefix."""
    return line.split("] ", 1)[-1].strip()


def out_of_range_lookup(num_rows: int, bad_id: int, embedding_dim: int = 4) -> list[dict[str, str]]:
    """Look up the ids `[1, bad_id]` (one per bag) in a table of `num_rows`
    rows with torchrec's EmbeddingBagCollection and with FBGEMM's CPU TBE in
    both bounds-check modes; one `{"peer", "outcome"}` per run. A TBE run
    that returns says whether the bad id's bag equals row 0."""
    import fbgemm_gpu
    import torchrec
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import BoundsCheckMode, EmbeddingLocation
    from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
        ComputeDevice,
        SplitTableBatchedEmbeddingBagsCodegen,
    )
    from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor

    if not 0 < num_rows <= bad_id:
        raise ValueError(f"bad_id must be >= num_rows > 0, got num_rows={num_rows}, bad_id={bad_id}")
    ids, offsets = torch.tensor([1, bad_id]), torch.tensor([0, 1, 2])
    config = EmbeddingBagConfig(
        name="t", embedding_dim=embedding_dim, num_embeddings=num_rows, feature_names=["f"]
    )
    collection = EmbeddingBagCollection(tables=[config])
    kjt = KeyedJaggedTensor.from_offsets_sync(keys=["f"], values=ids, offsets=offsets)
    runs = [
        {
            "peer": f"torchrec {torchrec.__version__} EmbeddingBagCollection",
            "outcome": _outcome(lambda: collection(kjt))[0],
        }
    ]
    for mode in (BoundsCheckMode.FATAL, BoundsCheckMode.WARNING):
        spec = [(num_rows, embedding_dim, EmbeddingLocation.HOST, ComputeDevice.CPU)]
        tbe = SplitTableBatchedEmbeddingBagsCodegen(spec, bounds_check_mode=mode)
        # WARNING mode logs from C++ straight to stderr: the log is part of the outcome.
        with native_stderr() as logged:
            outcome, pooled = _outcome(lambda tbe=tbe: tbe(ids, offsets))
        if pooled is not None:
            row_zero = tbe.split_embedding_weights()[0][0]
            outcome += f"; the bad id's bag equals row 0: {bool(torch.equal(pooled[1], row_zero))}"
        outcome += "".join(f"; logged: {_log_message(line)}" for line in logged)
        peer = f"FBGEMM {fbgemm_gpu.__version__} TBE (CPU), bounds_check_mode={mode.name}"
        runs.append({"peer": peer, "outcome": outcome})
    return runs


def pipeline_table(
    keys: torch.Tensor,
    table_sizes: Iterable[int],
    world_sizes: Iterable[int],
    hows: Sequence[str] = HOWS,
    dist_types: Sequence[str] = PIPELINE_DIST_TYPES,
) -> pd.DataFrame:
    """Map `keys` into tables of each size (`into_table`, each of `hows`)
    and route the rows under `dist_types` at each world size. One row per
    (table_rows, into_table, world_size, dist_type): max/mean of rows looked
    up per rank; distinct ids, distinct rows they use, the share of the
    distinct ids whose row holds another id too, and that share had each id
    drawn its row at random (`1 - (1 - 1/rows) ** (ids - 1)`)."""
    distinct = torch.as_tensor(keys, dtype=torch.int64).unique()
    world_sizes = list(world_sizes)
    records = []
    for table_rows in table_sizes:
        for how in hows:
            rows = into_table(keys, table_rows, how)
            used, ids_per_row = into_table(distinct, table_rows, how).unique(return_counts=True)
            sharing = int(ids_per_row[ids_per_row > 1].sum()) / max(distinct.numel(), 1)
            random_sharing = 1 - (1 - 1 / table_rows) ** (distinct.numel() - 1)
            for world_size in world_sizes:
                for dist_type in dist_types:
                    counts = rank_counts(rows, world_size, dist_type, table_rows=table_rows)
                    records.append(
                        (table_rows, how, world_size, dist_type, max_over_mean(counts), distinct.numel())
                        + (used.numel(), sharing, random_sharing)
                    )
    return pd.DataFrame(records, columns=PIPELINE_COLUMNS)
