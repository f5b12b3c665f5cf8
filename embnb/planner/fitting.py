"""The fit of a `Calibration` to measured ranks (`embnb.planner.calibration` holds
what is fitted and how torchrec runs it; this module, how it is fitted).

    ranks = measured_ranks(options, times, topology, sharders, cache_bytes=...)
    calibration = fit(ranks, device_kind="cpu", device_name="...", cache_bytes=...)
"""

from __future__ import annotations

import math

import numpy as np
from torchrec.distributed.planner.constants import BWD_COMPUTE_MULTIPLIER

from embnb._checks import check_number
from embnb.planner.calibration import TERMS, Calibration, MeasuredRank

__all__ = ["fit", "design_matrix", "HUBER_DELTA"]

# Huber's threshold on a rank's relative error: about the spread of a rank measured twice (the
# calibrate bench's rank_repeat_gap, medians of 2.4-4.0% on the 2-core CPU), so ranks within the noise
# count as least squares.
HUBER_DELTA = 0.05
HUBER_ITERATIONS = 100


def _check_terms(terms: tuple[str, ...] | list[str]) -> None:
    if not terms or any(term not in TERMS for term in terms) or len(set(terms)) != len(tuple(terms)):
        raise ValueError(f"terms must be distinct names from {TERMS}, got {terms!r}")


def design_matrix(
    ranks: list[MeasuredRank], terms: tuple[str, ...], groups: list[tuple[str, str]], kernel_calls: bool
) -> np.ndarray:
    """The regressors `fit` solves over: float64, (len(ranks), len(groups) x len(terms) [+ 1]); row r
    holds the sums of rank r's shards' `terms` (ms per unit coefficient) in its shards' group's
    block (`groups` order), then, with `kernel_calls`, the rank's kernel calls."""
    columns = [TERMS.index(term) for term in terms]
    width = len(columns)
    design = np.zeros((len(ranks), len(groups) * width + int(kernel_calls)))
    for r, rank in enumerate(ranks):
        for shard in rank.shards:
            start = groups.index(shard.group) * width
            design[r, start : start + width] += [shard.terms[c] for c in columns]
        if kernel_calls:
            design[r, -1] = rank.kernel_calls
    return design


