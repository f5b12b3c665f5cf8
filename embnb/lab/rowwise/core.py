"""Notebook 01's check of the routing rule its page writes in plain Python integers (`page_core_agrees`:
Python's unbounded ints make the uint64 arithmetic explicit that `embnb.rowwise.routing` does on wrapping
int64 tensors), and a jump consistent hash to contrast with `% W`.
"""

from __future__ import annotations

MASK64 = (1 << 64) - 1  # keep the low 64 bits: uint64 arithmetic


def jump_bucket(key: int, num_buckets: int) -> int:
    """Jump consistent hash (Lamping and Veach, 2014): a bucket in
    [0, num_buckets) such that going from n to n + 1 buckets moves only the
    keys that land in the new bucket, about 1/(n + 1) of them. Not a routing
    mode of embnb or dynamicemb: the contrast to `% W` when resharding."""
    if num_buckets < 1:
        raise ValueError(f"num_buckets must be >= 1, got {num_buckets}")
    key &= MASK64
    bucket, jump = -1, 0
    while jump < num_buckets:
        bucket = jump
        key = (key * 2862933555777941757 + 1) & MASK64  # the paper's 64-bit LCG
        jump = int((bucket + 1) * ((1 << 31) / ((key >> 33) + 1)))
    return bucket


def page_core_agrees(
    page_fmix64, page_owner, keys: list[int], world_sizes: list[int], block_size: int
) -> dict:
    """Whether the routing written on notebook 01's page (`page_fmix64(key)`,
    `page_owner(key, world_size, dist_type, block_size)`, plain ints) agrees
    with the library on the same keys (non-negative, below 2**63): the hash
    with `embnb.rowwise.hash_key` (its 64 bits read unsigned), the owner
    with `embnb.rowwise.owner_rank` for each dist_type at each world size."""
    import torch

    from embnb.rowwise import hash_key, owner_rank

    if not keys or min(keys) < 0 or max(keys) >= 1 << 63:
        raise ValueError("keys must be a non-empty list of ints in [0, 2**63)")
    tensor = torch.tensor(keys, dtype=torch.int64)
    checks = {"fmix64": [page_fmix64(k) for k in keys] == [h & MASK64 for h in hash_key(tensor).tolist()]}
    for dist_type in ("continuous", "roundrobin", "hash_roundrobin"):
        checks[dist_type] = all(
            [page_owner(k, w, dist_type, block_size) for k in keys]
            == owner_rank(tensor, w, dist_type, block_size).tolist()
            for w in world_sizes
        )
    return checks
