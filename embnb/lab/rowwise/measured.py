"""Notebook 01's measured section: does the busiest owner by keys set the step?

Sections 2 to 4 count keys per rank. Here each rank's row-wise lookups run
with real kernels, rank by rank (`embnb.steptime.measure_routing`): an
FBGEMM TBE of the rank's block of the table (torchrec's fused kernel,
rowwise Adagrad inside the backward), fed exactly the ids its owner rule
gives it from the global batch, forward and backward, warmed up and
repeated (median). The ids are production-like: Zipf(alpha) raw ids hashed
into the table (`aliasing.into_table(ids, rows, "hash")`, the pipeline of
section 2), then routed by each dist_type.

The primary clock is each rank's thread CPU time at one intra-op thread: on
a shared machine other processes stretch wall time, not the CPU time the
rank's kernels used. Wall time is kept beside it.

    routing = measure_cases([0.8, 1.5], [8, 16], ["continuous", "hash_roundrobin"], keys_per_rank=4096)
    case = routing.cases[0]
    case.counted_max_over_mean, case.measured_max_over_mean(), case.busiest_is_slowest()
    fig = counted_vs_measured(routing)
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass

import torch
from matplotlib import colormaps
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from embnb._checks import check_int
from embnb.data import make_keys
from embnb.lab.plotting import color, new_figure
from embnb.lab.rowwise.aliasing import into_table, owners
from embnb.metrics import max_over_mean, spearman
from embnb.rowwise.routing import DistType
from embnb.steptime import batch_from_keys, measure_routing

__all__ = [
    "CLOCK",
    "MeasuredCase",
    "MeasuredRouting",
    "measure_cases",
    "counted_vs_measured",
    "describe",
    "summary_part",
]

CLOCK = "cpu"  # thread CPU time (module docstring)
TABLE = "table"  # the one table's name in the measured batch


@dataclass(frozen=True)
class MeasuredCase:
    """One (dist_type, W, alpha): per rank, the ids it owns (counted), the
    distinct rows among them (counted), and its lookups' median time
    (forward + backward with the fused optimizer), thread CPU and wall, ms."""

    dist_type: str
    world_size: int
    alpha: float
    keys_per_rank: list[int]
    distinct_rows_per_rank: list[int]
    lookup_ms: list[float]  # thread CPU time, the primary clock
    lookup_wall_ms: list[float]

    @property
    def counted_max_over_mean(self) -> float:
        return max_over_mean(self.keys_per_rank)

    def measured_max_over_mean(self, clock: str = CLOCK) -> float:
        return max_over_mean(self._times(clock))

    def _times(self, clock: str) -> list[float]:
        return self.lookup_ms if clock == "cpu" else self.lookup_wall_ms

    @property
    def busiest_rank(self) -> int:
        """The rank that owns the most ids (the lowest such rank on a tie)."""
        return self.keys_per_rank.index(max(self.keys_per_rank))

    def slowest_rank(self, clock: str = CLOCK) -> int:
        times = self._times(clock)
        return times.index(max(times))

    def busiest_is_slowest(self, clock: str = CLOCK) -> bool:
        return self.slowest_rank(clock) == self.busiest_rank

    def step_over_busiest(self, clock: str = CLOCK) -> float:
        """The slowest rank's time over the busiest rank's: 1 when the busiest sets the step."""
        times = self._times(clock)
        return max(times) / times[self.busiest_rank]

    def spearman(self, clock: str = CLOCK) -> float:
        """Spearman's rank correlation over ranks of ids owned and time (NaN if either is constant)."""
        return spearman(self.keys_per_rank, self._times(clock))

    def to_json(self) -> dict:
        return {
            **asdict(self),
            "counted_max_over_mean": self.counted_max_over_mean,
            "measured_max_over_mean": self.measured_max_over_mean(),
            "measured_wall_max_over_mean": self.measured_max_over_mean("wall"),
            "busiest_rank": self.busiest_rank,
            "slowest_rank": self.slowest_rank(),
            "busiest_is_slowest": self.busiest_is_slowest(),
            "step_over_busiest": self.step_over_busiest(),
            "spearman": _finite(self.spearman()),
        }


