"""RoutedEmbeddingBagCollectionSharder over real gloo ranks, against the unsharded module.

One launch per world size (W = 2 and 3) runs several cases: each routing on a
sum-pooled and a mean-pooled table, row counts divisible by W and not (and
one smaller than W). The parent checks, against an unsharded
EmbeddingBagCollection and an owner rule written here in plain ints:

- forward outputs on every rank equal the unsharded module's on that rank's batch;
- the tables after one fused SGD step equal the unsharded step over all batches;
- every id's row sits on the rank its routing names, at its local row (the
  check catches a local row index off by one);
- a state dict saved under another routing does not load.
"""

from __future__ import annotations

import pytest
import torch
from sharder_ranks import LR, make_batch, make_ebc, mismatch_case, output_grad, owner_local, parity_case

from embnb.dist import launch_each

SEED = 5
CASES = {  # world size -> [(rows per table, routings)]; "a" is sum-pooled, "b" mean-pooled
    2: [
        ({"a": 7, "b": 6}, {"a": "continuous", "b": "roundrobin"}),
        ({"a": 9, "b": 8}, {"a": "roundrobin", "b": "feistel_roundrobin"}),
        ({"a": 6, "b": 11}, {"a": "feistel_roundrobin", "b": "continuous"}),
    ],
    3: [
        ({"a": 10, "b": 9}, {"a": "continuous", "b": "roundrobin"}),
        ({"a": 11, "b": 2}, {"a": "roundrobin", "b": "feistel_roundrobin"}),
        ({"a": 9, "b": 7}, {"a": "feistel_roundrobin", "b": "continuous"}),
    ],
}
MISMATCHES = [  # (saved routings, loaded routings, an error expected)
    ({"a": "roundrobin"}, {"a": "feistel_roundrobin"}, True),
    ({"a": "feistel_roundrobin"}, {"a": "feistel_roundrobin"}, False),
    (None, {"a": "roundrobin"}, True),  # None: an unsharded module's state dict, read as continuous
    (None, {}, False),
]


def misplaced(local_shards: list[torch.Tensor], rows: torch.Tensor, routing: str, world_size: int, shift=0):
    """Ids whose row is not at (owner, local + shift) in the ranks' local shards."""
    bad = []
    for i in range(rows.shape[0]):
        rank, local = owner_local(routing, i, rows.shape[0], world_size)
        shard = local_shards[rank]
        if local + shift >= shard.shape[0] or not torch.equal(shard[local + shift], rows[i]):
            bad.append(i)
    return bad


def unsharded_step(rows, world_size):
    """Outputs per rank and the tables after one SGD step on the mean of the ranks' losses
    (torchrec divides the gradients its collectives carry by W, as DDP averages)."""
    ebc = make_ebc(rows, SEED)
    outs, loss = [], 0
    for rank in range(world_size):
        out = ebc(make_batch(rows, rank, SEED)).values()
        outs.append(out.detach())
        loss = loss + (out * output_grad(rank, SEED, rows)).sum()
    (loss / world_size).backward()
    weights = {n: ebc.embedding_bags[n].weight for n in rows}
    after = {n: (w - LR * w.grad).detach() for n, w in weights.items()}
    return outs, after


@pytest.fixture(scope="module", params=sorted(CASES))
def launched(request):
    world_size = request.param
    calls = [(parity_case, (rows, routings, SEED)) for rows, routings in CASES[world_size]]
    calls += [(mismatch_case, ({"a": 5, "b": 6}, s, t, SEED)) for s, t, _ in MISMATCHES]
    results = launch_each(calls, world_size, device="cpu", timeout_s=240)
    return world_size, results[: len(CASES[world_size])], results[len(CASES[world_size]) :]


def test_outputs_and_tables_after_a_step_equal_the_unsharded_module(launched):
    world_size, results, _ = launched
    for (rows, routings), per_rank in zip(CASES[world_size], results):
        outs, after = unsharded_step(rows, world_size)
        for rank, result in enumerate(per_rank):
            assert result["routings"] == routings
            torch.testing.assert_close(result["out"], outs[rank], rtol=1e-5, atol=1e-5)
            for name in rows:
                torch.testing.assert_close(result["after"][name], after[name], rtol=1e-5, atol=1e-5)


def test_every_row_sits_on_the_rank_its_routing_names(launched):
    world_size, results, _ = launched
    for (rows, routings), per_rank in zip(CASES[world_size], results):
        for name, n in rows.items():
            shards = [result["local"][name] for result in per_rank]
            table = per_rank[0]["after"][name]
            block = -(-n // world_size)
            padded = routings[name] != "continuous"
            assert per_rank[0]["storage_rows"][name] == (block * world_size if padded else n)
            assert misplaced(shards, table, routings[name], world_size) == [], (name, routings[name])
            # The same check with every local row index off by one finds (nearly) every id misplaced.
            assert len(misplaced(shards, table, routings[name], world_size, shift=1)) >= n - 1


def test_a_state_dict_saved_under_another_routing_does_not_load(launched):
    _, _, mismatches = launched
    for (saved, loaded, fails), per_rank in zip(MISMATCHES, mismatches):
        for error in per_rank:
            if not fails:
                assert error is None
                continue
            assert error.startswith("RoutingMismatch")
            assert repr((saved or {"a": "continuous"})["a"]) in error and repr(loaded["a"]) in error
