"""embnb: sharded embedding techniques, run for real on torchrec."""

__version__ = "0.1.0"
