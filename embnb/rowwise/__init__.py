"""Technique 1: row-wise routing (modulo aliasing, `hash_roundrobin`), a sharded KV table, checkpoints,
and torchrec sharders with a routing per table (docs/architecture.md lists the modules; none imports
pandas or matplotlib). Notebook 01's experiments, figures and widgets live in `embnb.lab.rowwise`.

    from embnb.rowwise import bucketize, owner_rank
    from embnb.rowwise import RoutedEmbeddingBagCollectionSharder
"""

import importlib

from embnb.rowwise.kv import ShardedKVTable
from embnb.rowwise.layout import Routing, TableLayout, convert_rows
from embnb.rowwise.routing import Bucketized, DistType, bucketize, hash_key, owner_rank

_LAZY = {  # name -> the module that defines it: each imports torchrec
    **dict.fromkeys(
        [
            "RoutedEmbeddingBagCollectionSharder",
            "RoutedShardedEmbeddingBagCollection",
            "RoutedEmbeddingCollectionSharder",
            "RoutedShardedEmbeddingCollection",
            "RoutingMismatch",
        ],
        "sharders",
    ),
    "RoutedFeaturesDist": "input_dist",
    "gather_rows": "sharded_rows",
    "load_rows": "sharded_rows",
    "load_resharded": "dcp_rows",
    "read_rows": "dcp_rows",
}
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
    *_LAZY,
]


def __getattr__(name: str):
    """The `_LAZY` names import torchrec: each loads its module on first use, so `embnb.rowwise` stays
    light."""
    if name not in _LAZY:
        raise AttributeError(f"module 'embnb.rowwise' has no attribute {name!r}")
    return getattr(importlib.import_module(f"embnb.rowwise.{_LAZY[name]}"), name)
