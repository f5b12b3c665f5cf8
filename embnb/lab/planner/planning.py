"""One planning run in torchrec's planner, timed: a proposer over enumerated options
(`run_planner`), and `create_planner` from the model to the plan as training code calls it
(`time_end_to_end`); a plan's load per rank, and results as JSON's plain values."""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import logging
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import torch
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.planner.partitioners import GreedyPerfPartitioner
from torchrec.distributed.planner.perf_models import NoopPerfModel
from torchrec.distributed.planner.planners import EmbeddingShardingPlanner
from torchrec.distributed.planner.storage_reservations import FixedPercentageStorageReservation
from torchrec.distributed.planner.types import (
    Enumerator,
    ParameterConstraints,
    PlannerError,
    Proposer,
    ShardingOption,
    Topology,
)
from torchrec.distributed.planner.utils import reset_shard_rank
from torchrec.modules.embedding_configs import EmbeddingBagConfig
from torchrec.modules.embedding_modules import EmbeddingBagCollection

from embnb._checks import check_int
from embnb._torchrec_private import best_plan, num_proposals, planner_proposers
from embnb.lab.logs import quiet_torch_fx
from embnb.lab.planner.models import Enumerated
from embnb.planner.factory import create_planner
from embnb.planner.space import GB
from embnb.timing import Stopwatch

__all__ = ["PlanRun", "run_planner", "EndToEnd", "time_end_to_end", "rank_loads", "records", "plain"]
__all__ += ["quiet_logs", "clocked"]


def quiet_logs() -> None:
    """What a notebook quiets: torchrec's planner logs every proposal and warns for each
    data-parallel table; torch.fx logs a deprecation (here and in anything started from here)."""
    logging.getLogger("torchrec").setLevel(logging.ERROR)
    logging.getLogger().setLevel(logging.ERROR)
    pd.set_option("display.width", 140)
    quiet_torch_fx()


def records(table: pd.DataFrame, orient: str = "index") -> Any:
    """A table as JSON's plain values (NaN as None), by row label (or a list: orient="records")."""
    return plain(table.to_dict(orient=orient))


