"""Measured, not estimated: each rank's step with real kernels, rank by rank."""