def _finite(value: float) -> float | None:
    return None if value != value else value  # NaN as None: strict JSON


@dataclass(frozen=True)
class MeasuredRouting:
    """Every measured case and how it was measured."""

    cases: list[MeasuredCase]
    keys_per_rank: int
    bag_size: int
    table_rows: int
    embedding_dim: int
    threads: int
    warmup: int
    repeats: int
    machine: str

    def busiest_is_slowest_count(self, clock: str = CLOCK) -> int:
        return sum(c.busiest_is_slowest(clock) for c in self.cases)

    def measured_below_counted_count(self, clock: str = CLOCK) -> int:
        return sum(c.measured_max_over_mean(clock) < c.counted_max_over_mean for c in self.cases)

    def by_alpha(self, clock: str = CLOCK) -> list[dict]:
        """Per alpha over its cases: how many have the busiest rank slowest;
        the medians of counted and measured max/mean, Spearman and step over busiest."""
        rows = []
        for alpha in sorted({c.alpha for c in self.cases}):
            cases = [c for c in self.cases if c.alpha == alpha]
            correlations = [c.spearman(clock) for c in cases if c.spearman(clock) == c.spearman(clock)]
            rows.append(
                {
                    "alpha": alpha,
                    "cases": len(cases),
                    "busiest_is_slowest": sum(c.busiest_is_slowest(clock) for c in cases),
                    "counted_max_over_mean": statistics.median(c.counted_max_over_mean for c in cases),
                    "measured_max_over_mean": statistics.median(
                        c.measured_max_over_mean(clock) for c in cases
                    ),
                    "spearman": statistics.median(correlations) if correlations else None,
                    "step_over_busiest": statistics.median(c.step_over_busiest(clock) for c in cases),
                }
            )
        return rows

    def to_json(self) -> dict:
        return {
            **{k: v for k, v in asdict(self).items() if k != "cases"},
            "clock": CLOCK,
            "cases": [c.to_json() for c in self.cases],
            "by_alpha": self.by_alpha(),
            "busiest_is_slowest": self.busiest_is_slowest_count(),
            "measured_below_counted": self.measured_below_counted_count(),
        }


