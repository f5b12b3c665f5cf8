"""Appendix 04a's step measured rank by rank (each rank's forward and backward of `SequenceDense` on
its samples, every rank of a partition timed in turn in interleaved rounds by
`embnb.timing.interleaved_phases`; the step is the slowest rank) on thread CPU time at one thread on a
CPU, CUDA events on a GPU (its enqueue time beside it); memory caps; a link model. And does a rank's
time follow its work? Least squares of ms over GFLOPs and a constant per rank (`WORK`, issue 70's
check: where the constant is most of a rank's time, fixed costs bound the step, not the work a
balancer moves), or also over distinct lengths and tokens (`WORK_AND_LENGTHS`), here and in the
committed GPU runs (`gpu_rank_rows`)."""

from __future__ import annotations

import dataclasses
import pathlib
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import torch
from scipy.optimize import nnls
from tqdm.auto import tqdm

from embnb._checks import check_int, check_number
from embnb.balancing.capped import CAPPED_METHODS, balance_capped, minimum_cap, part_tokens
from embnb.balancing.kjt_alltoall import exchange_bytes
from embnb.balancing.lengths import LengthDistribution
from embnb.balancing.partition import METHODS, balance
from embnb.balancing.workloads import equal_size_lower_bound, lengths_tensor
from embnb.collectives import all_gather_flat, collective_seconds
from embnb.dist import launch, rank_device, resolve_device
from embnb.results import load_runs
from embnb.scaling import MAX_FIXED_SHARE, sweep_clock
from embnb.steptime.kernels import SequenceDense
from embnb.steptime.memory import peak_memory_partition, peak_step_bytes
from embnb.timing import interleaved_phases, median_seconds

__all__ = ["StepConfig", "BalancedSteps", "measure_balanced_steps", "ActivationModel", "measure_capped"]
__all__ += ["RankTimeFit", "fit_rank_time", "rank_rows", "time_vs_work", "gpu_rank_rows"]

# bytes per id of each key of `kjt_alltoall.zipf_batch` (int64 ids, two keys with fp32 weights), per label
EXCHANGE_ITEM_BYTES, EXCHANGE_DENSE_BYTES = (8, 8, 12, 12), 8
WORK = ("gflops", "per_rank")
WORK_AND_LENGTHS = ("gflops", "distinct_lengths", "tokens", "per_rank")  # SequenceDense: kernels per length


def sequence_dense_flops(lengths: Any, width: int, hidden: Sequence[int]) -> torch.Tensor:
    """Forward FLOPs of `SequenceDense` per sample of L tokens (float64): QKV 6*L*d^2, attention
    4*L^2*d (the causal mask not subtracted, as torch's FLOP counter counts it), the MLP
    2*L*(d*h1 + ... + h_last*1). Raises ValueError on a width below 1 or a negative length."""
    check_int("width", width, low=1)
    length = lengths_tensor(lengths)
    widths = [width, *hidden, 1]
    mlp = sum(a * b for a, b in zip(widths, widths[1:]))
    return 6 * length * width * width + 4 * length * length * width + 2 * length * mlp


def dense_rank_step(model: SequenceDense, lengths: list[int], width: int, device: str) -> Callable[[], None]:
    """One rank's forward and backward of `model` on samples of `lengths` (tokens of `width` features,
    built once here, so that only the step is timed)."""
    tokens = torch.randn(sum(lengths), width, device=device, requires_grad=True)

    def step() -> None:
        model.zero_grad(set_to_none=True)
        tokens.grad = None
        model(tokens, lengths).backward()

    return step


@dataclass(frozen=True)
class RankStep:
    """One partition measured rank by rank: per rank its median ms over the repeats on `clock`
    (`embnb.scaling.sweep_clock`: "thread", thread CPU time at one torch thread on a CPU; "device",
    CUDA events on a GPU) with the repeats' low and high, its tokens, model FLOPs and distinct lengths
    (kernel groups); on a GPU `enqueue_ms`, the median time to launch its step (`PhaseTime.enqueue_s`)."""

    ms: list[float]
    low_ms: list[float]
    high_ms: list[float]
    tokens: list[int]
    flops: list[float]
    distinct_lengths: list[int]
    clock: str
    enqueue_ms: list[float] | None = None

    @property
    def step_ms(self) -> float:
        """The step: the slowest rank."""
        return max(self.ms)


