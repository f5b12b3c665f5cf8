"""Technique 1: row-wise routing (modulo aliasing, `hash_roundrobin`), a sharded KV table, checkpoints.

The library (what this package exports; none of it imports pandas or matplotlib):

- `routing`: `DistType`, `owner_rank`, `hash_key` and `bucketize` (the
  all-to-all input of a KeyedJaggedTensor's keys, native kernels on CPU and CUDA);
- `kv`: `ShardedKVTable`, a row-wise sharded key-value embedding table;
- `checkpoint`: its checkpoint, with the routing mode saved and checked.

Notebook 01's experiments, figures and widgets live in `embnb.lab.rowwise`.

    from embnb.rowwise import bucketize, owner_rank
"""

from embnb.rowwise.kv import ShardedKVTable
from embnb.rowwise.routing import Bucketized, DistType, bucketize, hash_key, owner_rank

__all__ = ["DistType", "owner_rank", "hash_key", "bucketize", "Bucketized", "ShardedKVTable"]