def _distinct_per_rank(rows: torch.Tensor, ranks: torch.Tensor, world_size: int) -> list[int]:
    pairs = torch.unique(ranks * (rows.max() + 1) + rows)  # (rank, row) pairs, each once
    return torch.bincount(pairs // (rows.max() + 1), minlength=world_size).tolist()


def measure_case(
    rows: torch.Tensor, world_size: int, dist_type: str, alpha: float, table_rows: int, **options
) -> MeasuredCase:
    """Rank by rank, the lookups of `rows` (the global batch's rows, rank 0's
    local keys first; `options`: bag_size, embedding_dim and `measure_routing`'s)."""
    bag_size, dim = options.pop("bag_size"), options.pop("embedding_dim")
    batch = batch_from_keys(list(rows.view(world_size, -1)), bag_size, table=TABLE)
    times = measure_routing(batch, dist_type, {TABLE: table_rows}, {TABLE: dim}, **options)
    block = -(-table_rows // world_size)  # as routing_work: blocks of ceil(rows / W)
    ranks = owners(rows, world_size, dist_type, block_size=block)
    return MeasuredCase(
        str(DistType.parse(dist_type)),
        world_size,
        float(alpha),
        [r.num_ids for r in times.ranks],
        _distinct_per_rank(rows, ranks, world_size),
        [r.lookup.median_s("cpu") * 1e3 for r in times.ranks],
        [r.lookup.median_s("wall") * 1e3 for r in times.ranks],
    )


def measure_cases(
    alphas: Iterable[float],
    world_sizes: Iterable[int],
    dist_types: Sequence[str],
    *,
    keys_per_rank: int = 16384,
    bag_size: int = 16,
    table_rows: int = 1_000_000,
    embedding_dim: int = 64,
    threads: int = 1,
    warmup: int = 1,
    repeats: int = 5,
    seed: int = 0,
    progress: bool = False,
) -> MeasuredRouting:
    """For each W and alpha, one global batch of `keys_per_rank` Zipf(alpha)
    ids per rank hashed into a table of `table_rows` rows, measured rank by
    rank under each dist_type (`measure_case`). The dense part runs too
    (`measure_routing` always runs it) at its smallest: every rank has the
    same local batch, so it does not set which rank is slowest."""
    check_int("keys_per_rank", keys_per_rank, low=1)
    check_int("table_rows", table_rows, low=1)
    for dist_type in dist_types:
        DistType.parse(dist_type)
    grid = [(w, a) for w in world_sizes for a in alphas]
    if not grid or not dist_types:
        raise ValueError("nothing to measure: give at least one alpha, world size and dist_type")
    if progress:
        from tqdm.auto import tqdm

        grid = tqdm(grid, desc="W, alpha", leave=False)
    options = dict(bag_size=bag_size, embedding_dim=embedding_dim, threads=threads, warmup=warmup)
    options.update(repeats=repeats, hidden=(8,))  # the dense part at its smallest
    cases = []
    for world_size, alpha in grid:
        check_int("world_size", world_size, low=2)
        raw = make_keys("zipf", world_size * keys_per_rank, seed, alpha=alpha)
        rows = into_table(raw, table_rows, "hash")
        for dist_type in dist_types:
            cases.append(measure_case(rows, world_size, dist_type, alpha, table_rows, **options))
    from embnb.timing import machine_name

    return MeasuredRouting(
        cases,
        keys_per_rank,
        bag_size,
        table_rows,
        embedding_dim,
        threads,
        warmup,
        repeats,
        machine_name("cpu"),
    )


MARKERS = {0: "o", 1: "s", 2: "^", 3: "D"}  # one per world size, in order


def counted_vs_measured(routing: MeasuredRouting, clock: str = CLOCK) -> Figure:
    """Left: per case, counted max/mean of ids per rank against measured
    max/mean of lookup time (colour: dist_type; marker: W), with y = x (time
    in proportion to ids) and y = 1 (balanced time). Right: every rank of
    every case, its ids and its time each over its case's mean (colour: alpha)."""
    if not routing.cases:
        raise ValueError("routing has no cases: nothing to plot")
    fig = new_figure(10.5, 5.2)
    left, right = fig.subplots(1, 2)
    worlds = sorted({c.world_size for c in routing.cases})
    alphas = sorted({c.alpha for c in routing.cases})
    top = max(max(c.counted_max_over_mean, c.measured_max_over_mean(clock)) for c in routing.cases)
    for ax, start in ((left, 1), (right, 0)):  # a rank's ids and time over their means: y = x from 0
        ax.plot([start, top], [start, top], color="0.5", linestyle="--", linewidth=1, zorder=1)
        ax.axhline(1, color="0.7", linewidth=0.8, zorder=1)
        ax.grid(True, alpha=0.3)
    for case in routing.cases:
        marker = MARKERS[worlds.index(case.world_size) % len(MARKERS)]
        left.scatter(
            case.counted_max_over_mean,
            case.measured_max_over_mean(clock),
            color=color(case.dist_type),
            marker=marker,
            s=36,
            alpha=0.85,
            zorder=3,
        )
        keys, times = case.keys_per_rank, case._times(clock)
        mean_keys, mean_time = statistics.mean(keys), statistics.mean(times)
        right.scatter(
            [k / mean_keys for k in keys],
            [t / mean_time for t in times],
            color=_alpha_color(alphas.index(case.alpha), len(alphas)),
            s=10,
            alpha=0.6,
            zorder=3,
        )
    left.set(
        xlabel="counted: max/mean of ids per rank", ylabel=f"measured: max/mean of lookup time ({clock})"
    )
    left.set_title("case by case (dashed: time in proportion to ids)", fontsize=9)
    right.set(xlabel="ids owned / the case's mean", ylabel=f"lookup time / the case's mean ({clock})")
    right.set_title("rank by rank, every case (dashed: in proportion)", fontsize=9)
    # one legend per panel, below it: the panels use different colour codes
    case_handles = [
        Line2D([], [], color=color(d), marker="o", linestyle="", label=d) for d in _dist_types(routing)
    ]
    case_handles += [
        Line2D([], [], color="0.3", marker=MARKERS[i % len(MARKERS)], linestyle="", label=f"W = {w}")
        for i, w in enumerate(worlds)
    ]
    alpha_handles = [
        Line2D([], [], color=_alpha_color(i, len(alphas)), marker="o", linestyle="", label=f"alpha {a:g}")
        for i, a in enumerate(alphas)
    ]
    for ax, handles in ((left, case_handles), (right, alpha_handles)):
        ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncols=3, fontsize=8)
    return fig


def _alpha_color(index: int, count: int) -> tuple:
    """A sequential colour per alpha (dark: small), apart from the dist_types' palette."""
    return colormaps["plasma"](0.85 * index / max(count - 1, 1))


def _dist_types(routing: MeasuredRouting) -> list[str]:
    return list(dict.fromkeys(c.dist_type for c in routing.cases))


def describe(routing: MeasuredRouting, clock: str = CLOCK) -> list[str]:
    """What the measurement shows, as sentences generated from its numbers."""
    total = len(routing.cases)
    per_alpha = routing.by_alpha(clock)
    slowest = routing.busiest_is_slowest_count(clock)
    sentences = [
        f"The busiest owner by ids is the slowest rank by measured {clock} time in {slowest} of {total} "
        "cases (per alpha: "
        + ", ".join(f"{row['alpha']:g}: {row['busiest_is_slowest']} of {row['cases']}" for row in per_alpha)
        + ")."
    ]
    others = [c.step_over_busiest(clock) for c in routing.cases if not c.busiest_is_slowest(clock)]
    if others:
        sentences.append(
            f"Where it is not, the slowest rank's lookups take {min(others):.2f}x to {max(others):.2f}x "
            "the busiest rank's."
        )
    below = routing.measured_below_counted_count(clock)
    sentences.append(
        f"Measured max/mean is below counted max/mean in {below} of {total} cases; medians per alpha, "
        "counted -> measured: "
        + ", ".join(
            f"{row['alpha']:g}: {row['counted_max_over_mean']:.2f} -> {row['measured_max_over_mean']:.2f}"
            for row in per_alpha
        )
        + "."
    )
    correlations = [
        f"{row['alpha']:g}: {row['spearman']:.2f}" for row in per_alpha if row["spearman"] is not None
    ]
    if correlations:
        sentences.append(f"Median Spearman over ranks of ids and time, per alpha: {', '.join(correlations)}.")
    return sentences


def summary_part(routing: MeasuredRouting, clock: str = CLOCK) -> str:
    """The measured finding for the one-line summary, per alpha: how far the
    counted max/mean (sections 2-4's cost) over- or understates the measured
    one, and in how many cases the busiest owner by ids was the slowest rank."""
    per_alpha = routing.by_alpha(clock)
    ratio = {r["alpha"]: r["counted_max_over_mean"] / r["measured_max_over_mean"] for r in per_alpha}
    over = [f"{a:g}" for a, x in ratio.items() if x > 1]
    under = [f"{a:g}" for a, x in ratio.items() if x <= 1]
    verdict = f"counted imbalance overstates time imbalance at alpha {', '.join(over) or 'none'}" + (
        f", not at {', '.join(under)}" if under else ""
    )
    medians = ", ".join(
        f"alpha {r['alpha']:g}: {r['counted_max_over_mean']:.2f} counted, "
        f"{r['measured_max_over_mean']:.2f} measured ({ratio[r['alpha']]:.2f}x)"
        for r in per_alpha
    )
    slowest = ", ".join(f"alpha {r['alpha']:g}: {r['busiest_is_slowest']} of {r['cases']}" for r in per_alpha)
    return (
        f"measured rank by rank on {routing.machine} (FBGEMM's CPU TBE, thread {clock} time): {verdict} "
        f"(medians of max/mean, {medians}); the busiest owner by ids was the slowest rank in {slowest}"
    )
