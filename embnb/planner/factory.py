"""The planner a user calls: torchrec's EmbeddingShardingPlanner with embnb's DP first.

planner = create_planner(topology, batch_size=512)   # or create_planner("auto", 512)
plan = planner.plan(module, sharders)
planner.rating, planner.rank_perf, planner.rank_hbm   # the chosen plan's estimates
"""

from __future__ import annotations

import contextlib
import gc
import logging
import math
import sys
import warnings

import torch
from torchrec.distributed.planner.planners import EmbeddingShardingPlanner
from torchrec.distributed.planner.proposers import UniformProposer
from torchrec.distributed.planner.storage_reservations import (
    FixedPercentageStorageReservation,
    HeuristicalStorageReservation,
)
from torchrec.distributed.planner.types import (
    Enumerator,
    ParameterConstraints,
    PlannerError,
    Proposer,
    ShardingOption,
    StorageReservation,
    Topology,
)

from embnb._checks import check_bool, check_int, check_number
from embnb._gc import collector_paused
from embnb._torchrec_private import best_plan
from embnb.planner.calibration import Calibration, estimators
from embnb.planner.enumerator import default_enumerator, make_enumerator
from embnb.planner.partitioner import HeapSearchPartitioner
from embnb.planner.perf_model import KernelCallPerfModel
from embnb.planner.proposer import DynamicProgrammingProposer
from embnb.planner.topology import topology_for_device

__all__ = [
    "create_planner",
    "EmbnbShardingPlanner",
    "Fallback",
    "FixedReservation",
    "HeuristicalReservation",
    "RESERVATIONS",
    "make_reservation",
]

# What create_planner's `storage_reservation` names: torchrec's default (dense
# parameters, KJTs and the percentage of each device) or a fixed percentage.
RESERVATIONS = ("heuristical", "fixed")


class _HandsOverReserved:
    """A storage reservation that also hands the devices' memory it leaves to
    `proposer` (set by create_planner): torchrec's planner reserves before it
    loads the proposers, so the DP's first plan needs no partition (and no
    deep copy) by the planner."""

    proposer: DynamicProgrammingProposer | None = None

    def reserve(self, *args, **kwargs) -> Topology:
        reserved = super().reserve(*args, **kwargs)
        if self.proposer is not None:
            self.proposer.expect_storage_constraint(reserved)
        return reserved


class _DryRunNotice(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "dense tensor size calculation in dry run" not in record.getMessage()


class HeuristicalReservation(_HandsOverReserved, HeuristicalStorageReservation):
    """torchrec's default reservation (dense parameters, KJTs and a percentage), handing over.

    torchrec 1.6-1.8 warn on every construction (a FutureWarning, even with a
    dense estimate) and log a dry-run notice on every reserve without one.
    It is torchrec's planner's own default, kept on purpose (docs/planner.md
    says what it reserves), and the dense size it computes from parameter
    shapes is exact on a meta module too: neither message is one a user of
    create_planner can act on, so both are silenced here, and only here."""

    def __init__(self, percentage: float) -> None:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "HeuristicalStorageReservation is known", FutureWarning)
            super().__init__(percentage=percentage)

    def reserve(self, *args, **kwargs) -> Topology:
        logger, notice = logging.getLogger(HeuristicalStorageReservation.__module__), _DryRunNotice()
        logger.addFilter(notice)
        try:
            return super().reserve(*args, **kwargs)
        finally:
            logger.removeFilter(notice)


class FixedReservation(_HandsOverReserved, FixedPercentageStorageReservation):
    """A fixed percentage of each device, handing over."""


def make_reservation(
    storage_reservation: StorageReservation | str, percentage: float = 0.15
) -> StorageReservation:
    """`storage_reservation` as a torchrec StorageReservation: "heuristical"
    is what torchrec's EmbeddingShardingPlanner uses by default
    (HeuristicalStorageReservation(percentage)), "fixed"
    FixedPercentageStorageReservation(percentage) (subclasses that can hand
    the reserved memory to the DP); an instance is used as it is."""
    check_number("storage_reservation_percentage", percentage, low=0, high=1, high_open=True)
    if isinstance(storage_reservation, StorageReservation):
        return storage_reservation
    if storage_reservation == "heuristical":
        return HeuristicalReservation(percentage)
    if storage_reservation == "fixed":
        return FixedReservation(percentage=percentage)
    raise ValueError(
        f"storage_reservation must be one of {RESERVATIONS} or a torchrec StorageReservation, "
        f"got {storage_reservation!r}"
    )


