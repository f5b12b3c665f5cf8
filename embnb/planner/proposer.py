"""A dynamic-programming sharding Proposer for torchrec's planner.

`DynamicProgrammingProposer` proposes, in order: knapsack runs over memory
bins (`embnb.planner.knapsack`, run by `embnb.planner.search.KnapsackRuns`),
the same with the largest partitioned shard capped, changes of one or two
tables around the best plans (`embnb.planner.search.HillClimb`), and, with a
`KernelCallPerfModel` that prices TBE groups, runs with fewer groups (last:
a summed perf cannot see a group's cost). It places and rates each plan with
a replica of torchrec's partitioner and perf model (`embnb.planner.replica`)
and hands the planner only the plans the replica does not model and its best
one, which checks it. docs/planner.md ("What the proposer computes") says how.

    planner = create_planner(topology, batch_size=512)    # this proposer first
    plan = planner.plan(module, sharders)                 # (the class docstring: a full example)
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Callable, Iterator

import numpy as np
from torch import nn
from torchrec.distributed.planner.types import (
    Enumerator,
    PlannerError,
    PlannerErrorType,
    Proposer,
    ShardingOption,
    Topology,
)
from torchrec.distributed.types import ModuleSharder

from embnb._checks import check_bool, check_int
from embnb._gc import collector_paused
from embnb.planner.knapsack import FrontierSearch
from embnb.planner.perf_model import KernelCallPerfModel
from embnb.planner.refusals import Refusals, no_option_reason, table_name
from embnb.planner.replica import GreedyPerfReplica, Placement
from embnb.planner.search import HillClimb, KnapsackRuns, Start, slowest_rank_tables, unplaced_tables
from embnb.planner.space import SearchSpace, ShardValues, by_table

__all__ = ["DynamicProgrammingProposer"]

logger = logging.getLogger(__name__)

FIRST_REASON = (
    "the first proposal: each table's smallest option (the planner's feedback brings the devices' memory)"
)


class DynamicProgrammingProposer(Proposer):
    """Knapsack proposals, then refinements guided by the planner's feedback.

    Args:
        bins_per_device: memory bins per device on the knapsack's main axis
            (HBM, or DDR on CPU topologies); more bins, finer totals. A
            run's time grows with tables x bins: past 2**28 the bins are
            halved (`embnb.planner.knapsack.MAX_TABLE_BINS`; 5,000 tables on
            1,024 devices get 50 per device).
        ddr_bins_per_device: bins per device on the DDR axis when HBM and DDR
            can both bind (the 2-D knapsack).
        max_caps: knapsack runs with the largest partitioned shard capped, on
            its perf and on its memory (0: the plain knapsack only).
        max_refinements: proposals spent on changing one or two tables of the
            best plans so far.
        bisect: in each knapsack run, bisect past plans the partitioner
            cannot place and propose only the first placed one and a few
            below it (False: every plan of the run, largest memory first,
            as torchrec's DP proposer does).
        slack: also propose plans with 1%, 2%, 4% ... less memory than the
            first placed one (room for the partitioner to balance ranks).
        prune: skip plans whose lower bound on the slowest rank cannot beat
            the best rating so far.
        replay: place and rate plans with a replica of torchrec's
            GreedyPerfPartitioner and NoopPerfModel
            (`embnb.planner.replica`) and propose only those that beat the
            best rating so far; the same plans are considered either way,
            the planner partitions far fewer. Off by itself when the
            planner's answer differs from the replica's (another
            partitioner or perf model).
        performance_model: the planner's `KernelCallPerfModel`, where it
            rates with one (`create_planner` with a calibration): the
            replica rates plans as it does (each rank's TBE calls, the
            plan's collectives), and with nonzero terms the knapsack also
            runs with fewer TBE groups. None: torchrec's NoopPerfModel.

    Why each proposal went to the planner is in `feedback_reasons` (one per
    feedback: the first proposal, a plan the replica does not model, the
    replica's best to check, or every plan with `replay` off); where the
    planner's answer differed from the replica's, and why, in `disagreements`
    (`num_disagreements`).

    Given the sharders before `load` (`expect_sharders`, as `create_planner`
    does), it drops the options they would refuse (`embnb.planner.refusals`:
    FBGEMM's four-column rule, a row-wise rank with no rows on CPU, an
    EmbeddingCollection's dense kernel on CPU, a routed table planned other
    than row-wise); which and why is in `refused`.

    When no plan can fit (a table fits on no device, a table has no option its
    sharders accept, or the tables do not fit the devices together) it
    proposes nothing more and leaves the verdict to the planner (a later
    proposer, or torchrec's own PlannerError); why is in `no_plan_reason`
    (`no_plan_error_type`: torchrec's kind of it) and logged as a warning.

    Example (runs as it is; the README plans 300 tables):

        import torch
        from torchrec import EmbeddingBagCollection, EmbeddingBagConfig
        from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
        from torchrec.distributed.planner import EmbeddingShardingPlanner, Topology

        from embnb.planner import DynamicProgrammingProposer

        tables = [
            EmbeddingBagConfig(name=f"t{i}", feature_names=[f"f{i}"], num_embeddings=10 ** (3 + i % 4),
                               embedding_dim=64)
            for i in range(40)
        ]
        module = EmbeddingBagCollection(tables=tables, device=torch.device("meta"))
        topology = Topology(world_size=8, compute_device="cuda", hbm_cap=2 * 1024**3)
        proposer = DynamicProgrammingProposer()
        planner = EmbeddingShardingPlanner(topology=topology, batch_size=512, proposer=[proposer])
        plan = planner.plan(module, [EmbeddingBagCollectionSharder()])
        print(f"rating {proposer.best_rating:.2f} ms")  # the slowest rank's perf
    """

    def __init__(
        self,
        bins_per_device: int = 100,
        ddr_bins_per_device: int = 10,
        max_caps: int = 8,
        max_refinements: int = 100,
        replay: bool = True,
        *,
        bisect: bool = True,
        slack: bool = True,
        prune: bool = True,
        performance_model: KernelCallPerfModel | None = None,
    ) -> None:
        self._bins_per_device = check_int("bins_per_device", bins_per_device, low=1)
        self._ddr_bins_per_device = check_int("ddr_bins_per_device", ddr_bins_per_device, low=1)
        self._max_caps = check_int("max_caps", max_caps, low=0)
        self._max_refinements = check_int("max_refinements", max_refinements, low=0)
        self._replay = check_bool("replay", replay)
        self._bisect = check_bool("bisect", bisect)
        self._slack = check_bool("slack", slack)
        self._prune = check_bool("prune", prune)
        if performance_model is not None and not isinstance(performance_model, KernelCallPerfModel):
            raise TypeError(
                "performance_model must be a KernelCallPerfModel or None (NoopPerfModel), "
                f"got {type(performance_model).__name__}"
            )
        self.performance_model = performance_model
        self.load([])

    def load(self, search_space: list[ShardingOption], enumerator: Enumerator | None = None) -> None:
        # Why each plan went to the planner (one per feedback), and where the
        # planner's answer differed from the replica's.
        self.feedback_reasons: list[str] = []
        self.disagreements: list[str] = []
        self.num_options = len(search_space)  # the sharding options enumerated (a progress bar shows it)
        if not hasattr(self, "progress"):
            self.progress: Callable[[], None] | None = None  # called per plan considered (a progress bar)
        expected, self._expected_storage = getattr(self, "_expected_storage", None), None
        refusals, self._refusals = getattr(self, "_refusals", None), None
        # Per table, the options its sharders would refuse ("sharding_type/compute_kernel" -> why).
        self.refused: dict[str, dict[str, str]] = {}
        self._loaded_from = search_space  # as the planner gave it (`accepted`)
        with collector_paused():
            if refusals is not None:
                search_space, self.refused = refusals.split(search_space)
            self._load(search_space)
            kept = {table_name(option) for option in search_space}
            lost = [table for table in self.refused if table not in kept]
            if lost:
                self._propose_nothing(
                    no_option_reason(lost, self.refused), PlannerErrorType.STRICT_CONSTRAINTS
                )
            elif expected is not None and self._current is not None and self._begin_search(expected):
                self._current = self._next_proposal(self._current)  # the first placed here too

    def expect_sharders(self, sharders: list[ModuleSharder[nn.Module]], topology: Topology) -> None:
        """The sharders and topology of the next `load`'s plan: its options that they would
        refuse (`embnb.planner.refusals.Refusals`) are dropped before the search, and a table
        left with none stops it (`no_plan_reason` names the table and why each option was
        refused). `create_planner`'s planner hands them over on every `plan`. A new plan
        begins: the last one's `no_plan_reason` is cleared."""
        self._refusals = Refusals(sharders, topology)
        self.no_plan_reason = self.no_plan_error_type = None

    def accepted(self, search_space: list[ShardingOption]) -> list[ShardingOption]:
        """The options of `search_space` that the sharders accept: those the last `load` kept
        if it loaded this search space, else all of them (nothing is known about it)."""
        return self._search_space if search_space is getattr(self, "_loaded_from", None) else search_space

    def expect_storage_constraint(self, storage_constraint: Topology) -> None:
        """The devices' memory after the storage reservation (the topology
        torchrec's planner passes to feedback) for the next `load`, known
        before it: the search then starts at load, and the first plan (each
        table's smallest option, proposed only to learn the memory) is
        placed by the replica like any other, not by the planner.
        `create_planner` hands it over from its storage reservation."""
        self._expected_storage = storage_constraint

    def _load(self, search_space: list[ShardingOption]) -> None:
        self._search_space = search_space
        self._options = by_table(search_space)
        self._space: SearchSpace | None = None
        self._best_rating = math.inf
        self._placed: dict[bytes, bool] = {}  # what the partitioner said per plan
        self._runs: KnapsackRuns | None = None  # the knapsack runs, made once the space is known
        self._run_iter: Iterator[FrontierSearch] = iter(())
        self._fewer_groups: Iterator[FrontierSearch] | None = None  # runs left to last (KnapsackRuns)
        self._search: FrontierSearch | None = None  # the run being proposed from
        self._pending: Iterator[int] = iter(())  # its plans still to consider
        self._index: int | None = None  # the current proposal's place in it
        self._climb: HillClimb | None = None  # the refinements, made once the space is known
        self.num_knapsack_proposals = self.num_refinements = 0  # how the plans considered split
        self.num_replayed = 0  # plans the replica placed and rated instead of the planner
        self._replica: GreedyPerfReplica | None = None
        self._predicted: Placement | None = None  # the replica's answer for the current proposal
        self._best_replayed: tuple[np.ndarray, Placement] | None = None  # the best plan not proposed yet
        self.no_plan_reason: str | None = None  # why it stopped proposing, when no plan can fit
        self.no_plan_error_type: PlannerErrorType | None = None  # torchrec's kind of that reason
        self._reason = FIRST_REASON  # why the current proposal goes to the planner
        # Before the first feedback the device memory is unknown: propose each
        # table's smallest option, like torchrec's DP proposer.
        self._values = ShardValues(search_space)
        memory = self._values.memory
        smallest = [min(range(len(opts)), key=lambda i: memory(opts[i])[:2]) for opts in self._options]
        self._current: np.ndarray | None = np.array(smallest) if smallest else None

    @property
    def num_disagreements(self) -> int:
        """Plans the planner placed or rated otherwise than the replica
        predicted (each one's why is in `disagreements`)."""
        return len(self.disagreements)

    @property
    def best_rating(self) -> float:
        """The best perf rating of the plans placed so far (the slowest rank's
        perf, as torchrec's NoopPerfModel rates it, or `performance_model`;
        inf before any)."""
        return self._best_rating

    def propose(self) -> list[ShardingOption] | None:
        if self._current is None:
            return None
        return [options[o] for options, o in zip(self._options, self._current)]

    def feedback(
        self,
        partitionable: bool,
        plan: list[ShardingOption] | None = None,
        perf_rating: float | None = None,
        storage_constraint: Topology | None = None,
    ) -> None:
        if self._current is None:
            return
        with collector_paused():
            self.feedback_reasons.append(self._reason)
            if self._space is None:
                if storage_constraint is None:
                    raise ValueError("feedback needs the storage_constraint (torchrec's planner passes it)")
                if not self._begin_search(storage_constraint):
                    return
            choice, predicted, self._predicted = self._current, self._predicted, None
            placed = partitionable and perf_rating is not None
            if predicted is not None:  # the replica's best, proposed last: check it
                self._check_replica(predicted, placed, perf_rating)
                return
            if choice is not None:
                ranks = [[s.rank for s in o.shards] for o in plan or []]
                self._record(choice, placed, perf_rating, ranks, None)
            self._current = self._next_proposal()

    def _check_replica(self, predicted: Placement, placed: bool, perf_rating: float | None) -> None:
        """The planner's answer on the replica's best plan: the search is done where it is the
        replica's, else (the planner's partitioner or perf model is not the one the replica
        replays) it starts again without the replica."""
        if (predicted.placed, predicted.rating) == (placed, perf_rating):
            self._current = None
            return
        said = f"rated it {perf_rating!r}" if placed else "could not place it"
        thought = f"rated {predicted.rating!r}" if predicted.placed else "not placed"
        rating = "NoopPerfModel" if self.performance_model is None else repr(self.performance_model)
        self.disagreements.append(
            f"the planner {said}; the replica of GreedyPerfPartitioner and {rating} predicted "
            f"{thought} (the planner's partitioner or perf model is not the one the replica replays)"
        )
        logger.warning(
            "DynamicProgrammingProposer: %s; searching again without the replica", self.disagreements[-1]
        )
        self._replay = False
        self._load(self._search_space)

    def _begin_search(self, storage_constraint: Topology) -> bool:
        """The search space, the replica and the searches, once the devices'
        memory is known; the current proposal mapped onto the options kept.
        False when no plan can fit (and nothing more is proposed)."""
        first = [opts[o] for opts, o in zip(self._options, self._current)]
        try:
            self._space = SearchSpace(self._options, storage_constraint, self._values)
        except PlannerError as error:  # a table fits on no device
            self._propose_nothing(str(error), error.error_type)
            return False
        self._options = self._space.options
        if self._replay:
            self._replica = GreedyPerfReplica(
                self._options, storage_constraint, self._values, performance_model=self.performance_model
            )
        self._current = _indices(first, self._options)  # onto the options kept
        self._runs = KnapsackRuns(
            self._space,
            self._bins_per_device,
            self._ddr_bins_per_device,
            self._max_caps,
            self._bisect,
            self._slack,
            self._option_groups(),
        )
        self._run_iter = iter(self._runs)
        self._fewer_groups = self._runs.fewer_groups()
        best_rating = lambda: self._best_rating  # noqa: E731 (read as the climb goes)
        self._climb = HillClimb(self._space, self._max_refinements, best_rating, self._prune)
        return True

    def _option_groups(self) -> np.ndarray | None:
        """Per (table, option) of the search space, the id of its TBE group (its first shard's
        `tbe_group_keys`, with the module and sharding type), -1 where no option; None where the
        rating prices no group (no `performance_model`, or all its terms 0)."""
        model = self.performance_model
        if model is None or model.is_zero:
            return None
        ids: dict[tuple, int] = {}
        groups = np.full(self._space.perf.shape, -1, dtype=np.int64)
        for t, table in enumerate(self._options):
            for o, option in enumerate(table):
                groups[t, o] = ids.setdefault(model.keys(option)[0], len(ids))
        return groups

    def _next_proposal(self, choice: np.ndarray | None = None) -> np.ndarray | None:
        """The next plan for the planner, from `choice` if given. With the
        replica, every plan it can place is placed and rated here; the
        planner gets the plans it cannot model, then the best one (to check
        the replica against)."""
        while True:
            choice = self._next() if choice is None else choice
            if choice is None:
                best, self._best_replayed = self._best_replayed, None
                if best is None or best[1].rating > self._best_rating:
                    return None
                choice, self._predicted = best
                self._reason = f"the replica's best plan (rated {best[1].rating!r}), for the planner to check"
                return choice
            placement = self._replica.place(choice) if self._replica is not None else None
            if placement is None:
                self._reason = (
                    "replay off: every plan goes to the planner"
                    if self._replica is None
                    else f"the replica does not model it: {self._replica.unmodelled(choice)}"
                )
                return choice
            self.num_replayed += 1
            if placement.placed and placement.rating < self._best_rating:
                self._best_replayed = (choice, placement)
            self._record(choice, placement.placed, placement.rating, None, placement)
            choice = None

    def _record(
        self,
        choice: np.ndarray,
        placed: bool,
        perf_rating: float | None,
        ranks: list[list[int | None]] | None,
        placement: Placement | None,
    ) -> None:
        """What the partitioner said (or would say) about `choice`; where
        refinements may start from it. `ranks`: each shard's rank as the
        planner set it, or None where `placement` (the replica's answer)
        works them out, only for the starts refined."""
        self._placed[choice.tobytes()] = placed
        if self.progress is not None:
            self.progress()
        if self._index is not None:  # a knapsack plan
            self._search.record(self._index, placed, perf_rating)
        # Which tables to change first is worked out only for the starts refined.
        if placed:
            self._best_rating = min(self._best_rating, perf_rating)
            tables = functools.partial(slowest_rank_tables, self._space, choice, ranks, placement)
            self._climb.add(Start(perf_rating, choice, tables, True))
        else:  # refine by its bound, changing first the table that did not fit
            tables = functools.partial(unplaced_tables, self._space, choice, ranks, placement)
            self._climb.add(Start(self._space.lower_bound(choice), choice, tables, False))

    def _propose_nothing(
        self, reason: str, error_type: PlannerErrorType = PlannerErrorType.INSUFFICIENT_STORAGE
    ) -> None:
        """No plan can fit: stop proposing and say why. Raising here would
        stop torchrec's planner before its later proposers and its own no-plan
        report (its Stats, its PlannerError); the reason stays in
        `no_plan_reason` and in a warning (`create_planner`'s planner raises
        it as its PlannerError)."""
        self.no_plan_reason, self.no_plan_error_type = reason, error_type
        self._current, self._climb = None, None
        logger.warning("DynamicProgrammingProposer proposes nothing: %s", reason)

    def _next(self) -> np.ndarray | None:
        choice = self._next_knapsack()
        if choice is not None:
            self.num_knapsack_proposals += 1
            return choice
        choice = None if self._climb is None else self._climb.next(lambda c: c.tobytes() in self._placed)
        if choice is not None:
            self.num_refinements += 1
            return choice
        if self._fewer_groups is not None:  # last, so they only add plans to what the rest found
            self._run_iter, self._fewer_groups = self._fewer_groups, None
            return self._next()
        return None

    def _next_knapsack(self) -> np.ndarray | None:
        self._index = None
        while True:
            if self._search is None:
                self._search = next(self._run_iter, None)
                if self._search is None:
                    if self._runs is not None and self._runs.no_fit_reason and self.no_plan_reason is None:
                        self._propose_nothing(self._runs.no_fit_reason)
                    return None
                self._pending = self._search.indices()
            for i in self._pending:
                # A copy as option indices: the run keeps its plans in bytes, and a view
                # kept by a refinement's start would keep the whole run's plans alive.
                choice = self._search.plans[i].astype(np.int64)
                known = self._placed.get(choice.tobytes())
                if known is not None or not self._search.fits(i):
                    self._search.record(i, bool(known), None)
                elif self._prune and self._search.cannot_win(i, self._best_rating):
                    self._search.record(i, None, None)
                else:
                    self._index = i
                    return choice
            self._search = None


def _indices(proposal: list[ShardingOption], options: list[list[ShardingOption]]) -> np.ndarray | None:
    """`proposal` as option indices, or None if an option was dropped."""
    try:
        return np.array([[id(o) for o in opts].index(id(p)) for p, opts in zip(proposal, options)])
    except ValueError:
        return None
