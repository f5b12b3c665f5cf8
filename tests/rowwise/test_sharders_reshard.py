"""torchrec's dynamic resharding (`DistributedModelParallel.reshard`) of a routed module, over real
gloo ranks (tests/routed_job_ranks.py, `dynamic_reshard_case`).

A routed row-wise table (t_r) and a table-wise one (t_tw, on rank 0) in one EmbeddingBagCollection,
trained one row-wise Adagrad step; torchrec moves t_tw to rank 1 (the delta from torchrec's
`output_sharding_plan_delta_single`); a second step. Checked against the unsharded module trained
by hand (row-wise Adagrad written out below) on the same batches:

- t_r's rows and Adagrad state after the reshard are those before it, in id order;
- both tables' outputs on the second batch, and every row and its state after the second step,
  equal the unsharded module's;
- t_r's weight and optimizer keys still carry its layout suffix;
- a rank with a batch of no samples still gets an output of 0 samples (its backward too);
- a reshard of t_r itself (row-wise), or of a table the module lacks, is refused naming the table
  before anything changes (torchrec itself fails later, after changing the module's plan).
"""

from __future__ import annotations

import pytest
import torch
from routed_job_ranks import (
    LR,
    RESHARD_BATCH,
    RESHARD_ROWS,
    dynamic_reshard_case,
    reshard_batch,
    reshard_grad,
    reshard_module,
)
from sharder_ranks import oracle_slots

from embnb.dist import launch_each

SEED = 5
ROUTINGS = ["roundrobin", "feistel_roundrobin"]
EPS = 1e-8  # FBGEMM's row-wise Adagrad default (torchrec passes only the optimizer and learning rate)
STEPS = 2
SUFFIXES = {
    "roundrobin": "@roundrobin(world_size=2)",
    "feistel_roundrobin": "@feistel_roundrobin(world_size=2,seed=0)",
}


@pytest.fixture(scope="module")
def launched():
    calls = [(dynamic_reshard_case, (routing, SEED)) for routing in ROUTINGS]
    return dict(zip(ROUTINGS, launch_each(calls, 2, device="cpu", timeout_s=300)))


def assemble(results: list[dict], key: str) -> torch.Tensor:
    """The rows (or per-row state) of `key` from every rank's (first row, rows) blocks (a rank without
    the table has no state under its key)."""
    blocks = sorted((offset, rows) for result in results for offset, rows in result.get(key, []))
    return torch.cat([rows for _, rows in blocks])


def unsharded_steps() -> list[dict]:
    """Per step: each rank's output on its batch, then each table's rows and row-wise Adagrad state
    after the step (the gradient of the ranks' losses averaged, as torchrec's all-to-all divides by
    the world size; momentum += the row's mean squared gradient; row -= LR * grad / (sqrt + EPS))."""
    module = reshard_module(SEED)
    weights = {name: module.embedding_bags[name].weight for name in RESHARD_ROWS}
    momentum = {name: torch.zeros(rows) for name, rows in RESHARD_ROWS.items()}
    steps = []
    for step in range(1, STEPS + 1):
        outs, loss = [], 0
        for rank in range(2):
            out = module(reshard_batch(rank, step, SEED)).values()
            loss = loss + (out * reshard_grad(rank, step, SEED, out.shape)).sum()
            outs.append(out.detach())
        (loss / 2).backward()
        with torch.no_grad():
            for name, weight in weights.items():
                grad = weight.grad
                momentum[name] += (grad * grad).mean(dim=1)
                weight -= LR * grad / (momentum[name].sqrt() + EPS)[:, None]
                weight.grad = None
        steps.append(
            {
                "outs": outs,
                "rows": {n: w.detach().clone() for n, w in weights.items()},
                "momentum": {n: m.clone() for n, m in momentum.items()},
            }
        )
    return steps


def routed_keys(routing: str) -> tuple[str, str]:
    weight = f"embedding_bags.t_r.weight{SUFFIXES[routing]}"
    return weight, f"{weight}/t_r.momentum1"


def id_order(storage: torch.Tensor, routing: str) -> torch.Tensor:
    return storage[oracle_slots(routing, RESHARD_ROWS["t_r"], 2)]


