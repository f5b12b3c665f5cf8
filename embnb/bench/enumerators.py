"""torchrec's EmbeddingEnumerator against embnb's DistinctShardEnumerator on models beyond the planner
bench's: `python -m embnb.bench enumerators`.

Cases (`CASES`): `make_model`'s tables on GPU and CPU topologies, and `make_mixed_model`'s (weighted
tables that several features read beside sequence tables; UVM caches, with statistics, on GPUs).
Each enumerator enumerates each case --repeats times in one process (median and range); the first
enumerations are checked to hold the same options (`same_options`: floats to the bit). Also timed:
embnb's estimate step, torchrec's own estimators run once per distinct shard size
(`embnb_estimators_s`), the most an enumerator that runs torchrec's estimators could gain.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
from torch import nn
from torchrec.distributed.embedding import EmbeddingCollectionSharder
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.planner.enumerators import EmbeddingEnumerator
from torchrec.distributed.planner.shard_estimators import EmbeddingOffloadStats
from torchrec.distributed.planner.types import ParameterConstraints
from torchrec.distributed.types import CacheParams, ModuleSharder
from torchrec.modules.embedding_configs import EmbeddingBagConfig, EmbeddingConfig
from torchrec.modules.embedding_modules import EmbeddingBagCollection, EmbeddingCollection

from embnb import planner
from embnb._checks import check_int
from embnb.bench.planner import bounded, write_rows
from embnb.bench.results import add_out_argument, quiet_torchrec_logs
from embnb.lab.planner.models import fused_table_gb, make_model
from embnb.lab.planner.planning import clocked
from embnb.planner.enumerator import DistinctShardEnumerator, same_options
from embnb.timing import Stopwatch

BATCH_SIZE = 512
SHOWN = ["model", "num_tables", "device", "world_size", "local_world_size", "num_options", "distinct_shards"]
SHOWN += ["torchrec_s", "embnb_s", "embnb_estimators_s", "same_options"]  # printed per case


@dataclass(frozen=True)
class MixedModel:
    """A module (on meta) beyond make_model's single EmbeddingBagCollection, with
    the sharders that take its collections and its ParameterConstraints."""

    module: nn.Module
    sharders: list[ModuleSharder[nn.Module]]
    constraints: dict[str, ParameterConstraints]
    tables: list[EmbeddingBagConfig | EmbeddingConfig]  # pooled, then sequence


def make_mixed_model(num_tables: int, seed: int = 0, uvm_caching: bool = True) -> MixedModel:
    """`num_tables` pooled tables in a weighted EmbeddingBagCollection, each read
    by 1 to 4 features with a pooling factor each (1 to 50), beside a quarter as
    many sequence tables in an EmbeddingCollection. With `uvm_caching` (GPU
    topologies: CPUs have no UVM), every fifth pooled table has a UVM cache
    with statistics and every third sequence table is constrained to fused or
    UVM-caching kernels with a cache load factor."""
    check_int("num_tables", num_tables, low=1)
    rng = np.random.default_rng(seed)

    def rows() -> int:
        return int(10 ** rng.uniform(3, 7))

    pooled, constraints = [], {}
    stats = EmbeddingOffloadStats(
        cacheability=0.4, expected_lookups=20_000, mrc_hist_counts=torch.tensor([9.0, 4, 2, 1]), height=8000
    )
    for i in range(num_tables):
        features, name = int(rng.integers(1, 5)), f"shared_{i}"
        num_rows, dim = (
            rows(),
            int(rng.choice([16, 32, 64, 128, 256])),
        )  # drawn in this order: the same models
        feature_names = [f"{name}_f{j}" for j in range(features)]
        pooled.append(EmbeddingBagConfig(num_rows, dim, name, feature_names=feature_names))
        constraints[name] = ParameterConstraints(
            pooling_factors=[float(rng.choice([1, 2, 5, 10, 20, 50])) for _ in range(features)],
            cache_params=CacheParams(load_factor=0.2, stats=stats) if uvm_caching and i % 5 == 0 else None,
        )
    sequence = []
    for i in range(max(1, num_tables // 4)):
        name = f"sequence_{i}"
        sequence.append(EmbeddingConfig(rows(), 64, name, feature_names=[f"{name}_f"]))
        if uvm_caching and i % 3 == 0:
            constraints[name] = ParameterConstraints(
                pooling_factors=[float(rng.choice([5, 20, 50]))],
                cache_params=CacheParams(load_factor=0.3),
                compute_kernels=["fused_uvm_caching", "fused"],
            )
    meta = torch.device("meta")
    module = nn.ModuleDict(
        {
            "pooled": EmbeddingBagCollection(tables=pooled, is_weighted=True, device=meta),
            "sequence": EmbeddingCollection(tables=sequence, device=meta),
        }
    )
    sharders = [EmbeddingBagCollectionSharder(), EmbeddingCollectionSharder()]
    return MixedModel(module, sharders, constraints, pooled + sequence)


@dataclass(frozen=True)
class Case:
    model: str  # "bench" (make_model's tables) or "mixed" (make_mixed_model)
    device: str
    world_size: int
    local_world_size: int | None = None  # None: one host


CASES = (
    Case("bench", "cuda", 8),
    Case("bench", "cuda", 64, 8),
    Case("bench", "cpu", 8),
    Case("bench", "cpu", 32, 8),
    Case("mixed", "cuda", 8),
    Case("mixed", "cuda", 64, 8),
    Case("mixed", "cpu", 16, 4),
)


def _model(case: Case, num_tables: int) -> MixedModel:
    if case.model == "mixed":
        return make_mixed_model(num_tables, seed=0, uvm_caching=case.device == "cuda")
    model = make_model(num_tables, seed=0)
    module = EmbeddingBagCollection(tables=model.tables, device=torch.device("meta"))
    return MixedModel(module, [EmbeddingBagCollectionSharder()], model.constraints, model.tables)


def bench_case(case: Case, num_tables: int, repeats: int) -> dict:
    model = _model(case, num_tables)
    per_device_gb = fused_table_gb(model.tables) / case.world_size  # the rows spread evenly
    caps = {"hbm_cap_gb": per_device_gb * 0.5} if case.device == "cuda" else {"ddr_cap_gb": per_device_gb * 2}
    topology = planner.make_topology(
        case.world_size, case.device, local_world_size=case.local_world_size, **caps
    )
    runs: dict[str, list[float]] = {"torchrec": [], "embnb": []}
    estimators_s, first = [], {}
    for name, kind in (("torchrec", EmbeddingEnumerator), ("embnb", DistinctShardEnumerator)):
        for _ in range(repeats):
            gc.collect()  # each run starts from a heap without the last run's garbage
            enumerator = kind(topology, BATCH_SIZE, model.constraints)
            # embnb's estimate step (torchrec's estimators on its distinct shards), clocked on the
            # enumerator: a clock on an estimator would send embnb's copy of torchrec's perf
            # estimator (`estimates._quick_lookups`) down torchrec's slow path
            steps = ("_estimate",) if name == "embnb" else ()
            with clocked(enumerator, *steps) as clock, Stopwatch() as watch:
                options = enumerator.enumerate(model.module, model.sharders)
            runs[name].append(watch.wall_s)
            if steps:
                estimators_s.append(clock.total_s)
            first.setdefault(name, options)
            del enumerator, options
    options = first["torchrec"]
    return {
        "model": case.model,
        "num_tables": len(model.tables),
        "device": case.device,
        "world_size": case.world_size,
        "local_world_size": topology.local_world_size,
        "num_options": len(options),
        "num_shards": sum(len(o.shards) for o in options),
        "distinct_shards": sum(len({tuple(s.size) for s in o.shards}) for o in options),
        "uvm_caching_options": sum(o.compute_kernel == "fused_uvm_caching" for o in options),
        "cache_statistics_options": sum(bool(o.cache_params and o.cache_params.stats) for o in options),
        "multi_feature_options": sum(len(o.input_lengths) > 1 for o in options),
        "same_options": same_options(options, first["embnb"]),
        "torchrec_s": statistics.median(runs["torchrec"]),
        "torchrec_s_runs": runs["torchrec"],
        "embnb_s": statistics.median(runs["embnb"]),
        "embnb_s_runs": runs["embnb"],
        "embnb_estimators_s": statistics.median(estimators_s),
        "embnb_estimators_s_runs": estimators_s,
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m embnb.bench enumerators", description=__doc__.split("\n")[0]
    )
    add, count = parser.add_argument, bounded(int, 1)
    add("--tables", type=count, default=200, help="tables per model (mixed: and a quarter more)")
    add("--repeats", type=count, default=3, help="enumerations per enumerator and case")
    add_out_argument(parser)
    opts = parser.parse_args(argv)
    quiet_torchrec_logs()
    start, rows = time.perf_counter(), []
    for case in CASES:
        rows.append(bench_case(case, opts.tables, opts.repeats))
        print(pd.DataFrame([rows[-1]])[SHOWN].to_string(index=False), flush=True)
    return write_rows("enumerators", opts, rows, start, batch_size=BATCH_SIZE)