@dataclass(frozen=True)
class StepConfig:
    """Per W of `world_sizes`, a batch of W * local_batch_size lengths up to `max_length` through
    SequenceDense(width, hidden), `repeats` interleaved rounds after `warmup`, at one thread on `device`."""

    world_sizes: list[int]
    local_batch_size: int
    max_length: int = 2048
    width: int = 32
    hidden: tuple[int, ...] = (64,)
    warmup: int = 1
    repeats: int = 3
    seed: int = 0
    device: str = "cpu"  # "cpu", "cuda" or "auto"

    def flops(self, lengths: Any) -> torch.Tensor:
        return sequence_dense_flops(lengths, self.width, self.hidden)

    def measure(self, parts_lengths: list[list[int]]) -> RankStep:
        """A partition measured rank by rank (`parts_lengths[r]`: rank r's samples' lengths), every
        rank once per round; one model for all ranks (data parallelism: each holds the same)."""
        torch.manual_seed(self.seed)
        model = SequenceDense(self.width, self.hidden).to(self.device)
        steps = {r: dense_rank_step(model, p, self.width, self.device) for r, p in enumerate(parts_lengths)}
        times, _ = interleaved_phases(steps, self.repeats, self.warmup, self.device, threads=1)
        clock = sweep_clock(self.device)
        ms = [[1e3 * t.value(clock) for t in times[r]] for r in steps]
        enqueue = [statistics.median(1e3 * t.enqueue_s for t in times[r]) for r in steps]
        return RankStep(
            ms=[statistics.median(m) for m in ms],
            low_ms=[min(m) for m in ms],
            high_ms=[max(m) for m in ms],
            tokens=[sum(p) for p in parts_lengths],
            flops=[float(self.flops(p).sum()) for p in parts_lengths],
            distinct_lengths=[len(set(p)) for p in parts_lengths],
            clock=clock,
            enqueue_ms=enqueue if clock == "device" else None,
        )


@dataclass(frozen=True)
class BalancedSteps:
    """`measure_balanced_steps`' runs, (distribution, W, method) -> RankStep, and per (distribution,
    W) the batch's FLOP bounds and its lengths (loader order). `measure` measures a partition of one
    of these batches once: the same partition again reuses it, not a second draw of the clock's noise."""

    runs: dict[tuple[str, int, str], RankStep]
    bounds: dict[tuple[str, int], dict[str, float]]
    lengths: dict[tuple[str, int], list[int]]
    config: StepConfig
    cache: dict = field(default_factory=dict, repr=False, compare=False)

    def measure(self, distribution: str, world_size: int, parts: list[list[int]], what: str = "step") -> Any:
        """A partition `parts` (indices into the batch) measured: its RankStep ("step") or each rank's
        peak activation bytes ("peaks", `steptime.memory`); a partition measured before is reused."""
        key = (what, distribution, world_size, tuple(sorted(tuple(sorted(p)) for p in parts)))
        if key not in self.cache:
            on_ranks = [[self.lengths[(distribution, world_size)][i] for i in part] for part in parts]
            c = self.config
            self.cache[key] = (
                c.measure(on_ranks)
                if what == "step"
                else peak_memory_partition(on_ranks, c.width, c.hidden, c.device)
            )
        return self.cache[key]

    def speedups(self) -> pd.DataFrame:
        """Per run: measured speed-up over the loader's cut, the FLOP model's (max FLOPs over max
        FLOPs), the bound's (the cut's max FLOPs over the equal-count lower bound)."""
        runs, cuts = list(self.runs.values()), [self.runs[(*key[:2], "contiguous")] for key in self.runs]
        bounds = [self.bounds[key[:2]] for key in self.runs]
        table = pd.DataFrame(list(self.runs), columns=["distribution", "world_size", "method"])
        return table.assign(
            step_ms=[run.step_ms for run in runs],
            measured=[cut.step_ms / run.step_ms for cut, run in zip(cuts, runs)],
            flop_model=[max(cut.flops) / max(run.flops) for cut, run in zip(cuts, runs)],
            bound=[max(cut.flops) / bound["lower_bound"] for cut, bound in zip(cuts, bounds)],
            longest_sets_bound=[bound["longest_sets_bound"] for bound in bounds],
            clock=[run.clock for run in runs],
        )


