"""Native kernels: C++ (CPU) and CUDA sources registered as `torch.ops.embnb.*`.

The folder is named for the extension's GPU kernels; like FBGEMM's
`fbgemm_gpu`, it holds their CPU twins and the CPU-only ops too.

`python -m embnb.cuda build` (which `make setup` runs) builds them once per
host (cached by source hash); `embnb.cuda.loader.load()` loads them, building
them on first use where they are missing, except in the planner: `plan()`
never compiles. `embnb.rowwise.routing.bucketize` calls it for you. Ops:

- `torch.ops.embnb.bucketize(lengths, indices, world_size, dist_types,
  block_sizes, weights=None) -> (lengths, indices, unbucketize_permute,
  weights)`: `dist_types` holds one code per feature (0 continuous,
  1 roundrobin, 2 hash_roundrobin), `block_sizes` one size per feature
  (read for continuous features only). Bit-identical to
  `embnb.rowwise.routing.bucketize(..., native=False)`.
- `torch.ops.embnb.karmarkar_karp(workloads, num_parts, equal_size, refine)
  -> (order, sizes)`: the partition of `embnb.balancing.partition`, computed without
  holding the GIL (CPU only), identical to the Python version.
- `torch.ops.embnb.knapsack_step(...)` and `knapsack_run(...)`: the DP
  proposer's knapsack on one memory axis (`embnb.planner.knapsack.Knapsack`),
  the same states as its numpy version.
- `torch.ops.embnb.greedy_place(choice, ...) -> (status, loads, ranks, rating)`:
  torchrec's GreedyPerfPartitioner and NoopPerfModel (or embnb's
  KernelCallPerfModel) for one plan of uniform and device-placed options
  (`embnb.planner.replica.GreedyPerfReplica`), ratings equal to the model's
  to the bit.
"""