class Fallback(Proposer):
    """`fallback`'s proposals only where `primary` placed no plan and did not
    prove that none exists (its `no_plan_reason`: a table fits on no device,
    a table has no option its sharders accept, or the tables do not fit the
    devices together), from the options `primary` kept (the ones the
    sharders accept, `accepted`).

    torchrec's planner loads every proposer first, then asks each for its
    proposals in turn, so by the time this one is asked, `primary` is done.
    Loading and partitioning the fallback's proposals after the DP placed a
    plan costs six more partitions for plans that only matter where the DP
    has none; after a proof, they cannot be placed either (at 1,024 devices
    they took a minute)."""

    def __init__(self, primary: DynamicProgrammingProposer, fallback: Proposer) -> None:
        self.primary, self.fallback = primary, fallback
        self._loaded: tuple | None = None  # load's arguments, until the fallback is needed
        self._asked = self._active = False

    def load(self, search_space: list[ShardingOption], enumerator: Enumerator | None = None) -> None:
        self._loaded, self._asked, self._active = (search_space, enumerator), False, False

    def propose(self) -> list[ShardingOption] | None:
        if not self._asked:
            self._asked = True
            placed_none = math.isinf(self.primary.best_rating) and self.primary.no_plan_reason is None
            self._active = self._loaded is not None and placed_none
            if self._active:
                search_space, enumerator = self._loaded
                self.fallback.load(self.primary.accepted(search_space), enumerator)
        return self.fallback.propose() if self._active else None

    def feedback(
        self,
        partitionable: bool,
        plan: list[ShardingOption] | None = None,
        perf_rating: float | None = None,
        storage_constraint: Topology | None = None,
    ) -> None:
        if self._active:
            self.fallback.feedback(partitionable, plan, perf_rating, storage_constraint)


