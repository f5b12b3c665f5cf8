"""The routing rule in plain Python ints, as notebook 01's page writes it: the tests' own oracle for
`embnb.rowwise.routing` (int64 tensors, where multiplication wraps and `>>` drags the sign bit)."""

from embnb.lab.rowwise.core import MASK64, fmix64


def owner_of(key: int, world_size: int, dist_type: str, block_size: int = 0) -> int:
    """The rank that stores `key`'s row."""
    if dist_type == "roundrobin":
        return (key & MASK64) % world_size
    if dist_type == "hash_roundrobin":
        return fmix64(key) % world_size
    if dist_type == "continuous":  # torchrec/FBGEMM blocks; keys past the last block wrap
        block = key // block_size
        return block if block < world_size else key % world_size
    raise ValueError(f"dist_type {dist_type!r} is not one of roundrobin, hash_roundrobin, continuous")
