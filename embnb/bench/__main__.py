"""Dispatch `python -m embnb.bench NAME ...` to embnb.bench.NAME.main."""

import importlib
import pkgutil
import sys

import embnb.bench


def _names() -> list[str]:
    skip = {"results", "plans", "calibrate_training", "__main__"}  # parts of benches, not benches
    return sorted(m.name for m in pkgutil.iter_modules(embnb.bench.__path__) if m.name not in skip)


def main(argv: list[str]) -> int:
    names = _names()
    if not argv or argv[0] not in names:
        got = repr(argv[0]) if argv else "nothing"
        print(f"usage: python -m embnb.bench {{{','.join(names)}}} [options]; got {got}", file=sys.stderr)
        return 2
    return importlib.import_module(f"embnb.bench.{argv[0]}").main(argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
