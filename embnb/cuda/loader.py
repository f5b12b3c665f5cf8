"""Build the native extension and load its torch ops.

`python -m embnb.cuda build` (which `make setup` runs) builds it once per
host; `load()` builds it on first use where it is missing, except in the
planner, which loads with `build=False`: `plan()` never compiles (a job's
ranks would each compile on their trainer host). Where the library is
missing the planner warns once, naming the build command, and plans with
its Python versions (the same plans).

The extension is one shared library made of the sources listed below; each
source registers its own ops with `TORCH_LIBRARY_FRAGMENT(embnb, m)` (and
`TORCH_LIBRARY_IMPL(embnb, CPU/CUDA, m)`), so they appear as
`torch.ops.embnb.*` once `load()` has run. To add a kernel: put the file in
this folder and append its name to `CPU_SOURCES` (always built) or
`CUDA_SOURCES` (built only when torch has CUDA, nvcc is found and there is
a GPU to build for). Headers (*.h, *.cuh) here need no listing: they are
hashed with the sources.

The build goes to `$EMBNB_EXT_DIR` (default `~/.cache/embnb`), in a folder
named by a hash of every source and header here, the torch, CUDA and Python
versions, the flags and the GPU architectures built for: it is rebuilt only
when one of those changes, and a built library is loaded without any
compiler. `CXX` picks the C++ compiler; without it (or without ninja) the
build fails at once with a message that says what to install. Processes
building at once (the ranks of a job on one host) share one build: a file
lock next to the build folder lets one compile while the others wait, then
load what it built.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import logging
import os
import pathlib
import platform
import shutil
import sys
import threading
import warnings

import torch

from embnb._checks import check_native

HERE = pathlib.Path(__file__).resolve().parent
NAME = "embnb_native"
CPU_SOURCES = ["bucketize_cpu.cpp", "feistel.cpp", "greedy_place.cpp", "karmarkar_karp.cpp", "knapsack.cpp"]
CUDA_SOURCES = ["bucketize_cuda.cpp", "bucketize_cuda.cu", "feistel_cuda.cpp", "feistel_cuda.cu"]
HEADER_SUFFIXES = (".h", ".cuh")
BUILD_COMMAND = "python -m embnb.cuda build"
CFLAGS = ["-O3", "-fopenmp"]
CUDA_CFLAGS = ["-O3"]


class NativeUnavailable(RuntimeError):
    """The extension could not be built or loaded; the message says why."""


@dataclasses.dataclass(frozen=True)
class Native:
    library: pathlib.Path  # the loaded shared library
    cuda: bool  # whether it holds the CUDA kernels


_lock = threading.Lock()
_loaded: Native | None = None
_failure: str | None = None  # why the build failed, raised again
_warned = False


def cache_root() -> pathlib.Path:
    if os.environ.get("EMBNB_EXT_DIR"):
        return pathlib.Path(os.environ["EMBNB_EXT_DIR"]).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME") or pathlib.Path.home() / ".cache"
    return pathlib.Path(xdg) / "embnb"


def with_cuda() -> bool:
    """Build the CUDA sources: torch has CUDA, nvcc is found and there is a
    GPU to build for (a visible one, or TORCH_CUDA_ARCH_LIST). Without one
    torch cannot pick an architecture, and a failed CUDA build would cost
    the CPU kernels too: they are one library."""
    if torch.version.cuda is None:
        return False
    if not (torch.cuda.is_available() or os.environ.get("TORCH_CUDA_ARCH_LIST")):
        return False
    return quiet_cpp_extension().CUDA_HOME is not None


def quiet_cpp_extension():
    """torch.utils.cpp_extension, its import-time log held back: a CUDA build
    of torch without a GPU logs "No CUDA runtime is found" when imported,
    which concerns only CUDA builds, and `with_cuda` rules those out here.
    Import it this way before anything that imports it (torch.utils.benchmark)."""
    logger = logging.getLogger("torch.utils.cpp_extension")  # the module's own logger
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        from torch.utils import cpp_extension
    finally:
        logger.setLevel(level)
    return cpp_extension


def cuda_targets(cuda: bool) -> str | list[tuple[int, int]] | None:
    """The GPU architectures a CUDA build is for: TORCH_CUDA_ARCH_LIST, else
    those of the visible GPUs (what torch's build picks)."""
    if not cuda:
        return None
    return os.environ.get("TORCH_CUDA_ARCH_LIST") or sorted(
        {torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())}
    )


def sources(cuda: bool) -> list[pathlib.Path]:
    names = CPU_SOURCES + (CUDA_SOURCES if cuda else [])
    return [HERE / name for name in names]


def build_dir(cuda: bool | None = None) -> pathlib.Path:
    """The cache folder for the current sources, versions and flags."""
    cuda = with_cuda() if cuda is None else cuda
    digest = hashlib.sha256()
    headers = sorted(p for p in HERE.iterdir() if p.suffix in HEADER_SUFFIXES)
    for path in sources(cuda) + headers:
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    for part in (
        torch.__version__,
        torch.version.cuda,
        sys.version,
        platform.machine(),
        CFLAGS,
        CUDA_CFLAGS,
        cuda,
        cuda_targets(cuda),
    ):
        digest.update(repr(part).encode() + b"\0")
    return cache_root() / f"{NAME}-{digest.hexdigest()[:16]}"


