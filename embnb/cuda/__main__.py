"""`python -m embnb.cuda build`: build the native extension for this host's
torch, Python and GPUs into the cache (`$EMBNB_EXT_DIR`, default
`~/.cache/embnb`) and load it once; where it is built already, only load it.
`make setup` runs it. Run it once per host before a job: the planner's
`plan()` never compiles (where the library is missing it says to run this,
once, and plans with its Python versions). Processes building at once share
one build (a file lock beside the build folder); exit status 1 with the reason
(a missing compiler or ninja, a compile error) when it does not build."""

from __future__ import annotations

import sys

from embnb.cuda import loader

USAGE = "usage: python -m embnb.cuda build"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args != ["build"]:
        print(f"{USAGE} (got {' '.join(args) or 'no command'})", file=sys.stderr)
        return 2
    try:
        native = loader.load()
    except loader.NativeUnavailable as error:
        print(
            f"embnb: the native extension did not build: {error}. Until it does, embnb runs its "
            f"pure-torch and Python versions (the same results, slower).",
            file=sys.stderr,
        )
        return 1
    kernels = "CPU and CUDA" if native.cuda else "CPU"
    print(f"embnb: native extension ready ({kernels} kernels): {native.library}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
