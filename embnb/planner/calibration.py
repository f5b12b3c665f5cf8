"""torchrec's own perf model with coefficients fitted to measured kernels.

The fitted quantity, stated once: for each measured rank, **the rank's measured lookups (its TBEs'
forward and backward, in ms) against torchrec's estimated compute for that rank (the sum over the
shards it holds of `fwd_compute + bwd_compute`)**, plus a cost per kernel call: `fit` fits
`kernel_call_ms` (ms per TBE call, whatever its ids) on each rank's count of the TBE groups torchrec
batches its shards into (`KernelCallPerfModel.kernel_calls`, which `embnb.steptime` runs as its
TBEs), the term `KernelCallPerfModel` adds to a plan's rating. Communication is not fitted: a rank's
measured lookups hold no collective (torchrec's formulas for its bytes are kept as they are); the
fixed latency of each sharding type's collectives, `collective_ms`, is measured apart
(`embnb.planner.latency`, which `python -m embnb.bench calibrate` runs).

torchrec's `EmbeddingPerfEstimator` (torchrec/distributed/planner/estimator/, 1.6.1 and 1.8)
computes a shard's forward compute as `(a * input_read_size + b * lookup_size + c *
output_write_size + d * hash_size) * block_penalty / device_bw`, with (a, b, c, d) a
`PerfCoefficient` looked up per (sharding type, compute kernel) in its config's
`PerfCoefficientConfig.by_kernel`, and backward, where the config gives no backward coefficients, as
`bwd_compute_multiplier * fwd`. A calibration keeps that ratio (torchrec's default 2: one measured
total cannot tell forward from backward) and fits the forward coefficients of each (sharding type,
compute kernel) it has measurements of; the estimate is linear in them, so the fit is a non-negative
(robust) regression over ranks (`embnb.planner.fitting`). Three terms torchrec's formula lacks are
added to its forward through its `@forward_compute` extension point and fitted with its four
(`EMBNB_TERMS`: a lookup into a table larger than the device's cache, a cost per shard, and the rows
a batch updates). A sharding
type without measurements is priced as a fitted sibling of its family in torchrec's defaults
(`SIBLINGS`), else at torchrec's default. Each shard's terms (its estimated compute per unit of each
coefficient) are computed by torchrec's estimator itself
(`shard_terms`), so the features are exactly the ones it uses. The result is a torchrec
`HardwarePerfConfig` (`Calibration.perf_config`), which torchrec's `EmbeddingPerfEstimator` runs as
it runs its default, and embnb's enumerator keeps its fast path on
(`embnb.planner.estimates.covers`).

    terms = shard_terms(options, topology, sharders, cache_bytes=device_cache_bytes("cpu"))
    times = embnb.steptime.measure_plan(to_sharding_plan(options, topology), tables, batch)
    ranks = measured_ranks(options, times, topology, sharders, cache_bytes=...)  # one per rank with shards
    calibration = fit(ranks, device_kind="cpu", device_name="...", cache_bytes=...)  # embnb.planner.fitting
    planner = create_planner(topology, batch_size, calibration=calibration)
"""

from __future__ import annotations

import json
import math
from dataclasses import astuple, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
from torchrec.distributed.planner.constants import BWD_COMPUTE_MULTIPLIER
from torchrec.distributed.planner.estimator.annotations import forward_compute
from torchrec.distributed.planner.estimator.config import EmbeddingPerfEstimatorConfig
from torchrec.distributed.planner.estimator.estimator import EmbeddingPerfEstimator
from torchrec.distributed.planner.estimator.types import (
    EstimatorPerfCoefficients,
    PerfCoefficient,
)
from torchrec.distributed.planner.shard_estimators import EmbeddingStorageEstimator
from torchrec.distributed.planner.types import ParameterConstraints, ShardEstimator, ShardingOption, Topology

from embnb._checks import check_number
from embnb._torchrec_private import forward_sizes, set_bwd_compute_multiplier, sharders_for_estimators
from embnb.planner.perf_model import SHARDING_TYPES, KernelCallPerfModel

__all__ = [
    "TERMS",
    "TORCHREC_TERMS",
    "EMBNB_TERMS",
    "cache_spill",
    "unique_rows",
    "ShardTerms",
    "MeasuredRank",
    "Calibration",
    "CalibratedPerfConfig",
    "shard_terms",
    "estimators",
    "rank_terms",
    "measured_ranks",
    "torchrec_default_estimate",
]

