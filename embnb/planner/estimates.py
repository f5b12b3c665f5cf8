"""torchrec's default estimators run once per distinct shard of an option.

In torchrec's default estimators a shard's estimate follows from its option
and its own size alone (the perf estimator's `ShardPerfContext` is the
option's fields and the shard's [rows, columns]; the storage estimator maps
each size to a Storage), and an option's shards mostly look alike (a
row-wise option over 64 devices has at most two sizes). So
`estimate_distinct` hands those estimators each option narrowed to the first
shard of each size, and every shard of that size gets the result: the same
Perf and Storage objects, which torchrec treats as values (docs/planner.md,
"The enumerator"). That premise is torchrec's code, not a contract: the tests
compare the result with torchrec's own estimate field by field, floats to the
bit, on every supported torchrec version. Estimators it does not cover run as
torchrec runs them, on every shard.
"""

from __future__ import annotations

import copy
import types
from dataclasses import dataclass
from typing import Any

import numpy as np
from torchrec.distributed.planner.estimator.estimator import EmbeddingPerfEstimator
from torchrec.distributed.planner.estimator.types import HardwarePerfConfig
from torchrec.distributed.planner.shard_estimators import EmbeddingStorageEstimator
from torchrec.distributed.planner.types import Shard, ShardEstimator, ShardingOption

from embnb._torchrec_private import set_perf_config
from embnb.planner.layout import deferred

__all__ = ["Distinct", "covers", "estimate_distinct", "clone"]


@dataclass(frozen=True)
class Distinct:
    """An option's distinct shards: `shards[slot_of[i]]` has the size (and the estimates) of its shard i."""

    slot_of: list[int] | np.ndarray
    shards: list[Shard]


def covers(estimator: ShardEstimator) -> bool:
    """Whether `estimate_distinct` gives `estimator`'s results: torchrec's own
    perf estimator (with a config that leaves post_process_perfs as is) and
    storage estimator."""
    if type(estimator) is EmbeddingStorageEstimator:
        return True
    return (
        type(estimator) is EmbeddingPerfEstimator
        and type(estimator.config).post_process_perfs is HardwarePerfConfig.post_process_perfs
    )


def estimate_distinct(
    estimators: list[ShardEstimator], options: list[ShardingOption], sharders: Any
) -> list[Distinct]:
    """Run `estimators` (each one `covers`) as torchrec's populate_estimates
    does, on one shard per distinct size of each option; every shard gets
    its size's perf and storage (the same objects). `sharders`: what torchrec's
    estimators take (its SharderDataMap on 1.7+, the sharders by name on 1.6).
    Returns each option's distinct shards. A `LayoutOption` whose shards are
    not made yet keeps them so: it takes the estimates per distinct size."""
    # None: a LayoutOption's shards, to be made from its layout and these estimates
    every = [None if deferred(option) else option.shards for option in options]
    distinct = [
        _distinct(shards) if shards is not None else Distinct(o.layout.slot_of, o.layout.distinct_shards())
        for o, shards in zip(options, every)
    ]
    try:
        for option, its in zip(options, distinct):
            option.shards = its.shards  # the estimators see the first shard of each size
        for estimator in estimators:
            if type(estimator) is EmbeddingPerfEstimator:
                estimator = _quick_lookups(estimator)
            estimator.estimate(options, sharders)
    finally:
        for option, shards, its in zip(options, every, distinct):
            if shards is None:
                estimates = [(shard.perf, shard.storage) for shard in its.shards]
                option.defer(option.layout, its.slot_of, estimates)
            else:
                option.shards = shards
    for shards, its in zip(every, distinct):
        if shards is not None and len(its.shards) < len(shards):
            for shard, slot in zip(shards, its.slot_of):
                estimated = its.shards[slot]
                shard.perf, shard.storage = estimated.perf, estimated.storage
    return distinct


def _distinct(shards: list[Shard]) -> Distinct:
    """The first shard of each size among `shards`, and each shard's index among them."""
    slot_by_size: dict[tuple, int] = {}
    slot_of = [slot_by_size.setdefault(tuple(shard.size), len(slot_by_size)) for shard in shards]
    if len(slot_by_size) == len(shards):
        return Distinct(slot_of, shards)
    return Distinct(slot_of, [shards[slot_of.index(slot)] for slot in range(len(slot_by_size))])


def clone(value: Any) -> Any:
    """A shallow copy of a Perf or Storage (plain dataclasses), without copy.copy's overhead."""
    if value is None:
        return None
    copied = object.__new__(type(value))
    copied.__dict__.update(value.__dict__)
    return copied


def _quick_lookups(estimator: EmbeddingPerfEstimator) -> EmbeddingPerfEstimator:
    """A copy of torchrec's perf estimator (the one passed is left as it is) whose config, an
    instance of a subclass of its class with the same attributes, lists in `__dir__` only the
    public names that can hold an annotated method. torchrec finds a config's custom formulas by
    scanning `dir(config)` for an annotation attribute, several times per shard (most of its perf
    estimate); a name whose value is falsy, not callable, or a plain function or method with no
    attributes of its own can never match, so leaving it out changes no lookup's result."""
    config = estimator.config
    if not hasattr(config, "__dict__") or hasattr(type(config), "__slots__"):
        return estimator  # not a plain instance: used as it is
    names = sorted(
        name for name in dir(config) if not name.startswith("_") and _may_be_annotated(config, name)
    )
    kind = type(config)
    quick_config = object.__new__(type(kind.__name__, (kind,), {"__dir__": lambda _: names}))
    quick_config.__dict__.update(config.__dict__)
    quick = copy.copy(estimator)
    set_perf_config(quick, quick_config)  # on the copy only
    return quick


def _may_be_annotated(config: Any, name: str) -> bool:
    value = getattr(config, name, None)
    if not value or not callable(value):
        return False
    function = getattr(value, "__func__", value)
    return not (isinstance(function, types.FunctionType) and not function.__dict__)