class EmbnbShardingPlanner(EmbeddingShardingPlanner):
    """torchrec's EmbeddingShardingPlanner as `create_planner` builds it, with
    the chosen plan's estimates readable after `plan()`:

        plan = planner.plan(module, sharders)
        planner.rating      # ms: the slowest rank's estimated perf, as torchrec rates plans
        planner.rank_perf   # ms per rank (torchrec's stats table: "Total Perf")
        planner.rank_hbm    # bytes of HBM per rank, as the plan's shards estimate them (rank_ddr: DDR)

    `plan` hands its sharders to `dp_proposer` (`expect_sharders`), which
    proposes no option they would refuse (`embnb.planner.refusals`). Where
    the DP proposer proved that no plan exists, the PlannerError raised
    gives its reason (the tables, what they need, why their options were
    refused) instead of torchrec's summary of the proposals it partitioned
    (none, then: its memory figures would be its sentinel, 8589934592.0 GB).

    Args:
        topology: the topology planned for (EmbeddingShardingPlanner's).
        dp_proposer: the DynamicProgrammingProposer among the planner's proposers.
        progress: a tqdm bar while it plans (`create_planner`'s `progress`).
        **kwargs: EmbeddingShardingPlanner's other arguments.
    """

    def __init__(
        self,
        *,
        topology: Topology,
        dp_proposer: DynamicProgrammingProposer,
        progress: bool = False,
        **kwargs,
    ) -> None:
        super().__init__(topology=topology, **kwargs)
        self.topology, self.dp_proposer, self.world_size = topology, dp_proposer, topology.world_size
        self.progress = progress

    def plan(self, module, sharders):
        """torchrec's plan, with the cyclic garbage collector paused throughout
        (`collector_paused`; docs/planner.md, "What is computed once") and the one
        collection that planning leaves due run before it returns, inside its time. With
        `progress`, one tqdm bar: the enumeration, then the plans the DP considers."""
        self.dp_proposer.expect_sharders(sharders, self.topology)
        try:
            with self._progress_bar(), collector_paused():
                planned = super().plan(module, sharders)
        except PlannerError as error:
            reason = self.dp_proposer.no_plan_reason
            if reason is None:  # torchrec's report of the proposals that failed to place
                raise
            raise PlannerError(
                f"Unable to find a plan for this model: {reason}",
                error_type=self.dp_proposer.no_plan_error_type or error.error_type,
            ) from None
        if gc.isenabled():
            gc.collect(0)
        return planned

    @contextlib.contextmanager
    def _progress_bar(self):
        if not self.progress:
            yield
            return
        from tqdm.auto import tqdm

        proposer = self.dp_proposer
        with tqdm(
            desc="planning: enumerating options",
            unit=" plans",
            bar_format="{desc}{n_fmt}{unit} [{elapsed}{postfix}]",
            delay=PROGRESS_DELAY_S,
        ) as bar:

            def considered() -> None:
                if bar.n == 0:  # the DP's first plan: the enumeration is over
                    bar.set_description(
                        f"planning: {proposer.num_options:,} options enumerated, plans considered"
                    )
                bar.update()
                if bar.n % 50 == 1 and math.isfinite(proposer.best_rating):
                    bar.set_postfix_str(f"best {proposer.best_rating:.4g} ms", refresh=False)

            proposer.progress = considered
            try:
                yield
            finally:
                proposer.progress = None

    def _chosen(self) -> list[ShardingOption]:
        chosen = best_plan(self)
        if chosen is None:
            raise RuntimeError("no plan yet: call plan(module, sharders) first")
        return chosen

    def _per_rank(self, value) -> list:
        """`value(shard)` summed over each rank's shards under the chosen plan."""
        totals = [0] * self.world_size
        for option in self._chosen():
            for shard in option.shards:
                totals[shard.rank] += value(shard)
        return totals

    @property
    def rank_perf(self) -> list[float]:
        """Each rank's estimated perf (ms) under the chosen plan: the sum of its shards' perf."""
        return self._per_rank(lambda shard: shard.perf.total)

    @property
    def rank_hbm(self) -> list[int]:
        """Each rank's HBM bytes under the chosen plan: the sum of its shards' storage."""
        return self._per_rank(lambda shard: shard.storage.hbm)

    @property
    def rank_ddr(self) -> list[int]:
        """Each rank's DDR bytes under the chosen plan (where a CPU topology keeps its tables)."""
        return self._per_rank(lambda shard: shard.storage.ddr)

    @property
    def rating(self) -> float:
        """The chosen plan's rating (ms), as the planner rated it to pick the best: its slowest
        rank's perf (NoopPerfModel), or its `dp_proposer.performance_model`'s rating."""
        model = self.dp_proposer.performance_model
        return max(self.rank_perf) if model is None else model.rate(self._chosen())


