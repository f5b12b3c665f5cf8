"""Benchmarks: `python -m embnb.bench NAME [options]`.

Each NAME is a module in this package with a `main(argv) -> int`. Speed is
always reported as a ratio against a peer measured in the same run; results
are written as JSON under benchmarks/results/ with the date and machine.
"""
