"""Native kernels: C++ (CPU) and CUDA sources registered as `torch.ops.embnb.*`.

`embnb.native.loader.load()` builds them on first use (cached by source hash)
and loads them; `embnb.rowwise.routing.bucketize` calls it for you. Ops:

- `torch.ops.embnb.bucketize(lengths, indices, world_size, dist_types,
  block_sizes, weights=None) -> (lengths, indices, unbucketize_permute,
  weights)`: `dist_types` holds one code per feature (0 continuous,
  1 roundrobin, 2 hash_roundrobin), `block_sizes` one size per feature
  (read for continuous features only). Bit-identical to
  `embnb.rowwise.routing.bucketize(..., impl="reference")`.
- `torch.ops.embnb.karmarkar_karp(workloads, num_parts, equal_size, refine)
  -> (order, sizes)`: the partition of `embnb.balancing.partition`, computed without
  holding the GIL (CPU only), identical to the Python version.
"""