def missing_tools() -> str | None:
    """What the build needs and this host lacks (the C++ compiler torch runs,
    `$CXX` or c++, and ninja), said with what to do; None when both are found."""
    if shutil.which("ninja") is None:  # pip's ninja sits next to python
        bindir = str(pathlib.Path(sys.executable).parent)
        os.environ["PATH"] = bindir + os.pathsep + os.environ.get("PATH", "")
    cxx = os.environ.get("CXX") or "c++"
    if shutil.which(cxx) is None:
        named = f"CXX={cxx}" if os.environ.get("CXX") else "c++ (torch's default; CXX is unset)"
        return (
            f"no C++ compiler: {named} is not found on PATH. Install one (for example "
            f"`apt-get install g++`) or set CXX to a compiler's path, then run `{BUILD_COMMAND}`"
        )
    if shutil.which("ninja") is None:
        return (
            f"ninja, which torch's extension build runs, is not found on PATH or next to {sys.executable}. "
            f"Install it (`pip install ninja`; requirements.txt pins it), then run `{BUILD_COMMAND}`"
        )
    return None


@contextlib.contextmanager
def build_lock(directory: pathlib.Path, exclusive: bool):
    """A file lock beside `directory` (`<name>.lock`): exclusive while one
    process checks for the library and builds it, shared while one loads it,
    so no process loads a library another is still linking. The kernel drops
    it when its holder dies, so a killed build leaves no lock behind. Where
    the lock file cannot be made (a read-only cache) loading goes on without."""
    path = directory.parent / f"{directory.name}.lock"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle = open(path, "a")
    except OSError:
        if exclusive:
            raise
        yield
        return
    with handle:
        mode = fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH
        try:
            fcntl.flock(handle, mode | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"embnb: waiting for another process building {directory}", file=sys.stderr, flush=True)
            fcntl.flock(handle, mode)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _build(directory: pathlib.Path, cuda: bool) -> pathlib.Path:
    """Compile into `directory`; the caller holds its exclusive build lock."""
    missing = missing_tools()
    if missing is not None:
        raise NativeUnavailable(f"building {directory} failed: {missing}")
    cpp_extension = quiet_cpp_extension()

    print(
        f"embnb: compiling the native extension into {directory} (once per source change, about a minute)",
        file=sys.stderr,
        flush=True,
    )
    directory.mkdir(parents=True, exist_ok=True)
    # torch's own build lock in the folder: under our lock nobody else builds
    # here, so one that exists was left by a killed build and would make torch wait forever
    (directory / "lock").unlink(missing_ok=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            cpp_extension.load(
                name=NAME,
                sources=[str(p) for p in sources(cuda)],
                extra_cflags=CFLAGS,
                extra_cuda_cflags=CUDA_CFLAGS,
                build_directory=str(directory),
                with_cuda=cuda,
                is_python_module=False,
                verbose=False,
            )
        except Exception as error:  # compiler missing, compile error, ...
            notes = "; ".join(str(w.message) for w in caught)
            detail = " ".join(str(error).split())[-600:]
            raise NativeUnavailable(
                f"building {directory} failed: {type(error).__name__}: "
                f"{detail}" + (f" (torch warned: {notes})" if notes else "")
            ) from error
    return directory / f"{NAME}.so"


def load(build: bool = True) -> Native:
    """Build if needed and load, once per process; a failure is remembered
    and raised again as NativeUnavailable without rebuilding. With `build`
    False nothing compiles: a library not built yet is a NativeUnavailable
    that says to run `python -m embnb.cuda build` (not remembered: a later
    load may build it or find it built)."""
    global _loaded, _failure
    with _lock:
        if _loaded is not None:
            return _loaded
        if _failure is not None:
            raise NativeUnavailable(_failure)
        cuda = with_cuda()
        directory = build_dir(cuda)
        library = directory / f"{NAME}.so"
        if not build and not library.exists():
            raise NativeUnavailable(
                f"the native extension is not built for these sources and this torch ({directory} "
                f"has no {library.name}); build it once per host with `{BUILD_COMMAND}` "
                f"(`make setup` runs it)"
            )
        # Exclusive only where this process may build: ranks loading a built library share the
        # lock (they waited on each other before, each announcing "waiting for ... building").
        try:
            with build_lock(directory, exclusive=build and not library.exists()):
                if library.exists():
                    torch.ops.load_library(str(library))
                else:
                    library = _build(directory, cuda)
        except NativeUnavailable as error:
            _failure = str(error)
            raise
        except OSError as error:  # a damaged cached library, or a cache we cannot write
            _failure = f"loading {library} failed: {error}"
            raise NativeUnavailable(_failure) from error
        _loaded = Native(library, cuda)
        return _loaded


def try_load(build: bool = True) -> Native | None:
    """THE fallback rule of every native op: load(build), or None after one
    RuntimeWarning per process saying why. Callers then run their pure-torch
    or Python version, which gives the same results, only slower."""
    global _warned
    try:
        return load(build)
    except NativeUnavailable as error:
        if not _warned:
            _warned = True
            warnings.warn(
                f"embnb: native kernels unavailable; embnb runs its pure-torch "
                f"and Python versions instead (same results, much slower). "
                f"Reason: {error}",
                RuntimeWarning,
                stacklevel=3,
            )
        return None


def use(native: bool | None, name: str = "native", build: bool = True) -> bool:
    """The one reading of a `native=` switch: True needs the native ops
    (NativeUnavailable when they cannot load), None uses them where they
    load (else `try_load`'s fallback, one warning), False never does. Any
    other value is a TypeError naming `name`. With `build` False (the
    planner) nothing compiles: a library not built yet cannot load."""
    check_native(name, native)
    if native:
        load(build)
        return True
    return native is None and try_load(build) is not None


def available() -> bool:
    """Whether the native ops build and load here (builds on first call)."""
    try:
        load()
    except NativeUnavailable:
        return False
    return True


def failure() -> str | None:
    """Why the native ops are unavailable, or None (loaded, or not tried yet)."""
    return _failure