def measure_balanced_steps(
    distributions: Mapping[str, LengthDistribution], config: StepConfig, progress: bool = False
) -> BalancedSteps:
    """Per distribution and W: one global batch, cut as the loader cuts it and balanced by each
    method on the model's FLOPs, every partition measured. Raises ValueError on a bad batch size."""
    check_int("local_batch_size", config.local_batch_size, low=1)
    config = dataclasses.replace(config, device=resolve_device(config.device), hidden=tuple(config.hidden))
    steps = BalancedSteps({}, {}, {}, config)
    cases = [(name, spec, w) for name, spec in distributions.items() for w in config.world_sizes]
    for name, spec, w in tqdm(cases, desc="distribution x W", leave=False, disable=not progress):
        lengths = spec.draw(w * config.local_batch_size, config.max_length, config.seed * 1009 + w).tolist()
        flops = config.flops(lengths).tolist()
        steps.lengths[(name, w)] = lengths
        steps.bounds[(name, w)] = {
            "lower_bound": equal_size_lower_bound(flops, w),
            "longest_sets_bound": max(flops) > sum(flops) / w,
        }
        for method in METHODS:
            steps.runs[(name, w, method)] = steps.measure(name, w, balance(flops, w, method))
    return steps


@dataclass(frozen=True)
class CappedRun:
    """`measure_capped`'s runs ("uncapped", then each capped method) of one batch under a cap on a
    per-sample `size` ("tokens" or "modelled bytes"): each step, its ranks' peak bytes and `size`s;
    whether the uncapped partition passes the cap on some rank (`binds`), each run's measured step over
    the uncapped one's (`cost`, > 1: the cap costs time), and whether its largest measured peak is
    below the uncapped one's (`lowers_peak`)."""

    distribution: str
    world_size: int
    size: str
    cap: float
    mean: float  # of `size` per rank
    runs: dict[str, RankStep]
    peak_bytes: dict[str, list[int]]
    held: dict[str, list[float]]
    binds: bool
    cost: dict[str, float]
    lowers_peak: dict[str, bool]

    def table(self) -> pd.DataFrame:
        """A row per run: the cap over the mean, whether it binds, the largest tokens and measured peak
        (MiB) of a rank, the step's cost against the uncapped KK + swaps with its repeats' range, and
        `lowers_peak` credited only where the cap binds (another method may differ without a cap)."""
        steps, base = self.runs, self.runs["uncapped"]
        table = pd.DataFrame(
            {
                "cap_over_mean": self.cap / self.mean,
                "binds": self.binds,
                "max_tokens": {label: max(step.tokens) for label, step in steps.items()},
                "peak_mib": {label: max(peaks) / 2**20 for label, peaks in self.peak_bytes.items()},
                "cost": self.cost,
                # the slowest rank's low over the base's high, and back
                "cost_low": {label: max(step.low_ms) / max(base.high_ms) for label, step in steps.items()},
                "cost_high": {label: max(step.high_ms) / max(base.low_ms) for label, step in steps.items()},
                "lowers_peak": {label: self.binds and lower for label, lower in self.lowers_peak.items()},
            }
        )
        return pd.concat({(self.distribution, self.size): table}, names=["distribution", "cap on", "run"])


@dataclass(frozen=True)
class ActivationModel:
    """Peak bytes of one sample of L tokens, fixed + per_token * L + per_token_squared * L**2 (attention
    works on a whole sample at once), fitted by non-negative least squares to the measured peaks
    (`steptime.memory`) of single samples (`lengths`, `measured`) of `SequenceDense` on `device`."""

    fixed: float
    per_token: float
    per_token_squared: float
    lengths: list[int]
    measured: list[int]
    device: str

    @classmethod
    def fit(cls, lengths: Sequence[int], width: int, hidden: Sequence[int], device: str) -> ActivationModel:
        """Raises ValueError on fewer than 3 distinct lengths (3 terms)."""
        if len(set(lengths)) < 3:
            raise ValueError(f"need at least 3 distinct lengths to fit 3 terms, got {sorted(set(lengths))}")
        measured = [peak_step_bytes([n], width, hidden, device) for n in lengths]
        x = np.asarray(lengths, dtype=float)
        # non-negative terms: a sample never frees more than it allocates
        terms = nnls(np.stack([np.ones_like(x), x, x * x], axis=1), np.asarray(measured, dtype=float))[0]
        return cls(*map(float, terms), list(lengths), measured, device)

    def sample_bytes(self, lengths: Sequence[int]) -> list[float]:
        """Each sample's modelled activation bytes (the constant left out: every rank pays it once)."""
        return [self.per_token * n + self.per_token_squared * n * n for n in lengths]

    def max_relative_residual(self) -> float:
        """The fit's largest error on the lengths it was fitted to, relative to the measured peak."""
        predicted = [self.fixed + b for b in self.sample_bytes(self.lengths)]
        return max(abs(p - m) / m for p, m in zip(predicted, self.measured))


