"""torchrec's EmbeddingEnumerator with each distinct shard's perf estimated once.

    enumerator = DistinctShardEnumerator(topology, batch_size=512, constraints=model.constraints)
    options = enumerator.enumerate(module, sharders)   # the same options as EmbeddingEnumerator's

Where torchrec's enumerator spends its time (cProfile, 200 tables x 64 devices, 3,200
options with 91,592 shards, 60 s under the profiler): 83% in its default perf estimator,
which runs `compute_perf` once per shard, and most of that is looking the estimator
config's annotated methods up by reflection (`dir()` 1.3 million times) on every call;
15% is the deep copy of the options it keeps for its cache. Yet the shards of an option
mostly look alike: a row-wise option over 64 devices has at most two distinct shard
sizes, a data-parallel one a single one.

This enumerator is torchrec's (same options, same order: torchrec's own code builds
them); only the perf estimate differs in how often it runs. torchrec's estimator builds
a context per shard (`ShardPerfContext`, a plain dataclass of everything the
estimate reads) and computes the shard's perf from that context and the estimator's
config alone. Here the contexts are built the same way, and shards whose contexts are
equal, field by field, share one computation (each shard still gets its own Perf).
Every other estimator (storage) runs as torchrec runs it.
"""

from __future__ import annotations

import copy
import inspect
from typing import Any

from torchrec.distributed.planner.enumerators import EmbeddingEnumerator
from torchrec.distributed.planner.estimator.estimator import (
    EmbeddingPerfEstimator,
    get_embedding_perf_sharding_evaluator,
)
from torchrec.distributed.planner.estimator.types import ShardPerfContext
from torchrec.distributed.planner.types import ParameterConstraints, ShardEstimator, ShardingOption, Topology
from torchrec.distributed.planner.utils import sharder_name

from embnb._checks import check_choice

__all__ = ["ENUMERATORS", "DistinctShardEnumerator", "make_enumerator"]

# torchrec 1.7+ hands estimators a snapshot of each sharder (SharderData, keyed by
# the option's module type); 1.6 hands them the sharders themselves.
_SHARDER_DATA = "sharder_data" in inspect.signature(ShardPerfContext.build_shard_perf_contexts).parameters


class DistinctShardEnumerator(EmbeddingEnumerator):
    """An EmbeddingEnumerator whose perf estimate computes each distinct shard of an option once.

    `estimator`: as torchrec's (default: its perf and storage estimators). A torchrec
    EmbeddingPerfEstimator among them is the one sped up, on the premise that a shard's
    perf follows from its context and the estimator's config alone (true of torchrec's
    own configs; a config with custom annotated methods must keep to it too). Any
    other estimator runs as in torchrec.
    """

    def __init__(
        self,
        topology: Topology,
        batch_size: int,
        constraints: dict[str, ParameterConstraints] | None = None,
        estimator: ShardEstimator | list[ShardEstimator] | None = None,
    ) -> None:
        super().__init__(
            topology=topology, batch_size=batch_size, constraints=constraints, estimator=estimator
        )

    def populate_estimates(self, sharding_options: list[ShardingOption]) -> None:
        # The same estimators in the same order as torchrec's populate_estimates.
        sharders = self._sharder_data_map if _SHARDER_DATA else self._sharder_map
        for estimator in self._estimators:
            if type(estimator) is EmbeddingPerfEstimator:
                self._estimate_perf(estimator, sharding_options)
            else:
                estimator.estimate(sharding_options, sharders)

    def _estimate_perf(
        self, estimator: EmbeddingPerfEstimator, sharding_options: list[ShardingOption]
    ) -> None:
        """torchrec's EmbeddingPerfEstimator.estimate, computing each distinct context once."""
        config = estimator.config
        for option in sharding_options:
            config.validate_sharding_type(option.sharding_type)
            shard_sizes = [shard.size for shard in option.shards]
            contexts = ShardPerfContext.build_shard_perf_contexts(
                config=config,
                shard_sizes=shard_sizes,
                sharding_option=option,
                topology=estimator._topology,
                constraints=estimator._constraints,
                is_inference=estimator.is_inference,
                use_batch_inputs_for_expected_cache_fetches=estimator._use_batch_inputs_for_expected_cache_fetches,
                use_linear_regression_prefetch_estimate=estimator._use_linear_regression_prefetch_estimate,
                **self._sharder_argument(option),
            )
            if contexts:
                option.is_weighted = contexts[0].is_weighted
            computed: dict[tuple, Any] = {}  # context key -> Perf, within this option
            for shard, context, key in zip(option.shards, contexts, _context_keys(contexts)):
                perf = computed.get(key)
                if perf is None:
                    evaluator = get_embedding_perf_sharding_evaluator(
                        sharding_type=context.sharding_type, is_inference=context.is_inference
                    )
                    shard.perf = computed[key] = evaluator.compute_perf(ctx=context, config=config)
                else:
                    shard.perf = copy.copy(perf)  # one Perf per shard, as torchrec gives
            perfs = [shard.perf for shard in option.shards if shard.perf is not None]
            perfs = config.post_process_perfs(
                shard_perfs=perfs,
                shard_sizes=shard_sizes,
                sharding_type=option.sharding_type,
                uneven_sharding_perf_multiplier=estimator._topology.uneven_sharding_perf_multiplier,
            )
            for shard, perf in zip(option.shards, perfs):
                shard.perf = perf

    def _sharder_argument(self, option: ShardingOption) -> dict[str, Any]:
        if _SHARDER_DATA:
            return {"sharder_data": self._sharder_data_map[option.module_type_key]}
        return {"sharder": self._sharder_map[sharder_name(type(option.module[1]))]}


_SAME = object()  # marks a field holding the very object the option's first context holds


ENUMERATORS = ("torchrec", "embnb")  # torchrec's EmbeddingEnumerator, DistinctShardEnumerator


def make_enumerator(
    enumerator: str,
    topology: Topology,
    batch_size: int,
    constraints: dict[str, ParameterConstraints] | None = None,
) -> EmbeddingEnumerator:
    """The enumerator named `enumerator` (one of ENUMERATORS) with torchrec's default estimators."""
    check_choice("enumerator", enumerator, ENUMERATORS)
    kind = EmbeddingEnumerator if enumerator == "torchrec" else DistinctShardEnumerator
    return kind(topology=topology, batch_size=batch_size, constraints=constraints)


def _context_keys(contexts: list[ShardPerfContext]) -> list[tuple]:
    """A key per context: equal keys mean contexts with the same input in every field.

    A field holding the same object as the first context's (most of them: the
    option's lists, the topology's bandwidths) is the same input, whatever it is.
    Other fields compare by value in a form where equal means the same input:
    scalars with their type (1, 1.0 and True stay apart), floats by their bits
    (0.0 and -0.0 stay apart), lists by their items, and any other object by
    its identity."""
    if not contexts:
        return []
    first = vars(contexts[0])
    return [
        (
            tuple(fields),
            tuple(
                _SAME if value is first.get(name, _SAME) else _frozen(value) for name, value in fields.items()
            ),
        )
        for fields in map(vars, contexts)
    ]


def _frozen(value: Any) -> Any:
    kind = type(value)
    if kind is float:
        return (float, value.hex())
    if kind in (int, str, bool) or value is None:
        return (kind, value)
    if kind in (list, tuple):
        return (kind, *map(_frozen, value))
    return (object, id(value))
