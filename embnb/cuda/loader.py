"""Build the native extension on first use and load its torch ops.

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
compiler. `CXX` picks the C++ compiler.
"""

from __future__ import annotations

import dataclasses
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
CPU_SOURCES = ["bucketize_cpu.cpp", "greedy_place.cpp", "karmarkar_karp.cpp", "knapsack.cpp"]
CUDA_SOURCES = ["bucketize_cuda.cpp", "bucketize_cuda.cu"]
HEADER_SUFFIXES = (".h", ".cuh")
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


def _build(directory: pathlib.Path, cuda: bool) -> pathlib.Path:
    cpp_extension = quiet_cpp_extension()

    print(
        f"embnb: compiling the native extension into {directory} (once per source change, about a minute)",
        file=sys.stderr,
        flush=True,
    )
    directory.mkdir(parents=True, exist_ok=True)
    if shutil.which("ninja") is None:  # pip's ninja sits next to python
        bindir = str(pathlib.Path(sys.executable).parent)
        os.environ["PATH"] = bindir + os.pathsep + os.environ.get("PATH", "")
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


def load() -> Native:
    """Build if needed and load, once per process; a failure is remembered
    and raised again as NativeUnavailable without rebuilding."""
    global _loaded, _failure
    with _lock:
        if _loaded is not None:
            return _loaded
        if _failure is not None:
            raise NativeUnavailable(_failure)
        cuda = with_cuda()
        directory = build_dir(cuda)
        library = directory / f"{NAME}.so"
        try:
            if library.exists():
                torch.ops.load_library(str(library))
            else:
                library = _build(directory, cuda)
        except NativeUnavailable as error:
            _failure = str(error)
            raise
        except OSError as error:  # a damaged cached library
            _failure = f"loading {library} failed: {error}"
            raise NativeUnavailable(_failure) from error
        _loaded = Native(library, cuda)
        return _loaded


def try_load() -> Native | None:
    """THE fallback rule of every native op: load(), or None after one
    RuntimeWarning per process saying why. Callers then run their pure-torch
    or Python version, which gives the same results, only slower."""
    global _warned
    try:
        return load()
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


def use(native: bool | None, name: str = "native") -> bool:
    """The one reading of a `native=` switch: True needs the native ops
    (NativeUnavailable when they cannot load), None uses them where they
    load (else `try_load`'s fallback, one warning), False never does. Any
    other value is a TypeError naming `name`."""
    check_native(name, native)
    if native:
        load()
        return True
    return native is None and try_load() is not None


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