# torchrec's PerfCoefficient fields, in the order a shard's terms list them.
TORCHREC_TERMS = (
    "input_read_size_multiplier",
    "lookup_size_multiplier",
    "embedding_output_multiplier",
    "hash_size_multiplier",
)
# Three terms torchrec's formula lacks, added to its forward by `CalibratedPerfConfig.forward`
# (bytes over the device bandwidth, as torchrec's terms): a lookup into a table larger than the
# device's cache misses it, more often the larger the table (`cache_miss_lookup_multiplier` x lookup
# bytes x log2(table bytes / cache bytes): on a 2-core EPYC, fwd + bwd took 59, 92, 235 and 266 ns
# an id at width 128 in tables of 0.5, 5, 51 and 512 MB); every shard is a table of its TBE with a
# cost of its own (`shard_multiplier` x SHARD_BYTES); and the fused optimizer updates each distinct
# row a batch looks up once (`unique_rows_multiplier` x `unique_rows` x row bytes: a shard of few
# rows sees its rows again and again, one of many rows each id anew). All are fitted on the
# measured total (forward and backward), so they carry backward's share.
EMBNB_TERMS = ("cache_miss_lookup_multiplier", "shard_multiplier", "unique_rows_multiplier")
TERMS = TORCHREC_TERMS + EMBNB_TERMS
SHARD_BYTES = float(1 << 20)  # a shard term's bytes per unit of its coefficient
FORMAT = 4  # the JSON layout's version; older ones are read with the terms they lack 0
FORMAT_TERMS = {1: TORCHREC_TERMS, 2: TERMS[:6], 3: TERMS, 4: TERMS}  # the terms each format's JSON lists
# Format 4 adds the rating's terms outside torchrec's per-shard estimate (`KernelCallPerfModel`):
# `kernel_call_ms` (per TBE call on a rank) and `collective_ms` (per sharding type); older: 0.
FITTED = "a rank's measured lookups (its TBEs' fwd + bwd) against torchrec's estimated compute (fwd + bwd)"
# torchrec's default config gives each of these families one set of coefficients
# (estimator/config.py; PerfCoefficientConfig.get_coefficients maps table_column_wise to
# column_wise and grid_shard to table_row_wise). A calibration prices a sharding type it has no
# measurements of as its first fitted sibling, in this order, on the same kernel: at torchrec's
# unscaled defaults, a type no training plan held would look cheap beside the fitted ones (the
# H200 kit's calibrated DP picked table_row_wise so, where only row_wise was fitted).
SIBLINGS = {
    "row_wise": ("table_row_wise", "grid_shard"),
    "table_row_wise": ("row_wise", "grid_shard"),
    "grid_shard": ("table_row_wise", "row_wise"),
    "table_wise": ("column_wise", "table_column_wise"),
    "column_wise": ("table_wise", "table_column_wise"),
    "table_column_wise": ("column_wise", "table_wise"),
}


@dataclass(frozen=True)
class ShardTerms:
    """One shard's estimated compute (fwd + bwd, ms) per unit of each coefficient in `TERMS`."""

    sharding_type: str
    compute_kernel: str
    terms: tuple[float, ...]

    @property
    def group(self) -> tuple[str, str]:
        return (self.sharding_type, self.compute_kernel)


@dataclass(frozen=True)
class MeasuredRank:
    """A rank's measured lookups (its TBEs' forward + backward, ms), the shards it holds and its
    kernel calls (the TBE groups torchrec batches its shards into: `KernelCallPerfModel.kernel_calls`;
    0: not counted, then `fit` fits no `kernel_call_ms`)."""

    lookups_ms: float
    shards: tuple[ShardTerms, ...]
    kernel_calls: int = 0


