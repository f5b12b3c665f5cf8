"""What the benchmarks share: the --out option, quiet torchrec logs and how a
spread prints. Their results files are written and read by embnb.results
(write_results is imported here for the benches); timing lives in embnb.timing."""

from __future__ import annotations

import argparse
import logging
import pathlib
import statistics

from embnb.results import write_results

__all__ = ["add_out_argument", "quiet_torchrec_logs", "spread", "tbe_device", "write_results"]


def spread(runs: list[float], digits: int) -> str:
    """The median of `runs` and their range, in seconds."""
    median = statistics.median(runs)
    return f"{median:.{digits}f} s ({min(runs):.{digits}f}-{max(runs):.{digits}f}, {len(runs)} runs)"


def add_out_argument(parser: argparse.ArgumentParser) -> None:
    """--out: where write_results puts the JSON."""
    parser.add_argument(
        "--out",
        type=pathlib.Path,
        default=None,
        help="results folder (default: ./benchmarks/results under the current directory)",
    )


def quiet_torchrec_logs() -> None:
    """Errors only: torchrec's planner logs every proposal and warns for each
    data-parallel table; torch.fx's deprecation log, here and on the ranks a
    bench launches (every KeyedJaggedTensor triggers it)."""
    from embnb.lab.logs import quiet_torch_fx

    logging.getLogger("torchrec").setLevel(logging.ERROR)
    logging.getLogger().setLevel(logging.ERROR)
    quiet_torch_fx()


def tbe_device(device: str) -> str:
    """`--device` of a bench that runs FBGEMM's TBEs, resolved ("auto": cuda where a GPU is); a
    ValueError says why it cannot run there (no GPU, or an fbgemm_gpu without CUDA kernels)."""
    from embnb.devices import resolve_device
    from embnb.steptime.kernels import fbgemm_cuda_available

    resolved = resolve_device(device)
    if resolved == "cuda" and not fbgemm_cuda_available():
        raise ValueError(
            "device 'cuda': this fbgemm_gpu has no CUDA kernels (the fbgemm-gpu-cpu build); "
            "the TBEs need the fbgemm-gpu CUDA wheel"
        )
    return resolved
