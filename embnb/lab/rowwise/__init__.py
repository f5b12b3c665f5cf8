"""Notebook 01's layer over `embnb.rowwise` (import each from its module): `reference` (the routing
rule in plain ints), `aliasing` and `hot_keys` (keys per rank under each mode), `table_ids` (ids into a
table first), `kv_experiment` (the sharded KV table on real ranks, the results JSON), `kernel_timing`
(bucketize against FBGEMM), `routed_loads` (torchrec row-wise tables under embnb's sharders), `plots`
and `widgets`.
"""
