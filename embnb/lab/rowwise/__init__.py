"""Notebook 01's layer over `embnb.rowwise` (import each from its module):

- `reference`: the routing rule in plain Python (fmix64, owner rank), the
  rule the tests check the fast paths against, and `page_core_agrees`: the
  same rule written on the notebook's page, checked against the library;
- `aliasing`: key streams through each routing mode, load per rank;
- `hot_keys`: Zipf keys, and where the hot-key floor binds;
- `table_ids`: ids mapped into a table's rows before continuous blocks;
- `kv_experiment`: the sharded KV table's runs (checkpoint reloads, loaders);
- `kernel_timing`: the bucketize kernels against FBGEMM's;
- `routed_loads`: torchrec row-wise tables under embnb's sharders' routings: a DMP job,
  and each rank's ids and lookup time replayed rank by rank (`embnb.steptime`);
- `plots` and `widgets`: the figures and the load explorer.
"""
