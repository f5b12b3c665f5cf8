"""Technique 1: row-wise routing (modulo aliasing, `hash_roundrobin`), a sharded KV table, checkpoints."""
