"""Plan quality against brute force: each proposer's estimated rating over the best that brute
force finds, on random small instances."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from torchrec.distributed.planner.types import Topology
from tqdm.auto import tqdm

from embnb._checks import check_int
from embnb.lab.planner.brute_force import brute_force_rating
from embnb.lab.planner.comparison import Planning, compare_proposers, default_proposers
from embnb.lab.planner.models import Model, enumerate_options, fused_table_gb, hosts_of, make_model
from embnb.planner.topology import make_topology

__all__ = ["random_instance", "quality_study", "quality_summary"]


def random_instance(seed: int, num_tables: int = 3) -> tuple[Model, Topology]:
    """A small model and 2 to 4 GPUs whose HBM binds: per device, 15% to 120% of the fp32 rows of
    all tables spread evenly."""
    rng = np.random.default_rng(seed)
    world_size = int(rng.integers(2, 5))
    model = make_model(num_tables, seed)
    budget = fused_table_gb(model.tables) / world_size * rng.uniform(0.15, 1.2)
    return model, make_topology(world_size, "cuda", hbm_cap_gb=budget)


def quality_study(
    num_instances: int,
    seed: int = 0,
    num_tables: int = 3,
    batch_size: int = 512,
    progress: bool = False,
    storage_reservation_percentage: float = 0.15,
) -> pd.DataFrame:
    """Each of `default_proposers` alone (`compare_proposers`), its rating over the brute-force best
    on random small instances: one row per instance and proposer with the instance's `world_size`
    and `hosts` (ratio inf: no plan where brute force found one; NaN: GridSearch skipped, as
    torchrec skips it past MAX_PROPOSALS combinations; instances without any plan left out), all
    under one storage reservation."""
    check_int("num_instances", num_instances, low=1)
    proposers = {k: v for k, v in default_proposers().items() if k != "torchrec default"}
    frames = []
    for instance in tqdm(range(seed, seed + num_instances), desc="instances", disable=not progress):
        model, topology = random_instance(instance, num_tables)
        enumerated = enumerate_options(model.tables, topology, batch_size, model.constraints)
        best = brute_force_rating(enumerated, topology, batch_size, storage_reservation_percentage)
        if not math.isfinite(best):
            continue
        planning = Planning(batch_size, model.constraints, storage_reservation_percentage)
        table = compare_proposers(enumerated, topology, planning, proposers)
        rating = table.perf_rating.where(table.feasible, math.inf)
        rating = rating.mask(table.note.str.startswith("skipped"))
        instance_of = {"instance": instance, "world_size": topology.world_size, "hosts": hosts_of(topology)}
        frame = pd.DataFrame({"perf_rating": rating, "brute_force": best, "ratio": rating / best})
        frames.append(frame.reset_index().assign(**instance_of))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def quality_summary(study: pd.DataFrame, tolerance: float = 1.02) -> pd.DataFrame:
    """Per proposer of a `quality_study`: the worst (`max`) and `median` ratio to brute force, and
    the share of instances within `tolerance`."""
    summary = study.groupby("proposer", sort=False).ratio.agg(["max", "median"])
    within = (study.ratio <= tolerance).groupby(study.proposer, sort=False).mean()
    return summary.assign(**{f"within {round((tolerance - 1) * 100):g}%": within})