def measure_capped(
    steps: BalancedSteps,
    distribution: str,
    world_size: int,
    cap_over_mean: float,
    sizes: Sequence[float] | None = None,
    size: str = "tokens",
    methods: Sequence[str] = CAPPED_METHODS,
) -> CappedRun:
    """`distribution`'s batch at `world_size` in `steps`, KK + swaps uncapped, then each of `methods`
    (`capped.balance_capped`) under `cap_over_mean` times the mean per rank of `sizes` (each sample's
    `size`; None: its tokens), raised to `capped.minimum_cap`, then by 1% while a method finds no
    partition; each measured with its peaks. Raises ValueError on a cap below the mean or a batch
    `steps` did not measure."""
    check_number("cap_over_mean", cap_over_mean, low=1)
    if (distribution, world_size) not in steps.lengths:
        raise ValueError(
            f"steps has no run of {distribution!r} at W={world_size}; runs: {sorted(steps.lengths)}"
        )
    lengths = steps.lengths[(distribution, world_size)]
    flops, sizes = steps.config.flops(lengths).tolist(), list(lengths if sizes is None else sizes)
    mean = sum(sizes) / world_size
    cap = max(cap_over_mean * mean, minimum_cap(sizes, world_size))
    while True:  # a repair that finds no swap raises; a cap above every rank's load always fits
        try:
            capped = {m: balance_capped(flops, sizes, world_size, cap, m) for m in methods}
            break
        except ValueError:
            cap *= 1.01
    partitions = {"uncapped": balance(flops, world_size, "kk_swap"), **capped}
    measured = {label: steps.measure(distribution, world_size, p) for label, p in partitions.items()}
    peaks = {label: steps.measure(distribution, world_size, p, "peaks") for label, p in partitions.items()}
    held = {label: part_tokens(sizes, p) for label, p in partitions.items()}
    cost = {label: step.step_ms / measured["uncapped"].step_ms for label, step in measured.items()}
    lowers = {label: max(p) < max(peaks["uncapped"]) for label, p in peaks.items()}
    binds = max(held["uncapped"]) > cap
    return CappedRun(distribution, world_size, size, cap, mean, measured, peaks, held, binds, cost, lowers)


def _link_ms(world_size: int, kind: str, link_bytes: float, local_world_size: int) -> float:
    """ms to move `link_bytes` over one rank's link at torchrec's bandwidth for `kind`."""
    from torchrec.distributed.planner.types import BasicCommsBandwidths, CollectiveType

    local = min(local_world_size, world_size)
    return link_bytes / BasicCommsBandwidths().get_bw(local, world_size, getattr(CollectiveType, kind))


def _latency_s(rank: int, world_size: int, repeats: int) -> list[float]:
    one = torch.zeros(1, dtype=torch.float64, device=rank_device())
    all_gather_flat(one)  # warm: the first collective sets up the connections
    return collective_seconds(lambda: all_gather_flat(one), repeats)


def measure_latency_ms(world_size: int = 2, device: str = "auto", repeats: int = 20) -> float:
    """The alpha-beta link model's latency, in a launch of its own: the median over repeats of the
    slowest rank's time for a one-float64 all-gather (all latency; torchrec's `BasicCommsBandwidths`
    prices it at ns), ms. Raises ValueError on fewer than 2 ranks or repeats."""
    check_int("world_size", world_size, low=2)
    check_int("repeats", repeats, low=1)
    per_rank = launch(_latency_s, world_size, repeats, device=device)
    return 1e3 * statistics.median(max(times) for times in zip(*per_rank))


