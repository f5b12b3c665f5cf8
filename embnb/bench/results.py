"""What the benchmarks share: the --out option, the acceptance check's options and printed line,
quiet torchrec logs and how a spread prints. Their results files are written and read by embnb.results
(write_results is imported here for the benches); timing lives in embnb.timing."""

from __future__ import annotations

import argparse
import logging
import pathlib
import statistics
from typing import Any

from embnb.results import write_results
from embnb.scaling import MAX_FIXED_SHARE, SWEEP_FACTORS

__all__ = ["add_out_argument", "add_sweep_options", "check_sweep_options", "sweep_text"]
__all__ += ["quiet_torchrec_logs", "spread", "tbe_device", "write_results"]


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
    from embnb.steptime.kernels import check_tbe_device

    resolved = resolve_device(device)
    check_tbe_device(resolved)
    return resolved


def add_sweep_options(parser: argparse.ArgumentParser, base: str, unit: str) -> None:
    """--sweep-factors and --max-fixed-share (the acceptance check's, `embnb.scaling`), `base` naming
    the base batch's option and `unit` ("flops" or "bytes") the share's default."""
    parser.add_argument(
        "--sweep-factors",
        type=int,
        nargs="+",
        default=list(SWEEP_FACTORS),
        help=f"the acceptance check's batches: {base} x each",
    )
    parser.add_argument(
        "--max-fixed-share",
        type=float,
        default=MAX_FIXED_SHARE[unit],
        help="compare at the smallest batch whose fixed share is at most this",
    )


def check_sweep_options(parser: argparse.ArgumentParser, opts: argparse.Namespace) -> None:
    """Refuse a sweep that cannot fit a slope or a share outside (0, 1]; sort the factors."""
    if any(f < 1 for f in opts.sweep_factors):
        parser.error(f"--sweep-factors must be >= 1, got {opts.sweep_factors}")
    if len(set(opts.sweep_factors)) < 2:
        parser.error(f"--sweep-factors needs two different factors to fit a slope, got {opts.sweep_factors}")
    opts.sweep_factors = sorted(set(opts.sweep_factors))
    if not 0 < opts.max_fixed_share <= 1:
        parser.error(f"--max-fixed-share must be in (0, 1], got {opts.max_fixed_share}")


def sweep_text(check: dict[str, Any]) -> str:
    """A check's (`ScalingCheck.as_dict()`) fixed shares and achieved rates at its batches: TFLOPS,
    or GB/s beside the reference copy bandwidth; or why it was not measured."""
    if "fit" not in check:
        return f"not measured: {check['error']}"
    shares = ", ".join(f"{100 * s:.0f}%" for s in check["fixed_share"])
    if check["unit"] == "flops":
        rates = "TFLOPS " + ", ".join(f"{r / 1e12:.3g}" for r in check["achieved_rate"])
    else:
        rates = "GB/s " + ", ".join(f"{r / 1e9:.3g}" for r in check["achieved_rate"])
        if check["reference_rate"] is not None:
            rates += f" (copy {check['reference_rate'] / 1e9:.3g})"
    return f"fixed share {shares}, {rates} at {check['batches']} samples per rank"