def create_planner(
    topology: Topology | str | torch.device,
    batch_size: int,
    *,
    world_size: int | None = None,
    local_world_size: int | None = None,
    storage_reservation_percentage: float = 0.15,
    intra_host_bw: float | None = None,
    inter_host_bw: float | None = None,
    bins_per_device: int = 100,
    constraints: dict[str, ParameterConstraints] | None = None,
    timeout_seconds: int | None = None,
    enumerator: str | None = None,
    storage_reservation: StorageReservation | str = "heuristical",
    progress: bool | None = None,
    calibration: Calibration | None = None,
) -> EmbnbShardingPlanner:
    """torchrec's EmbeddingShardingPlanner with this DP proposer, and torchrec's
    UniformProposer as a fallback where the DP places no plan (`Fallback`).
    Its partitioner is `HeapSearchPartitioner`: torchrec's
    GreedyPerfPartitioner, the same plans, a device partition that does not
    pop the devices too full for a shard (seconds at 1,024 devices).

    `topology` is a Topology, or a device ("auto", "cpu", "cuda") whose
    topology is read from the machine for `world_size` ranks (default: the
    process group's, else 1). Where a default process group is initialized,
    the world size planned for (`world_size` or the Topology's) must be its
    size: a plan for another size fails deep inside DistributedModelParallel.
    The planner returned is an `EmbnbShardingPlanner`: its `world_size` says
    which size it used, `rating`, `rank_perf` and `rank_hbm` the plan's estimates.
    `storage_reservation`: what each device keeps
    for everything but the embedding tables, as torchrec's
    EmbeddingShardingPlanner keeps it by default ("heuristical": dense
    parameters, KJTs and `storage_reservation_percentage` of the device),
    or only that percentage ("fixed"), or a torchrec StorageReservation.
    `progress`: a tqdm bar (the enumeration, then the plans the DP
    considers) for plans that take more than `PROGRESS_DELAY_S`; None: only
    when a terminal or a notebook is attached. `enumerator`:
    "embnb" (`DistinctShardEnumerator`: torchrec's options, field by field,
    many times faster) or "torchrec" (its EmbeddingEnumerator); None: "embnb"
    on the torchrec versions the two are tested equal on, else "torchrec"
    (`default_enumerator`). `calibration`: torchrec's perf estimator runs its
    fitted config (`embnb.planner.calibration`) instead of torchrec's default;
    the enumerator's fast path stays on; and the planner rates plans with a
    `KernelCallPerfModel` of its `kernel_call_ms` and `collective_ms` (the
    DP's replica rates them alike; both 0: NoopPerfModel's ratings).
    """
    check_int("batch_size", batch_size, low=1)
    reservation = make_reservation(storage_reservation, storage_reservation_percentage)
    dist = torch.distributed
    group_size = dist.get_world_size() if dist.is_available() and dist.is_initialized() else None
    asked = topology.world_size if isinstance(topology, Topology) else world_size
    if group_size is not None and asked is not None and asked != group_size:
        given = "the Topology's world_size" if isinstance(topology, Topology) else "world_size"
        raise ValueError(
            f"{given}={asked} but the default process group has {group_size} ranks: a plan must be for "
            f"the ranks that run it (pass world_size={group_size}, or leave it out to use the group's)"
        )
    if not isinstance(topology, Topology):
        if world_size is None:
            world_size = 1 if group_size is None else group_size
        topology = topology_for_device(topology, world_size, local_world_size, intra_host_bw, inter_host_bw)
    calibrated = estimators(calibration, topology, constraints)  # checks `calibration`'s type
    # With a calibration, plans are rated with its kernel-call and collective terms too, by the
    # planner and by the DP's replica alike (at zero terms: NoopPerfModel's ratings).
    performance_model = (
        None if calibration is None else KernelCallPerfModel.from_calibration(topology, calibration)
    )
    proposer = DynamicProgrammingProposer(
        bins_per_device=bins_per_device, performance_model=performance_model
    )
    if not isinstance(storage_reservation, StorageReservation):  # made here: not the caller's
        reservation.proposer = proposer
    return EmbnbShardingPlanner(
        dp_proposer=proposer,
        progress=attached() if progress is None else check_bool("progress", progress),
        topology=topology,
        batch_size=batch_size,
        enumerator=make_enumerator(
            default_enumerator() if enumerator is None else enumerator,
            topology,
            batch_size,
            constraints,
            calibrated,
        ),
        constraints=constraints,
        storage_reservation=reservation,
        partitioner=HeapSearchPartitioner(),
        proposer=[proposer, Fallback(proposer, UniformProposer())],
        timeout_seconds=timeout_seconds,
        debug=False,
        performance_model=performance_model,
    )


PROGRESS_DELAY_S = 2.0  # plans quicker than this show no bar


def attached() -> bool:
    """Whether a terminal (stderr) or a notebook kernel is attached."""
    if sys.stderr is not None and hasattr(sys.stderr, "isatty") and sys.stderr.isatty():
        return True
    shell = getattr(sys.modules.get("IPython"), "get_ipython", lambda: None)()
    return shell is not None and "IPKernelApp" in getattr(shell, "config", {})