class CalibratedPerfConfig(EmbeddingPerfEstimatorConfig):
    """torchrec's default perf config with a calibration's forward coefficients (`TERMS`' order) in
    `by_kernel` (the other (sharding type, kernel) pairs keep torchrec's defaults) and backward
    `bwd_multiplier` times torchrec's forward (its own formula when a config gives no backward
    coefficients). `EMBNB_TERMS` are added to the forward through torchrec's `@forward_compute`
    (`cache_bytes`: the device cache the miss term measures tables against; None: no miss term)."""

    def __init__(
        self,
        by_kernel: dict[tuple[str, str], tuple[float, ...]],
        bwd_multiplier: float,
        name: str,
        cache_bytes: float | None = None,
    ) -> None:
        torchrec_count = len(TORCHREC_TERMS)
        self.coefficients = replace(
            EmbeddingPerfEstimatorConfig.coefficients,
            by_kernel={
                group: EstimatorPerfCoefficients(fwd=PerfCoefficient(*forward[:torchrec_count]), bwd=None)
                for group, forward in by_kernel.items()
            },
        )
        added = {group: tuple(forward[torchrec_count:]) for group, forward in by_kernel.items()}
        self.added = {group: values for group, values in added.items() if any(values)}
        self.cache_bytes = cache_bytes
        set_bwd_compute_multiplier(self, bwd_multiplier)
        self.name = name

    @forward_compute
    def forward(self, ctx: Any) -> float:
        """torchrec's forward of the shard (`ctx`: its ShardPerfContext) plus `EMBNB_TERMS`."""
        sizes = forward_sizes(ctx, self)
        added = self.added.get((ctx.sharding_type, ctx.compute_kernel))
        if added is None:
            return sizes.forward_s
        miss, shard, unique = added
        row_bytes = ctx.emb_dim * ctx.table_data_type_size
        spill = cache_spill(ctx.hash_size * row_bytes, self.cache_bytes)
        return (
            sizes.forward_s
            + (
                miss * sizes.lookup_bytes * sizes.penalty * spill
                + shard * SHARD_BYTES
                + unique * unique_rows(sizes.ids, ctx.hash_size) * row_bytes
            )
            / sizes.device_bw
        )


def cache_spill(table_bytes: float, cache_bytes: float | None) -> float:
    """How far a table outgrows a cache of `cache_bytes`: log2 of their ratio, 0 where it fits or
    without a cache size (the miss term's factor per lookup byte)."""
    if cache_bytes is None or table_bytes <= cache_bytes:
        return 0.0
    return math.log2(table_bytes / cache_bytes)


def unique_rows(ids: float, rows: int) -> float:
    """The distinct rows `ids` lookups touch in a shard of `rows` rows, expected where each id is
    any row alike (the bench's batches; a skewed stream touches fewer): rows x (1 - e^(-ids/rows))."""
    if rows <= 0:
        return 0.0
    return -rows * math.expm1(-ids / rows)


