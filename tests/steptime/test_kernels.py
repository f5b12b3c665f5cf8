"""The replay's fused TBE starts from initialized weights, as torchrec's kernel does after its
`init_parameters` (uniform within +-sqrt(1 / rows)): FBGEMM alone leaves them at zero, pages the OS
maps on first write, so a step would time page faults no job pays. The oracle is the uniform
distribution's own moments, per shard."""

from __future__ import annotations

import math

import torch

from embnb.steptime.kernels import lookup_module
from embnb.steptime.work import LookupGroup, Shard


def test_each_shard_of_a_fused_tbe_is_uniform_within_torchrecs_bound():
    shards = [
        Shard("big", "table_wise", "fused", 0, 0, 40_000, 0, 16, ("f0",)),
        Shard("small", "table_wise", "fused", 0, 0, 400, 0, 64, ("f1",)),
    ]
    group = LookupGroup(
        "table_wise",
        "fused",
        shards,
        [0, 1],
        1,
        torch.ones(2, dtype=torch.int64),
        torch.zeros(2, dtype=torch.int64),
    )
    tbe = lookup_module(group)
    for shard, weights in zip(shards, tbe.split_embedding_weights()):
        bound = 1 / math.sqrt(shard.rows)
        values = weights.double().flatten()
        assert values.abs().max() <= bound
        # U(-b, b): mean 0, variance b^2 / 3, and no value exactly 0 left behind
        assert abs(values.mean()) < 0.02 * bound
        assert abs(values.var() / (bound**2 / 3) - 1) < 0.03
        assert (values == 0).sum() == 0