def worker_shares(
    steps: BalancedSteps, distribution: str, latency_ms: float, local_world_size: int = 8
) -> pd.DataFrame:
    """Per W of `steps`: the shuffle's phases for `distribution`'s batch (both collectives' bytes
    counted and their ms computed by an alpha-beta model: W - 1 ring steps of `latency_ms`, plus the
    bytes at torchrec's bandwidths; KK + swaps timed here), the measured balanced compute, and the
    share of the shuffle a step that long would hide (computed: min(1, compute / shuffle))."""
    check_number("latency_ms", latency_ms, low=0)
    rows, batch = [], steps.config.local_batch_size
    for w in sorted({w for name, w, _ in steps.runs if name == distribution}):
        lengths = steps.lengths[(distribution, w)]
        flops = steps.config.flops(lengths).tolist()
        kk_ms = 1e3 * median_seconds(lambda flops=flops, w=w: balance(flops, w), repeats=5)
        gather_bytes = w * batch * 8  # every rank's float64 workloads
        per_key = torch.tensor(lengths).view(w, batch, 1).expand(w, batch, len(EXCHANGE_ITEM_BYTES))
        parts = balance(flops, w)
        moved = exchange_bytes(per_key, EXCHANGE_ITEM_BYTES, EXCHANGE_DENSE_BYTES, parts)["alltoall"]["max"]
        latency = (w - 1) * latency_ms  # a ring's W - 1 steps, each paying the link's latency
        gather_ms = latency + _link_ms(w, "ALL_GATHER", gather_bytes * (w - 1) / w, local_world_size)
        exchange_ms = latency + _link_ms(w, "ALL_TO_ALL", moved, local_world_size)
        shuffle_ms = gather_ms + kk_ms + exchange_ms
        compute_ms = steps.runs[(distribution, w, "kk_swap")].step_ms
        rows.append(
            {
                "world_size": w,
                "latency_ms": latency_ms,
                "gather_bytes": gather_bytes,
                "gather_ms_computed": gather_ms,
                "kk_ms_measured": kk_ms,
                "exchange_bytes": moved,
                "exchange_ms_computed": exchange_ms,
                "shuffle_ms": shuffle_ms,
                "latency_share": 2 * latency / shuffle_ms,
                "compute_ms_measured": compute_ms,
                "hidden_share_computed": min(1.0, compute_ms / shuffle_ms),
            }
        )
    return pd.DataFrame(rows)


@dataclass(frozen=True)
class RankTimeFit:
    """ms per unit of each feature over `ranks` ranks; `r`: measured ms against GFLOPs; `fixed_share`:
    the constant over the mean measured ms."""

    features: list[str]
    coefficients: dict[str, float]
    ranks: int
    r: float
    fixed_share: float
    max_relative_residual: float

    def predict(self, row: Mapping[str, float]) -> float:
        return sum(c * row[f] for f, c in self.coefficients.items())


def fit_rank_time(rows: Sequence[Mapping[str, float]], features: Sequence[str] = WORK) -> RankTimeFit:
    """Least squares (minimum norm: columns may be collinear) of ms over `features`; "per_rank" is
    the constant 1. Raises ValueError on fewer than 2 rows."""
    if len(rows) < 2:
        raise ValueError(f"need at least 2 ranks to fit, got {len(rows)}")
    x = np.array([[1.0 if f == "per_rank" else float(r[f]) for f in features] for r in rows])
    y, gflops = (np.array([float(r[k]) for r in rows]) for k in ("ms", "gflops"))
    beta = np.linalg.lstsq(x, y, rcond=None)[0]
    r = float(np.corrcoef(gflops, y)[0, 1]) if gflops.std() > 0 and y.std() > 0 else 0.0
    coefficients = dict(zip(features, beta.tolist()))
    fixed_share = coefficients.get("per_rank", 0.0) / float(y.mean())
    residual = float((abs(y - x @ beta) / y).max())
    return RankTimeFit(list(features), coefficients, len(rows), r, fixed_share, residual)


def rank_rows(runs: Mapping[Any, Any]) -> list[dict[str, float]]:
    """One row per rank of every `RankStep` in `runs`: its ms on its clock and its work."""
    return [
        {"ms": ms, "gflops": f / 1e9, "distinct_lengths": n, "tokens": t, "per_rank": 1.0}
        for step in runs.values()
        for ms, f, n, t in zip(step.ms, step.flops, step.distinct_lengths, step.tokens)
    ]


