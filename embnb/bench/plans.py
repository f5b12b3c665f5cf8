"""Plans as plain data: what `python -m embnb.bench steptime --write-plans` writes and `--plans`
reads (benchmarks/plans/), so that plans made on one machine are measured on another with no planner
run there."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torchrec.distributed.planner.types import Perf, Shard, ShardingOption, Storage
from torchrec.modules.embedding_modules import EmbeddingBagCollection

from embnb.lab.planner.candidates import CandidatePlan
from embnb.lab.planner.models import Model

__all__ = ["candidates_to_json", "candidates_from_json"]

# What a plan file keeps of a ShardingOption (beside its module path and shards), and what it refuses:
# the options of `candidate_plans` leave the latter None
KEPT = ("name", "sharding_type", "partition_by", "compute_kernel", "input_lengths", "batch_size")
NOT_KEPT = ("cache_params", "enforce_hbm", "stochastic_rounding", "bounds_check_mode", "output_dtype")


def _option_record(option: ShardingOption) -> dict[str, Any]:
    refused = [name for name in (*NOT_KEPT, "key_value_params") if getattr(option, name, None) is not None]
    if refused:
        raise ValueError(
            f"the option of table {option.name!r} sets {refused}, which a plan file does not keep"
        )
    shards = [dataclasses.asdict(shard) for shard in option.shards]  # size, offset, storage, perf, rank
    return {name: getattr(option, name) for name in KEPT} | {"path": option.path, "shards": shards}


def candidates_to_json(candidates: Mapping[str, CandidatePlan]) -> list[dict[str, Any]]:
    """Plans as plain data (JSON), one record per plan: its name, torchrec's rating (ms), note,
    planning seconds and its placed ShardingOptions (None: no plan), each with `KEPT`, its module
    path and its shards (size, offset, rank, torchrec's Perf and Storage in its units: ms, bytes):
    what `candidates_from_json` rebuilds the plan from, its estimates included. Raises ValueError on
    an option that sets one of `NOT_KEPT` or key-value parameters."""
    return [
        {
            "name": c.name,
            "rating": c.rating,
            "note": c.note,
            "planning_s": c.planning_s,
            "options": None if c.options is None else [_option_record(o) for o in c.options],
        }
        for c in candidates.values()
    ]


def _shard(record: dict[str, Any]) -> Shard:
    return Shard(**record | {"storage": Storage(**record["storage"]), "perf": Perf(**record["perf"])})


def candidates_from_json(records: Sequence[dict[str, Any]], model: Model) -> dict[str, CandidatePlan]:
    """`candidates_to_json`'s records as CandidatePlans of `model`'s tables (their ShardingOptions
    over an EmbeddingBagCollection on the meta device), no planner run. Raises ValueError on a
    table the model does not have."""
    module = EmbeddingBagCollection(tables=list(model.tables), device=torch.device("meta"))
    plans = {}
    for record in records:
        options = None
        if record["options"] is not None:
            unknown = sorted({o["name"] for o in record["options"]} - set(module.embedding_bags))
            if unknown:
                raise ValueError(
                    f"plan {record['name']!r} shards tables {unknown[:5]} the model does not have"
                )
            options = [
                ShardingOption(
                    tensor=module.embedding_bags[o["name"]].weight,
                    module=(o["path"], module),
                    shards=[_shard(s) for s in o["shards"]],
                    is_pooled=True,
                    **{name: o[name] for name in KEPT},
                )
                for o in record["options"]
            ]
        plans[record["name"]] = CandidatePlan(
            record["name"], options, record["rating"], record["note"], record["planning_s"]
        )
    return plans
