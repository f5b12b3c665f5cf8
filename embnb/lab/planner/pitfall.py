"""Why the least summed perf is not the plan to take: small instances, each
rated by brute force in torchrec's partitioner and perf model.


A tiny instance is three tables on two GPUs with four options each
(table-wise or row-wise, `fused` or `fused_uvm_caching`): 64 plans.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pandas as pd
from torchrec.distributed.planner.types import ParameterConstraints, Topology
from torchrec.modules.embedding_configs import EmbeddingBagConfig

from embnb._checks import check_int
from embnb.lab.planner.brute_force import rate_every_plan
from embnb.lab.planner.explain import memory_ratio, plan_extremes
from embnb.lab.planner.models import Enumerated, enumerate_options, hosts_of
from embnb.planner.topology import make_topology

__all__ = ["TINY_LIMITS", "SMALL_LIMITS", "tiny_instance", "summed_vs_rated", "share_by_tightness"]

TINY_LIMITS = {
    "sharding_types": ["table_wise", "row_wise"],
    "compute_kernels": ["fused", "fused_uvm_caching"],
}
# The knapsack worked by hand: two options per table, one memory each (HBM).
SMALL_LIMITS = {"sharding_types": ["table_wise"], "compute_kernels": ["fused", "fused_uvm_caching"]}
_ROWS, _DIMS, _POOLING = (250_000, 500_000, 1_000_000, 2_000_000), (32, 64, 128), (1.0, 2.0, 5.0, 10.0, 20.0)
_HBM_GB = (0.25, 0.5, 0.75, 1.0)


def tiny_instance(
    spec: Sequence[tuple[str, int, int, float]],
    hbm_gb: float,
    world_size: int = 2,
    batch_size: int = 512,
    ddr_gb: float = 128.0,
    limits: dict[str, list[str]] | None = None,
) -> tuple[Enumerated, Topology]:
    """Tables `spec` (name, rows, dim, pooling factor) on `world_size` GPUs
    with `hbm_gb` GiB of HBM each, their options enumerated by torchrec
    under `limits` (sharding types and compute kernels; default `TINY_LIMITS`)."""
    limits = TINY_LIMITS if limits is None else limits
    tables = [
        EmbeddingBagConfig(name=name, feature_names=[name], num_embeddings=rows, embedding_dim=dim)
        for name, rows, dim, _ in spec
    ]
    constraints = {
        name: ParameterConstraints(pooling_factors=[pooling], **limits) for name, _, _, pooling in spec
    }
    topology = make_topology(world_size, "cuda", hbm_cap_gb=hbm_gb, ddr_cap_gb=ddr_gb)
    return enumerate_options(tables, topology, batch_size, constraints), topology


def summed_vs_rated(
    num_instances: int, seed: int = 0, batch_size: int = 512, storage_reservation_percentage: float = 0.15
) -> pd.DataFrame:
    """Random tiny instances (rows, dims, pooling factors and HBM drawn from
    a few round values), one row each: its devices (`world_size`) and
    `hosts`, the rating of the least summed perf
    plan the partitioner can place over the best rating (1: it is the best),
    whether the least summed perf of all cannot be placed, and how tight
    memory is: `memory_ratio`, the devices' HBM after the reservation over
    the HBM of the least summed perf plan (below 1 memory binds in total).
    Instances where no plan can be placed are left out."""
    check_int("num_instances", num_instances, low=1)
    rng = np.random.default_rng(seed)
    rows = []
    for instance in range(num_instances):
        spec = [
            (name, int(rng.choice(_ROWS)), int(rng.choice(_DIMS)), float(rng.choice(_POOLING)))
            for name in ("user_id", "item_id", "ad_id")
        ]
        hbm_gb = float(rng.choice(_HBM_GB))
        enumerated, topology = tiny_instance(spec, hbm_gb, batch_size=batch_size)
        every_plan = rate_every_plan(enumerated, topology, batch_size, storage_reservation_percentage)
        if every_plan.perf_rating.isna().all():
            continue
        extremes = plan_extremes(every_plan)
        rows.append(
            {
                "instance": instance,
                "world_size": topology.world_size,
                "hosts": hosts_of(topology),
                "hbm_gb": hbm_gb,
                "spec": spec,
                "least_placed_sum_over_best": extremes.least_placed_sum.perf_rating
                / extremes.best_rated.perf_rating,
                "least_sum_unplaceable": bool(math.isnan(extremes.least_sum.perf_rating)),
                "memory_ratio": memory_ratio(
                    enumerated, topology, batch_size, storage_reservation_percentage
                ),
            }
        )
    return pd.DataFrame(rows)


TIGHTNESS_EDGES = (0.5, 1.0, 2.0)  # memory_ratio bins of share_by_tightness


def share_by_tightness(pitfall: pd.DataFrame, edges: Sequence[float] = TIGHTNESS_EDGES) -> pd.DataFrame:
    """`summed_vs_rated`'s instances grouped by `memory_ratio` (bins cut at
    `edges`), one row per bin: instances, those where the least summed
    placeable plan rates worse than the best (beyond rounding), and their share."""
    if pitfall.empty:
        raise ValueError("pitfall is empty: no instance had a plan")
    bounds = [0.0, *edges, math.inf]
    labels = [
        f"< {hi:g}" if lo == 0 else (f">= {lo:g}" if hi == math.inf else f"{lo:g}-{hi:g}")
        for lo, hi in zip(bounds, bounds[1:])
    ]
    groups = pd.cut(pitfall.memory_ratio, bounds, right=False, labels=labels)
    worse = pitfall.least_placed_sum_over_best > 1 + 1e-9
    table = pd.DataFrame(
        {
            "instances": worse.groupby(groups, observed=False).size(),
            "worse": worse.groupby(groups, observed=False).sum(),
        }
    )
    table["share"] = table.worse / table.instances.where(table.instances > 0)
    return table.rename_axis("memory_ratio")
