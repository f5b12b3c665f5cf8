"""Notebook 01's layer over `embnb.rowwise` (import each from its module):

- `reference`: the routing rule in plain Python (fmix64, owner rank), the
  version the notebook shows and the tests check the fast paths against;
- `aliasing`: key streams through each routing mode, load per rank;
- `hot_keys`: Zipf keys, and where the hot-key floor binds;
- `table_ids`: ids mapped into a table's rows before continuous blocks;
- `kv_experiment`: the sharded KV table's runs (checkpoint reloads, loaders);
- `kernel_timing`: the bucketize kernels against FBGEMM's;
- `measured`: each owner's lookups run rank by rank (`embnb.steptime`), time beside ids;
- `plots` and `widgets`: the figures and the load explorer.
"""