@dataclass(frozen=True)
class Calibration:
    """Forward coefficients (`TERMS`' order) per (sharding type, compute kernel), fitted on
    `device_kind` ("cpu", "cuda") named `device_name`; backward is `bwd_multiplier` times forward.
    `fit_errors`: each training rank's relative error of the fitted estimate against its measured
    lookups. `cache_bytes`: the device cache the miss term measured tables against (None: none).

    Two terms price a plan outside torchrec's per-shard estimate, in `KernelCallPerfModel`'s
    rating (`embnb.planner.perf_model`; `create_planner` rates with it): `kernel_call_ms`, ms per
    TBE call on a rank (fwd + bwd; one call per group of tables torchrec batches into one TBE), and
    `collective_ms`, ms per sharding type for one module's input and output distributions of it
    (every rank waits for them). Both 0 (a file of format 1-3): the rating is torchrec's
    NoopPerfModel's."""

    device_kind: str
    device_name: str
    coefficients: dict[tuple[str, str], tuple[float, ...]]
    bwd_multiplier: float = BWD_COMPUTE_MULTIPLIER
    fit_errors: tuple[float, ...] = field(default=())
    cache_bytes: float | None = None
    kernel_call_ms: float = 0.0
    collective_ms: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("device_kind", "device_name"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                raise ValueError(f"{name} must be a non-empty str, got {getattr(self, name)!r}")
        check_number("bwd_multiplier", self.bwd_multiplier, low=0)
        if self.cache_bytes is not None:
            check_number("cache_bytes", self.cache_bytes, low=0, low_open=True)
        check_number("kernel_call_ms", self.kernel_call_ms, low=0)
        for sharding_type, ms in self.collective_ms.items():
            if sharding_type not in SHARDING_TYPES:
                raise ValueError(
                    f"collective_ms: the sharding type must be one of {SHARDING_TYPES}, got {sharding_type!r}"
                )
            check_number(f"collective_ms[{sharding_type!r}]", ms, low=0)
        for group, values in self.coefficients.items():
            if len(values) != len(TERMS) or not all(math.isfinite(v) and v >= 0 for v in values):
                raise ValueError(
                    f"coefficients[{group!r}] must be {len(TERMS)} finite numbers >= 0 ({TERMS}), "
                    f"got {values!r}"
                )

    def priced_as(self, group: tuple[str, str]) -> tuple[str, str] | None:
        """The fitted group whose coefficients price `group` (sharding type, compute kernel):
        itself where fitted, else its first fitted sibling (`SIBLINGS`) on the same kernel; None
        where neither is fitted (torchrec's default coefficients price it)."""
        sharding_type, kernel = group
        for candidate in (sharding_type, *SIBLINGS.get(sharding_type, ())):
            if (candidate, kernel) in self.coefficients:
                return (candidate, kernel)
        return None

    def coefficients_for(self, group: tuple[str, str]) -> tuple[float, ...]:
        """The forward coefficients (`TERMS`' order) this calibration prices `group` with."""
        fitted = self.priced_as(group)
        if fitted is not None:
            return self.coefficients[fitted]
        return _default_forward(*group)

    def perf_config(self) -> CalibratedPerfConfig:
        """The calibration as torchrec's perf config (for its EmbeddingPerfEstimator): the fitted
        groups, and each unfitted sibling of one on the same kernel priced as it."""
        groups = {
            (sibling, kernel)
            for fitted, kernel in self.coefficients
            for sibling in (fitted, *SIBLINGS.get(fitted, ()))
        }
        by_kernel = {group: self.coefficients_for(group) for group in groups}  # siblings are mutual
        name = f"embnb calibration: {self.device_kind} {self.device_name}"
        return CalibratedPerfConfig(by_kernel, self.bwd_multiplier, name, self.cache_bytes)

    def estimate(self, shards: tuple[ShardTerms, ...] | list[ShardTerms], kernel_calls: int = 0) -> float:
        """The calibrated compute (fwd + bwd, ms) of `shards`, e.g. one rank's, each priced as
        `coefficients_for` its group, plus `kernel_call_ms` x the rank's `kernel_calls` (its TBE
        groups; 0: the per-shard part alone, torchrec's estimate)."""
        per_shard = sum(float(np.dot(self.coefficients_for(shard.group), shard.terms)) for shard in shards)
        return per_shard + self.kernel_call_ms * kernel_calls

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "fitted": FITTED,
            "device_kind": self.device_kind,
            "device_name": self.device_name,
            "terms": list(TERMS),
            "bwd_multiplier": self.bwd_multiplier,
            "coefficients": [
                {"sharding_type": st, "compute_kernel": kernel, "fwd": list(values)}
                for (st, kernel), values in sorted(self.coefficients.items())
            ],
            "fit_errors": list(self.fit_errors),
            "cache_bytes": self.cache_bytes,
            "kernel_call_ms": self.kernel_call_ms,
            "collective_ms": dict(sorted(self.collective_ms.items())),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Calibration:
        known = FORMAT_TERMS.get(data.get("format"))
        if known is None or list(known) != data.get("terms"):
            formats = "; ".join(f"format {k}: {list(v)}" for k, v in FORMAT_TERMS.items())
            raise ValueError(
                f"not a calibration of a known format with its terms ({formats}): "
                f"format={data.get('format')!r}, terms={data.get('terms')!r}"
            )
        padding = (0.0,) * (len(TERMS) - len(data["terms"]))  # an older format: no later terms
        return cls(
            device_kind=data["device_kind"],
            device_name=data["device_name"],
            coefficients={
                (row["sharding_type"], row["compute_kernel"]): (*(float(v) for v in row["fwd"]), *padding)
                for row in data["coefficients"]
            },
            bwd_multiplier=float(data["bwd_multiplier"]),
            fit_errors=tuple(float(v) for v in data.get("fit_errors", ())),
            cache_bytes=data.get("cache_bytes"),
            kernel_call_ms=float(data.get("kernel_call_ms", 0.0)),
            collective_ms={str(k): float(v) for k, v in data.get("collective_ms", {}).items()},
        )

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_json(), indent=1) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> Calibration:
        return cls.from_json(json.loads(Path(path).read_text()))


def estimators(
    calibration: Calibration | None,
    topology: Topology,
    constraints: dict[str, ParameterConstraints] | None = None,
) -> list[ShardEstimator] | None:
    """torchrec's default estimators (perf, then storage) with `calibration`'s perf config; None
    (torchrec's defaults) without a calibration."""
    if calibration is None:
        return None
    if not isinstance(calibration, Calibration):
        raise TypeError(f"calibration must be a Calibration or None, got {type(calibration).__name__}")
    return [
        EmbeddingPerfEstimator(topology=topology, constraints=constraints, config=calibration.perf_config()),
        EmbeddingStorageEstimator(topology=topology, constraints=constraints),
    ]


