"""Technique 2: column-wise sharding of sequence embeddings and its permute indices."""