def plain(value: Any) -> Any:
    """JSON's plain values: dataclasses as dicts (fields named in `repr`), numpy scalars as
    numbers, NaN and inf as None."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = {f.name: getattr(value, f.name) for f in dataclasses.fields(value) if f.repr}
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, np.generic):
        value = value.item()
    return None if isinstance(value, float) and not math.isfinite(value) else value


class _Replay(Enumerator):
    """Hands out one enumeration again (its estimates already populated)."""

    def __init__(self, options: list[ShardingOption]) -> None:
        self._options = options

    def enumerate(self, module, sharders) -> list[ShardingOption]:
        reset_shard_rank(self._options)
        return list(self._options)

    def populate_estimates(self, sharding_options) -> None:
        pass


@contextlib.contextmanager
def clocked(obj: Any, *methods: str) -> Iterator[Stopwatch]:
    """A Stopwatch summing the wall seconds of every call of `obj`'s `methods` in the block: each is
    wrapped on the instance (the class's method again after), so what calls it is left alone."""
    watch = Stopwatch()

    def timed(method: Callable) -> Callable:
        def call(*args, **kwargs):
            with watch:
                return method(*args, **kwargs)

        return call

    for name in methods:
        setattr(obj, name, timed(getattr(obj, name)))
    try:
        yield watch
    finally:
        for name in methods:
            delattr(obj, name)


@dataclass(frozen=True)
class PlanRun:
    """One EmbeddingShardingPlanner.plan: its best plan (placed; None: no plan, `note` says why),
    NoopPerfModel's rating of it (the slowest rank; NaN: no plan), the proposals the planner
    evaluated, the seconds it took (of them, in the proposers and in torchrec's partitioner) and
    whether the time limit cut a proposer short."""

    proposer: str
    plan: list[ShardingOption] | None
    perf_rating: float
    proposals: int
    seconds: float
    timed_out: bool
    note: str
    proposer_s: float = math.nan
    partitioner_s: float = math.nan


def run_planner(
    proposer: Proposer | list[Proposer],
    enumerated: Enumerated,
    topology: Topology,
    batch_size: int,
    *,
    name: str = "",
    storage_reservation_percentage: float = 0.15,
    constraints: dict[str, ParameterConstraints] | None = None,
    timeout_s: float | None = None,
) -> PlanRun:
    """Plan with torchrec's EmbeddingShardingPlanner and these proposers,
    under FixedPercentageStorageReservation(storage_reservation_percentage)."""
    proposers = proposer if isinstance(proposer, list) else [proposer]
    # a DP proposer's rating (KernelCallPerfModel) is the planner's too: else its check of its replica fails
    rating = next((p.performance_model for p in proposers if getattr(p, "performance_model", None)), None)
    partitioner = GreedyPerfPartitioner()
    planner = EmbeddingShardingPlanner(  # stats=[]: torchrec's default stats would format every plan
        topology=topology,
        batch_size=batch_size,
        enumerator=_Replay(enumerated.options),
        storage_reservation=FixedPercentageStorageReservation(percentage=storage_reservation_percentage),
        proposer=proposers,
        partitioner=partitioner,
        stats=[],
        constraints=constraints,
        debug=False,
        timeout_seconds=None if timeout_s is None else max(1, math.ceil(timeout_s)),
        performance_model=rating,
    )
    note, watch = "", Stopwatch()
    with contextlib.ExitStack() as stack:
        in_proposers = [stack.enter_context(clocked(p, "load", "propose", "feedback")) for p in proposers]
        in_partitioner = stack.enter_context(clocked(partitioner, "partition"))
        try:
            with watch:
                planner.plan(enumerated.module, enumerated.sharders)
        except PlannerError as error:  # a proposer's own reason says more than torchrec's summary
            reasons = [getattr(p, "no_plan_reason", None) for p in proposers]
            reason = next(filter(None, reasons), None) or str(error).strip().splitlines()[0]
            note = f"no plan: {reason[:200]}"
        except Exception as error:  # e.g. torchrec's DP divides by zero on CPU topologies
            note = f"failed: {type(error).__name__}: {str(error).strip()[:160]}"
    reset_shard_rank(enumerated.options)
    plan = best_plan(planner)  # a placed copy; None where no plan fit
    # The planner stops asking at its time limit; a proposer that still has a proposal was cut.
    timed_out = (
        timeout_s is not None
        and watch.wall_s >= math.ceil(timeout_s)
        and any(p.propose() is not None for p in proposers)
    )
    return PlanRun(
        name or "+".join(type(p).__name__ for p in proposers),
        plan,
        (rating or NoopPerfModel(topology)).rate(plan) if plan else math.nan,
        num_proposals(planner),
        watch.wall_s,
        timed_out,
        note,
        sum(w.total_s for w in in_proposers),
        in_partitioner.total_s,
    )


@dataclass(frozen=True)
class EndToEnd:
    """`create_planner(...).plan(module, sharders)` timed as a user calls it: every run's seconds
    (each from a fresh module and planner), the DP's rating of its plan (inf: no plan) and whether
    every run rated alike."""

    seconds: list[float]
    rating: float
    same_rating_every_run: bool


def time_end_to_end(
    tables: Sequence[EmbeddingBagConfig],
    topology: Topology,
    batch_size: int,
    constraints: dict[str, ParameterConstraints] | None = None,
    *,
    repeats: int = 1,
    enumerator: str | None = None,
    storage_reservation: str = "heuristical",
) -> EndToEnd:
    """From the model to the plan: an EmbeddingBagCollection of `tables` (on meta) planned by
    `create_planner(topology, batch_size, constraints=..., enumerator=..., storage_reservation=...)`
    (enumerator None: create_planner's default), `repeats` times, the garbage of the run before collected
    first, outside the timing (each run needs a fresh module and planner)."""
    check_int("repeats", repeats, low=1)
    seconds, ratings = [], []
    for _ in range(repeats):
        module = EmbeddingBagCollection(tables=list(tables), device=torch.device("meta"))
        chosen = create_planner(
            topology,
            batch_size,
            constraints=constraints,
            enumerator=enumerator,
            storage_reservation=storage_reservation,
        )
        gc.collect()
        with Stopwatch() as watch:
            chosen.plan(module, [EmbeddingBagCollectionSharder()])
        seconds.append(watch.wall_s)
        ratings.append(planner_proposers(chosen)[0].best_rating)  # create_planner's DP
        del module, chosen
    return EndToEnd(seconds, ratings[0], len(set(ratings)) == 1)


def rank_loads(plan: Sequence[ShardingOption], world_size: int) -> pd.DataFrame:
    """torchrec's estimates of a placed plan summed per rank, one row each: `perf` (ms, what its
    rating takes the maximum of), of it `compute` and `comms` (forward + backward), and memory
    `hbm_gb` and `ddr_gb` (GiB)."""
    shards = [shard for option in plan for shard in option.shards]
    ranks = np.array([shard.rank for shard in shards], dtype=np.int64)
    columns = {
        "perf": [s.perf.total for s in shards],
        "compute": [s.perf.fwd_compute + s.perf.bwd_compute for s in shards],
        "comms": [s.perf.fwd_comms + s.perf.bwd_comms for s in shards],
        "hbm_gb": [s.storage.hbm / GB for s in shards],
        "ddr_gb": [s.storage.ddr / GB for s in shards],
    }
    loads = {name: np.bincount(ranks, values, minlength=world_size) for name, values in columns.items()}
    return pd.DataFrame(loads).rename_axis("rank")