def shard_terms(
    options: list[ShardingOption],
    topology: Topology,
    sharders: list,
    constraints: dict[str, ParameterConstraints] | None = None,
    bwd_multiplier: float = BWD_COMPUTE_MULTIPLIER,
    cache_bytes: float | None = None,
) -> list[list[ShardTerms]]:
    """Each option's shards' terms, by torchrec's EmbeddingPerfEstimator: for each coefficient in
    `TERMS`, the shard's fwd + bwd compute with that coefficient 1 and the others 0 (the miss term
    against a cache of `cache_bytes`). The options' shards keep their perf."""
    sharder_arg = sharders_for_estimators(sharders)
    groups = {(option.sharding_type, option.compute_kernel) for option in options}
    saved = [[shard.perf for shard in option.shards] for option in options]
    columns: list[list[list[float]]] = []
    try:
        for unit in np.eye(len(TERMS)):
            config = CalibratedPerfConfig(
                dict.fromkeys(groups, tuple(unit)), bwd_multiplier, name="unit", cache_bytes=cache_bytes
            )
            EmbeddingPerfEstimator(topology=topology, constraints=constraints, config=config).estimate(
                options, sharder_arg
            )
            columns.append([[_compute(shard) for shard in option.shards] for option in options])
    finally:
        for option, perfs in zip(options, saved):
            for shard, perf in zip(option.shards, perfs):
                shard.perf = perf
    return [
        [
            ShardTerms(option.sharding_type, option.compute_kernel, tuple(column[i][s] for column in columns))
            for s in range(len(option.shards))
        ]
        for i, option in enumerate(options)
    ]


def rank_terms(
    options: list[ShardingOption],
    topology: Topology,
    sharders: list,
    constraints: dict[str, ParameterConstraints] | None = None,
    cache_bytes: float | None = None,
) -> list[list[ShardTerms]]:
    """The terms (`shard_terms`) of the shards each rank holds under a placed plan (`options`, every
    shard's rank set): index r lists rank r's."""
    per_rank: list[list[ShardTerms]] = [[] for _ in range(topology.world_size)]
    every = shard_terms(options, topology, sharders, constraints, cache_bytes=cache_bytes)
    for option, terms in zip(options, every):
        for shard, shard_term in zip(option.shards, terms):
            if shard.rank is None or not 0 <= shard.rank < topology.world_size:
                raise ValueError(
                    f"option {option.name!r}: a shard's rank must be in 0..{topology.world_size - 1} "
                    f"(a placed plan), got {shard.rank!r}"
                )
            per_rank[shard.rank].append(shard_term)
    return per_rank


def measured_ranks(
    options: list[ShardingOption],
    times: Any,
    topology: Topology,
    sharders: list,
    constraints: dict[str, ParameterConstraints] | None = None,
    clock: str = "cpu",
    cache_bytes: float | None = None,
) -> list[MeasuredRank]:
    """A plan measured rank by rank (`times`: `embnb.steptime.StepTimes` of `measure_plan` on this
    plan) as `MeasuredRank`s: each rank's measured lookups (its TBEs' forward + backward, median over
    the repeats by `clock`, "cpu" or "wall", in ms) with the terms of the shards it holds and its
    kernel calls (`KernelCallPerfModel.kernel_calls`: torchrec's TBE groups, the TBEs
    `embnb.steptime` ran). Ranks that hold no shard are left out (nothing to fit)."""
    if clock not in ("cpu", "wall"):
        raise ValueError(f"clock must be 'cpu' or 'wall', got {clock!r}")
    if len(times.ranks) != topology.world_size:
        raise ValueError(
            f"times has {len(times.ranks)} ranks, the topology {topology.world_size}: measure this plan "
            "on this topology's world size"
        )
    per_rank = rank_terms(options, topology, sharders, constraints, cache_bytes)
    calls = KernelCallPerfModel(topology).kernel_calls(options)
    return [
        MeasuredRank(rank.lookup.median_s(clock) * 1e3, tuple(per_rank[rank.rank]), calls[rank.rank])
        for rank in times.ranks
        if per_rank[rank.rank]
    ]


def torchrec_default_estimate(shards: tuple[ShardTerms, ...] | list[ShardTerms]) -> float:
    """torchrec's default estimate (fwd + bwd compute, ms) of `shards`: its default config's
    forward coefficients of each shard's group dotted with the shard's terms."""
    return sum(float(np.dot(_default_forward(*shard.group), shard.terms)) for shard in shards)


def _default_forward(sharding_type: str, compute_kernel: str) -> tuple[float, ...]:
    """torchrec's default forward coefficients of a group, looked up as its estimator does."""
    coefficients = EmbeddingPerfEstimatorConfig.coefficients.get_coefficients(sharding_type, compute_kernel)
    return (*astuple(coefficients.fwd), *(0.0,) * len(EMBNB_TERMS))


def _compute(shard: Any) -> float:
    return shard.perf.fwd_compute + shard.perf.bwd_compute
