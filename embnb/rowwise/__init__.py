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

import importlib

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

_LAZY = {  # name -> the module that defines it
    **dict.fromkeys(_SHARDERS, "sharders"),
    "gather_rows": "sharded_rows",
    "load_rows": "sharded_rows",
    "load_resharded": "dcp_rows",
    "read_rows": "dcp_rows",
    "RoutedFeaturesDist": "input_dist",
}


def __getattr__(name: str):
    """The `_LAZY` names import torchrec: each loads its module on first use, so `embnb.rowwise` stays
    light."""
    if name not in _LAZY:
        raise AttributeError(f"module 'embnb.rowwise' has no attribute {name!r}")
    return getattr(importlib.import_module(f"embnb.rowwise.{_LAZY[name]}"), name)