def fit(
    ranks: list[MeasuredRank],
    device_kind: str,
    device_name: str,
    bwd_multiplier: float = BWD_COMPUTE_MULTIPLIER,
    terms: tuple[str, ...] | list[str] | None = None,
    cache_bytes: float | None = None,
    kernel_calls: bool | None = None,
    huber_delta: float | None = HUBER_DELTA,
) -> Calibration:
    """The non-negative coefficients of each (sharding type, compute kernel) in `ranks` that
    minimize, over the ranks, Huber's loss of the relative error (calibrated estimate - measured
    lookups) / measured lookups (each rank weighs by its relative error, so small ranks count):
    squared within `huber_delta`, linear beyond it (Huber 1964, "Robust estimation of a location
    parameter"; solved by iteratively reweighted non-negative least squares, weights
    min(1, delta / |error|)). Why not least squares: the goal is the median rank's error, and a few
    ranks the terms cannot price (the dense kernel's, issue #69) pulled a squared fit off the rest
    (five CPU calibrate runs whose training ranks nearly all held a data-parallel table: held-out
    median per-rank error 6.2-9.5%, median 8.7%, Huber; 7.1-11.2%, median 10.6%, least squares on
    the same ranks; with half the training plans free of them, about even: docs/planner.md). None:
    least squares. Raises ValueError where a measurement is not a positive finite time,
    `huber_delta` is not > 0, or the ranks do not determine every coefficient.

    `kernel_calls`: fit `kernel_call_ms` too, one coefficient for every group, whose regressor is
    each rank's `MeasuredRank.kernel_calls` (the cost of a TBE call, whatever its ids: issue #69);
    None: where any rank's calls are counted. `collective_ms` is not fitted here: a rank's
    measured lookups hold no collective (it is measured apart: `embnb.planner.latency`).

    `terms`: which of `TERMS` to fit; the others are 0. Why: torchrec's terms can be collinear in a
    training set, and then the ranks do not determine them: input reads and lookups both grow with
    the ids a shard reads (lookups times its width), so shards of one width cannot tell them apart,
    and data-parallel ranks all hold the same shards (one distinct row per plan). Fitting fewer
    terms gives a determined fit there, e.g. `terms=("lookup_size_multiplier",)` for a scale alone.
    Default: every term, less the miss term where no shard's table outgrows the cache (or no
    `cache_bytes` is given: the cache the ranks' terms were computed against, `shard_terms`; kept in
    the calibration so that it prices shards alike)."""
    if terms is not None:
        _check_terms(terms)
    if huber_delta is not None:
        check_number("huber_delta", huber_delta, low=0, low_open=True)
    if not ranks:
        raise ValueError("ranks must hold at least one MeasuredRank, got none")
    for index, rank in enumerate(ranks):
        if not isinstance(rank, MeasuredRank):
            raise TypeError(f"ranks[{index}] must be a MeasuredRank, got {type(rank).__name__}")
        check_number(f"ranks[{index}].lookups_ms", rank.lookups_ms, low=0, low_open=True)
        for shard in rank.shards:
            if len(shard.terms) != len(TERMS) or not all(math.isfinite(t) and t >= 0 for t in shard.terms):
                raise ValueError(
                    f"ranks[{index}]: a shard's terms must be {len(TERMS)} finite numbers >= 0, "
                    f"got {shard.terms!r}"
                )
    if terms is None:
        miss = TERMS.index("cache_miss_lookup_multiplier")
        spills = any(shard.terms[miss] > 0 for rank in ranks for shard in rank.shards)
        terms = tuple(t for t in TERMS if t != TERMS[miss] or spills)
    chosen = tuple(terms)
    width = len(chosen)
    groups = sorted({shard.group for rank in ranks for shard in rank.shards})
    slot = {group: g * width for g, group in enumerate(groups)}
    if kernel_calls is None:
        kernel_calls = any(rank.kernel_calls for rank in ranks)
    calls_column = len(groups) * width  # the last column, where fitted
    design = design_matrix(ranks, chosen, groups, kernel_calls)
    measured = np.array([rank.lookups_ms for rank in ranks])
    weighted = design / measured[:, None]
    scale = np.linalg.norm(weighted, axis=0)
    undetermined = [
        f"{groups[c // width]} {chosen[c % width]}" if c < calls_column else "kernel_call_ms"
        for c in range(design.shape[1])
        if scale[c] == 0
    ]
    scale[scale == 0] = 1.0
    normalized = weighted / scale
    if undetermined or np.linalg.matrix_rank(normalized) < design.shape[1]:
        raise ValueError(
            f"the {len(ranks)} measured ranks determine {np.linalg.matrix_rank(normalized)} of the "
            f"{design.shape[1]} coefficients of {groups}"
            + (f" (no shard has a term for: {', '.join(undetermined)})" if undetermined else "")
            + ": measure more distinct shards (rows, widths, pooling factors, batch sizes) "
            + "or fit fewer `terms`"
        )
    try:  # only fitting needs scipy (the notebooks extra has it); loading and planning do not
        from scipy.optimize import nnls
    except ImportError as missing:
        raise ImportError(
            "fitting a calibration needs scipy (pip install scipy, or embnb[notebooks])"
        ) from missing
    solution, _ = nnls(normalized, np.ones(len(ranks)))
    for _ in range(HUBER_ITERATIONS if huber_delta is not None else 0):
        relative = np.abs(normalized @ solution - 1.0)
        root = np.sqrt(np.minimum(1.0, huber_delta / np.maximum(relative, huber_delta * 1e-6)))
        previous = solution
        solution, _ = nnls(normalized * root[:, None], root)
        if np.allclose(solution, previous, rtol=1e-9, atol=0.0):
            break
    solution = solution / scale
    coefficients = {}
    columns = [TERMS.index(term) for term in chosen]
    for group in groups:
        values = [0.0] * len(TERMS)
        for c, value in zip(columns, solution[slot[group] : slot[group] + width]):
            values[c] = float(value)
        coefficients[group] = tuple(values)
    errors = tuple(float(e) for e in design @ solution / measured - 1.0)
    call_ms = float(solution[calls_column]) if kernel_calls else 0.0
    return Calibration(device_kind, device_name, coefficients, bwd_multiplier, errors, cache_bytes, call_ms)
