"""Technique 1: row-wise routing (modulo aliasing, `hash_roundrobin`), a sharded KV table, checkpoints,
and torchrec sharders with a routing per table.

The library (what this package exports; none of it imports pandas or matplotlib):

- `routing`: `DistType`, `owner_rank`, `hash_key` and `bucketize` (the
  all-to-all input of a KeyedJaggedTensor's keys, native kernels on CPU and CUDA);
  `hashing`: the keyed hashes it routes with (fmix64, the Feistel bijection);
- `kv`: `ShardedKVTable`, a row-wise sharded key-value embedding table;
- `checkpoint`: its checkpoint, with the routing mode saved and checked;
- `layout`: `Routing` and `TableLayout` (where each id's row lives in a
  torchrec row-wise table), `convert_rows` (a checkpoint's rows from one
  (W, routing) to another);
- `sharders`: `RoutedEmbeddingBagCollectionSharder` and
  `RoutedEmbeddingCollectionSharder`, torchrec's row-wise sharding with a
  routing per table (`routed`: what the two share; `input_dist`:
  `RoutedFeaturesDist`, their row-wise input distribution, embnb's bucketize
  then torchrec's all-to-all); `sharded_rows`: `gather_rows`, `load_rows`;
  `dcp_rows`: a routed table in a DCP checkpoint, `load_resharded` into any
  (W, routing) and `read_rows` in id order for serving.

Notebook 01's experiments, figures and widgets live in `embnb.lab.rowwise`.

    from embnb.rowwise import bucketize, owner_rank
    from embnb.rowwise import RoutedEmbeddingBagCollectionSharder
"""

from embnb.rowwise.kv import ShardedKVTable
from embnb.rowwise.layout import Routing, TableLayout, convert_rows
from embnb.rowwise.routing import Bucketized, DistType, bucketize, hash_key, owner_rank

__all__ = [
    "DistType",
    "owner_rank",
    "hash_key",
    "bucketize",
    "Bucketized",
    "ShardedKVTable",
    "Routing",
    "TableLayout",
    "convert_rows",
    "RoutedEmbeddingBagCollectionSharder",
    "RoutedShardedEmbeddingBagCollection",
    "RoutedEmbeddingCollectionSharder",
    "RoutedShardedEmbeddingCollection",
    "RoutingMismatch",
    "RoutedFeaturesDist",
    "gather_rows",
    "load_rows",
    "load_resharded",
    "read_rows",
]


_SHARDERS = (
    "RoutedEmbeddingBagCollectionSharder",
    "RoutedShardedEmbeddingBagCollection",
    "RoutedEmbeddingCollectionSharder",
    "RoutedShardedEmbeddingCollection",
    "RoutingMismatch",
)


def __getattr__(name: str):
    """The sharders import torchrec: loaded on first use, so `embnb.rowwise` stays light."""
    if name in _SHARDERS:
        from embnb.rowwise import sharders

        return getattr(sharders, name)
    if name in ("gather_rows", "load_rows"):
        from embnb.rowwise import sharded_rows

        return getattr(sharded_rows, name)
    if name in ("load_resharded", "read_rows"):
        from embnb.rowwise import dcp_rows

        return getattr(dcp_rows, name)
    if name == "RoutedFeaturesDist":
        from embnb.rowwise import input_dist

        return input_dist.RoutedFeaturesDist
    raise AttributeError(f"module 'embnb.rowwise' has no attribute {name!r}")
