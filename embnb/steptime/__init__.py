"""Measured, not estimated: each rank's step with real kernels, rank by rank.

A W-rank step cannot run concurrently at W = 8 to 64 on one machine, so each rank's own work runs
one rank after another on this device (a CPU core or the one GPU): its shards as FBGEMM TBEs built
as torchrec's kernels build them, fed exactly the ids torchrec's input distribution would deliver
to it, and the dense part on its samples; forward and backward with the fused optimizer, warmed up
and repeated. Beside the times, the bytes of every collective per rank, counted exactly, and a
communication time computed from them with torchrec's own bandwidths (labelled computed). Every
sharding type of torchrec's pooled EmbeddingBagCollection is replayed; tests/concurrent_ranks.py
runs the same step in a real gloo job, and the tests check that each rank runs the same kernels on
the same ids, with the same collective bytes.

    batch = make_batch(model.tables, model.constraints, world_size=8, local_batch_size=256)
    times = measure_plan(plan, model.tables, batch, threads=1)
    world = measure_world({"dp": plan, "greedy": other}, model.tables, batch, rounds=5, reference="dp")
    times.critical_rank(), times.critical_path_s(), times.comms[0].computed_seconds(topology)
    times = measure_routing(batch_from_keys(keys_per_rank, bag_size=20), "hash_roundrobin", rows, dims)
"""

from embnb.steptime.batch import GlobalBatch, batch_from_keys, make_batch
from embnb.steptime.comms import LINK_MODEL, Collective, RankComms
from embnb.steptime.measure import PHASES, RankTime, StepTimes, Timing
from embnb.steptime.step import measure_plan, measure_routing
from embnb.steptime.world import CLOCKS, PlanTimes, WorldTimes, kernel_device, measure_world

__all__ = [
    "GlobalBatch",
    "make_batch",
    "batch_from_keys",
    "measure_plan",
    "measure_world",
    "WorldTimes",
    "PlanTimes",
    "kernel_device",
    "CLOCKS",
    "measure_routing",
    "StepTimes",
    "RankTime",
    "Timing",
    "PHASES",
    "Collective",
    "RankComms",
    "LINK_MODEL",
]
