"""The routing rule in plain Python ints, as notebook 01's page writes it: the tests' own oracle for
`embnb.rowwise.routing` (int64 tensors, where multiplication wraps and `>>` drags the sign bit)."""

MASK64 = (1 << 64) - 1  # keep the low 64 bits: uint64 arithmetic


def fmix64(key: int) -> int:
    """MurmurHash3's 64-bit finalizer (no seed), as dynamicemb hashes keys."""
    x = key & MASK64  # the key's unsigned 64-bit pattern
    x ^= x >> 33
    x = (x * 0xFF51AFD7ED558CCD) & MASK64
    x ^= x >> 33
    x = (x * 0xC4CEB9FE1A85EC53) & MASK64
    x ^= x >> 33
    return x


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