@pytest.mark.parametrize("routing", ROUTINGS)
def test_the_delta_moves_only_the_table_wise_table(launched, routing):
    for result in launched[routing]:
        assert result["delta"] == ["t_tw"]


@pytest.mark.parametrize("routing", ROUTINGS)
def test_a_routed_table_keeps_its_rows_and_optimizer_state_and_keys(launched, routing):
    results = launched[routing]
    weight, momentum = routed_keys(routing)
    for result in results:
        assert set(result["after"]) >= {weight, momentum}, sorted(result["after"])
        assert result["keys"] == [f"ebc.{weight}", "ebc.embedding_bags.t_tw.weight", "scale"]
        assert f"ebc.{weight}" in result["optimizer_keys"]
        assert not any(
            k.startswith("ebc.embedding_bags.t_r.weight") and k != f"ebc.{weight}"
            for k in result["optimizer_keys"]
        )
    first = unsharded_steps()[0]
    for when in ("before", "after"):
        rows = [result[when] for result in results]
        torch.testing.assert_close(id_order(assemble(rows, weight), routing), first["rows"]["t_r"])
        torch.testing.assert_close(id_order(assemble(rows, momentum), routing), first["momentum"]["t_r"])
    assert first["momentum"]["t_r"].abs().sum() > 0  # the step left Adagrad state to keep


@pytest.mark.parametrize("routing", ROUTINGS)
def test_the_table_wise_table_moves_with_its_rows_and_optimizer_state(launched, routing):
    before, after = launched[routing][0], launched[routing][1]  # t_tw: on rank 0, then on rank 1
    first = unsharded_steps()[0]
    assert launched[routing][1]["before"]["embedding_bags.t_tw.weight"] == []
    assert before["after"]["embedding_bags.t_tw.weight"] == []
    for result in (before["before"], after["after"]):
        torch.testing.assert_close(assemble([result], "embedding_bags.t_tw.weight"), first["rows"]["t_tw"])
        torch.testing.assert_close(
            assemble([result], "embedding_bags.t_tw.weight/t_tw.momentum1"), first["momentum"]["t_tw"]
        )


@pytest.mark.parametrize("routing", ROUTINGS)
def test_training_after_the_reshard_matches_the_unsharded_module(launched, routing):
    results = launched[routing]
    weight, momentum = routed_keys(routing)
    steps = unsharded_steps()
    for step, key in ((0, "out_1"), (1, "out_2")):
        for rank, result in enumerate(results):
            torch.testing.assert_close(result[key], steps[step]["outs"][rank], rtol=1e-5, atol=1e-5)
    second = steps[1]
    rows = [result["after_2"] for result in results]
    torch.testing.assert_close(id_order(assemble(rows, weight), routing), second["rows"]["t_r"])
    torch.testing.assert_close(id_order(assemble(rows, momentum), routing), second["momentum"]["t_r"])
    torch.testing.assert_close(assemble(rows, "embedding_bags.t_tw.weight"), second["rows"]["t_tw"])
    torch.testing.assert_close(
        assemble(rows, "embedding_bags.t_tw.weight/t_tw.momentum1"), second["momentum"]["t_tw"]
    )


@pytest.mark.parametrize("routing", ROUTINGS)
def test_a_batch_of_no_samples_still_gives_an_output_of_no_samples(launched, routing):
    for rank, result in enumerate(launched[routing]):
        assert result["error_3"] is None, result["error_3"]
        dim = sum(reshard_module(SEED).embedding_bags[n].weight.shape[1] for n in RESHARD_ROWS)
        assert result["out_3_shape"] == [0 if rank == 0 else RESHARD_BATCH, dim]


@pytest.mark.parametrize("routing", ROUTINGS)
def test_resharding_a_row_wise_table_is_refused_naming_it(launched, routing):
    for result in launched[routing]:
        error = result["error_routed"]
        assert error is not None and error.startswith("ValueError: table 't_r' is sharded 'row_wise'"), error
        assert "'table_wise'" in error and "'column_wise'" in error
        assert result["error_unknown"] == (
            "ValueError: the new plan names table 't_typo', which this module lacks; "
            "its tables: ['t_r', 't_tw']"
        )
        assert result["routed_unchanged"]
