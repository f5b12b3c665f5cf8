"""Edge batches a real loader produces, under the routed sharders, over real gloo ranks
(tests/edge_ranks.py). One launch per world size (W = 2, 3) runs every case of that W: each routing,
an EmbeddingCollection's forward and an EmbeddingBagCollection's forward and fused SGD step. Checked
against the unsharded torchrec module on the same per-rank batches, or the expected error text:

- a rank with fewer samples, a rank with no samples, a rank with samples but no ids, a feature with
  no ids on any rank: every rank's output, and the tables after the step, equal the unsharded
  module's (a rank with no samples: an output of 0 samples; torchrec fails on that batch, unsharded
  or sharded);
- an id outside its table (past the end on one rank; negative on another): every rank raises the
  same ValueError naming the feature, table, routing, id and rank, then trains the next batch as the
  unsharded module does (the failed step changed nothing and left no collective behind);
- torchrec's own row-wise sharding on the same batches, for the record: an id past the end gets
  another id's row, silently; ranks of different batch sizes stop the EBC's backward on every rank.

A case that hangs fails by the launch's timeout.
"""

from __future__ import annotations

import pytest
import torch
from edge_ranks import BATCH, CASES, ORDINARY, ROWS, edge_batch, edge_case
from sharder_ranks import DIM, LR, flat_output, make_module, output_grad, table_weight

from embnb.dist import launch_each

SEED = 7
ROUTINGS = ("continuous", "roundrobin", "feistel_roundrobin")
KINDS = ("ec", "ebc")
ERRORS = {  # case -> (feature, table, rows, id, rank that holds it), W -> ...
    "id_past_end": lambda w: ("f_a", "a", 7, 7, w - 1, ""),
    "id_negative": lambda w: ("f_b", "b", 5, -1, 0, f"; ranks [0, {w - 1}] hold ids outside their tables"),
}
TORCHREC_CASES = [("ec", "id_past_end"), ("ebc", "fewer")]  # torchrec's own sharding, last in a launch


@pytest.fixture(scope="module")
def launched():
    """W -> {(kind, routing, case): per-rank results}."""
    out = {}
    for world_size in (2, 3):
        keys = [(kind, routing, case) for kind in KINDS for routing in ROUTINGS for case in CASES]
        keys += [(kind, "torchrec", case) for kind, case in TORCHREC_CASES]
        calls = [(edge_case, (kind, routing, case, SEED)) for kind, routing, case in keys]
        results = launch_each(calls, world_size, device="cpu", timeout_s=120)
        out[world_size] = dict(zip(keys, results))
    return out


def unsharded_step(kind: str, case: str, world_size: int):
    """Per rank, the unsharded module's output on its batch of `case` (no samples: 0 rows), and for
    an EBC the tables after one SGD step on the mean of the ranks' losses (torchrec divides the
    gradients its collectives carry by W)."""
    module = make_module(kind, ROWS, SEED)
    outs, loss = [], 0
    for rank in range(world_size):
        batch = edge_batch(case, rank, world_size, SEED)
        if batch.stride() == 0:  # torchrec's KeyedJaggedTensor.to_dict fails on it
            outs.append(torch.zeros(0, DIM * (len(ROWS) if kind == "ebc" else 1)))
            continue
        out = flat_output(kind, module(batch))
        outs.append(out.detach())
        loss = loss + (out * output_grad(out, rank, SEED)).sum()
    if kind == "ec":
        return outs, None
    (loss / world_size).backward()
    return outs, {n: (table_weight(module, n) - LR * table_weight(module, n).grad).detach() for n in ROWS}


def assert_step_equal(step: dict, outs, after, rank: int) -> None:
    torch.testing.assert_close(step["out"], outs[rank], rtol=1e-5, atol=1e-5)
    for name in after or {}:
        torch.testing.assert_close(step["after"][name], after[name], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("case", ["fewer", "empty_rank", "no_ids", "empty_feature"])
def test_each_rank_gets_the_unsharded_value(launched, case):
    for world_size, results in launched.items():
        for kind in KINDS:
            outs, after = unsharded_step(kind, case, world_size)
            for routing in ROUTINGS:
                for rank, result in enumerate(results[kind, routing, case]):
                    assert "step" in result, (world_size, kind, routing, result)
                    assert_step_equal(result["step"], outs, after, rank)


def test_the_edge_batches_are_what_they_say():
    for world_size in (2, 3):
        last = world_size - 1
        assert edge_batch("fewer", last, world_size, SEED).stride() == BATCH - last
        assert edge_batch("empty_rank", last, world_size, SEED).stride() == 0
        no_ids = edge_batch("no_ids", last, world_size, SEED)
        assert no_ids.stride() == BATCH and no_ids.values().numel() == 0
        for rank in range(world_size):
            assert edge_batch("empty_feature", rank, world_size, SEED)["f_b"].values().numel() == 0
            ordinary = edge_batch(ORDINARY, rank, world_size, SEED)
            assert all(int(ordinary[f"f_{t}"].values().max()) < n for t, n in ROWS.items())


@pytest.mark.parametrize("case", sorted(ERRORS))
def test_an_id_outside_its_table_raises_the_same_error_on_every_rank_then_training_goes_on(launched, case):
    for world_size, results in launched.items():
        feature, table, rows, bad, holder, also = ERRORS[case](world_size)
        for kind in KINDS:
            outs, after = unsharded_step(kind, ORDINARY, world_size)
            for routing in ROUTINGS:
                expected = (
                    f"ValueError: feature {feature!r} of table {table!r}: {routing} routing needs keys "
                    f"in [0, {rows}), got key {bad} on rank {holder}{also} (every rank raises this, "
                    f"before any id is sent)"
                )
                for rank, result in enumerate(results[kind, routing, case]):
                    assert result.get("error") == expected, (world_size, kind, routing, rank, result)
                    assert_step_equal(result["next"], outs, after, rank)


def test_torchrecs_row_wise_sharding_reads_another_ids_row_for_an_id_past_the_end(launched):
    """FBGEMM's block bucketize sends id 7 of a 7-row table to rank 7 // ceil(7/W) as its local row
    7 % ceil(7/W), past that rank's rows; FBGEMM's bounds check (WARNING mode) logs on that rank and
    reads its local row 0: the row of id (7 // block) * block."""
    for world_size, results in launched.items():
        block = -(-ROWS["a"] // world_size)
        row = table_weight(make_module("ec", ROWS, SEED), "a").detach()[ROWS["a"] // block * block]
        for rank, result in enumerate(results["ec", "torchrec", "id_past_end"]):
            assert "step" in result, result  # no error
            batch = edge_batch("id_past_end", rank, world_size, SEED)
            if rank == world_size - 1:  # the bad id is f_a's last: the last row of f_a's block
                got = result["step"]["out"][len(batch["f_a"].values()) - 1]
                torch.testing.assert_close(got, row, rtol=1e-5, atol=1e-5)


def test_torchrecs_row_wise_ebc_backward_stops_on_every_rank_when_batch_sizes_differ_on_gloo(launched):
    for results in launched.values():
        for result in results["ebc", "torchrec", "fewer"]:
            assert result["error"].startswith(
                "RuntimeError: ProcessGroupGloo::allgather: invalid tensor size"
            )