def time_vs_work(ranks: pd.DataFrame) -> pd.DataFrame:
    """Per source of `ranks` (rows of source, ms, gflops; one per measured rank): the `WORK` fit's
    fixed ms and ms per GFLOP, r, the fixed share of the mean rank, the achieved TFLOPS (all GFLOPs
    over all ms), and `time_follows_work`: fixed share at most `MAX_FIXED_SHARE["flops"]` (issue 70)."""
    rows = []
    for source, group in ranks.groupby("source", sort=False):
        fit = fit_rank_time(group.to_dict("records"), WORK)
        rows.append(
            {
                "source": source,
                "ranks": fit.ranks,
                "r": fit.r,
                "fixed_ms": fit.coefficients["per_rank"],
                "ms_per_gflop": fit.coefficients["gflops"],
                "fixed_share": fit.fixed_share,
                "tflops": group["gflops"].sum() / group["ms"].sum(),  # GFLOP per ms = TFLOP per s
                "time_follows_work": fit.fixed_share <= MAX_FIXED_SHARE["flops"],
            }
        )
    return pd.DataFrame(rows).set_index("source")


def gpu_rank_rows(results_dir: str | pathlib.Path | None = None) -> pd.DataFrame:
    """Every rank of every partition the committed GPU runs (device "cuda") measured: its source (the
    GPU, the run's date, the bench and the model width), ms (median over repeats; the run's clock) and
    GFLOPs. `results_dir`: None reads the committed results."""
    rows = []
    for run in [*load_runs("balancer", results_dir), *load_runs("hstu", results_dir)]:
        if run.data.get("device") != "cuda":
            continue
        if run.benchmark == "balancer":
            measured = run.data["rank_by_rank"]
            width, runs = measured["measured_config"]["width"], measured["measured_runs"]
            # files before the interleaved rounds named each rank's ms by its clock
            per_rank = [(r["ms"] if "ms" in r else r[f"{r['clock']}_ms"], r["flops"]) for r in runs]
        else:
            width = run.data["worlds"][0]["width"]
            per_rank = [(r["rank_ms_median"], r["rank_flops"]) for w in run.data["worlds"] for r in w["runs"]]
        source = f"{run.machine.removeprefix('NVIDIA ')} {run.date}, {run.benchmark}, width {width}"
        rows += [
            {"source": source, "ms": m, "gflops": f / 1e9}
            for ms, flops in per_rank
            for m, f in zip(ms, flops)
        ]
    return pd.DataFrame(rows, columns=["source", "ms", "gflops"])


def fitted(steps: BalancedSteps) -> tuple[pd.DataFrame, dict[str, Any]]:
    """`steps.speedups()` with what a per-rank cost of FLOPs, distinct lengths and tokens predicts
    ("fitted_model"), and both fits (`fit_rank_time`) over every measured rank (WORK: does time follow
    FLOPs; WORK_AND_LENGTHS: the per-length and per-token costs beside them)."""
    rows = rank_rows(steps.runs)
    fits = {"work": fit_rank_time(rows, WORK), "work_and_lengths": fit_rank_time(rows, WORK_AND_LENGTHS)}
    predict = fits["work_and_lengths"].predict
    slowest = [max(map(predict, rank_rows({key: run}))) for key, run in steps.runs.items()]
    cut = {key[:2]: ms for key, ms in zip(steps.runs, slowest) if key[2] == "contiguous"}
    table = steps.speedups()  # a row per run, in the runs' order
    table["fitted_model"] = [cut[key[:2]] / ms for key, ms in zip(steps.runs, slowest)]
    return table, {name: dataclasses.asdict(f) for name, f in fits.items()}


def results(steps: BalancedSteps, capped: Sequence[CappedRun], shares: Mapping[str, pd.DataFrame]) -> dict:
    """The rank-by-rank part of a results JSON (appendix 04a and the bench): the raw per-rank numbers
    with the derived ones, so a test can recompute them."""
    table, fits = fitted(steps)
    config = dataclasses.asdict(steps.config) | {"threads": 1, "clock": sweep_clock(steps.config.device)}
    return {
        "measured_config": config,
        "measured_batches": [
            {"distribution": d, "world_size": w, "lengths": n} for (d, w), n in steps.lengths.items()
        ],
        "measured_runs": [
            {"distribution": d, "world_size": w, "method": m} | dataclasses.asdict(run) | steps.bounds[(d, w)]
            for (d, w, m), run in steps.runs.items()
        ],
        "measured_speedups": table.to_dict(orient="records"),
        "rank_time_fits": fits,
        "capped": [dataclasses.asdict(run) for run in capped],
        "worker_shares": {name: frame.to_dict(orient="records") for name, frame in shares.items()},
    }
