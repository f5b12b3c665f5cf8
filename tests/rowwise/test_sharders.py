"""The routed sharders over real gloo ranks, against the unsharded torchrec module.

One launch per world size (W = 2, 3, 4) runs every case of that W: each routing on an
EmbeddingBagCollection's sum- and mean-pooled tables and on an EmbeddingCollection's tables,
row counts divisible by W and not (and one smaller than W). The parent checks, against the
unsharded module and an owner rule written in plain ints (tests/sharder_ranks.py):

- forward outputs on every rank equal the unsharded module's on that rank's batch;
- the tables after one fused SGD step equal the unsharded step over all batches;
- every id's row sits on the rank its routing names, at its local row, as built from the
  unsharded module and after the step;
- the same comparison fails for a layout whose local row index is off by one;
- a checkpoint saved at the previous launch's (W, routing), converted with convert_rows, loads
  with every row where the new routing puts it;
- a state dict saved under another routing does not load.
"""

from __future__ import annotations

import pytest
import torch
from sharder_ranks import (
    EDGE_IDS,
    LR,
    edge_case,
    flat_output,
    load_case,
    make_batch,
    make_module,
    mismatch_case,
    oracle_slots,
    output_grad,
    owner_local,
    parity_case,
    table_weight,
)

from embnb.dist import launch_each

SEED = 5
RR, FR, CO = "roundrobin", "feistel_roundrobin", "continuous"
CASES = {  # W -> [(kind, rows per table, routings)]; in an EBC "a" is sum-pooled, "b" mean-pooled
    2: [
        ("ebc", {"a": 7, "b": 6}, {"a": CO, "b": RR}),
        ("ebc", {"a": 9, "b": 8}, {"a": RR, "b": FR}),
        ("ebc", {"a": 6, "b": 11}, {"a": FR, "b": CO}),
        ("ec", {"a": 7, "b": 9}, {"a": CO, "b": RR}),
        ("ec", {"a": 6, "b": 5}, {"a": FR}),
    ],
    3: [
        ("ebc", {"a": 10, "b": 9}, {"a": CO, "b": RR}),
        ("ebc", {"a": 11, "b": 2}, {"a": RR, "b": FR}),
        ("ebc", {"a": 9, "b": 7}, {"a": FR, "b": CO}),
        ("ec", {"a": 8, "b": 10}, {"a": RR, "b": FR}),
        ("ec", {"a": 7, "b": 9}, {"a": CO}),
    ],
    4: [
        ("ebc", {"a": 13, "b": 8}, {"a": CO, "b": RR}),
        ("ebc", {"a": 10, "b": 3}, {"a": RR, "b": FR}),
        ("ebc", {"a": 12, "b": 14}, {"a": FR, "b": CO}),
        ("ec", {"a": 10, "b": 13}, {"a": FR, "b": CO}),
        ("ec", {"a": 9, "b": 4}, {"a": RR}),
    ],
}
OFF_BY_ONE = ("ebc", {"a": 8, "b": 7}, {"a": RR, "b": FR})
LOADS = {  # W -> [(index of a case of the previous launch, routings to load it under)]
    3: [(1, {"a": FR, "b": CO}), (3, {"a": CO, "b": RR})],
    4: [(0, {"a": FR, "b": RR}), (3, {"a": RR, "b": FR})],
}
MISMATCHES = [  # (kind, saved routings, loaded routings, an error expected)
    ("ebc", {"a": RR}, {"a": FR}, True),
    ("ebc", {"a": FR}, {"a": FR}, False),
    ("ebc", None, {"a": RR}, True),  # None: an unsharded module's state dict, read as continuous
    ("ec", None, {}, False),
    ("ec", {"a": FR}, {"a": RR}, True),
]
EDGE_CASES = ("bad_id", "vbe", "mixed", "need_indices")  # run at W = 2


def routing(routings: dict, name: str) -> str:
    return routings.get(name, CO)


def unsharded_step(kind, rows, world_size):
    """Outputs per rank and the tables after one SGD step on the mean of the ranks' losses
    (torchrec divides the gradients its collectives carry by W, as DDP averages)."""
    module = make_module(kind, rows, SEED)
    outs, loss = [], 0
    for rank in range(world_size):
        out = flat_output(kind, module(make_batch(rows, rank, SEED)))
        outs.append(out.detach())
        loss = loss + (out * output_grad(out, rank, SEED)).sum()
    (loss / world_size).backward()
    weights = {n: table_weight(module, n) for n in rows}
    return outs, {n: (w - LR * w.grad).detach() for n, w in weights.items()}


def misplaced(local_shards: list[torch.Tensor], rows: torch.Tensor, routing: str, world_size: int):
    """Ids whose row is not at (owner, local row) in the ranks' local shards (float tolerance: rows
    trained by the sharded module differ from the unsharded module's in the last bits)."""
    bad = []
    for i in range(rows.shape[0]):
        rank, local = owner_local(routing, i, rows.shape[0], world_size)
        shard = local_shards[rank]
        if local >= shard.shape[0] or not torch.allclose(shard[local], rows[i], rtol=1e-5, atol=1e-5):
            bad.append(i)
    return bad


def in_id_order(storage: torch.Tensor, routing: str, world_size: int, n: int) -> torch.Tensor:
    return storage[oracle_slots(routing, n, world_size)]


@pytest.fixture(scope="module")
def launched():
    """(W -> (parity results, off-by-one result, load results, mismatch results), refusals at
    W = 2); one launch per W, each loading checkpoints the previous one saved."""
    out, previous, refused = {}, None, []
    for world_size in sorted(CASES):
        calls = [(parity_case, (kind, rows, r, SEED)) for kind, rows, r in CASES[world_size]]
        calls.append((parity_case, (*OFF_BY_ONE, SEED, True)))
        loads = LOADS.get(world_size, [])
        for index, target in loads:
            kind, rows, _ = CASES[world_size - 1][index]
            calls.append((load_case, (kind, rows, previous[index][0]["checkpoint"], target, SEED)))
        calls += [(mismatch_case, (kind, {"a": 7, "b": 10}, s, t, SEED)) for kind, s, t, _ in MISMATCHES]
        if world_size == 2:
            calls += [(edge_case, (what, SEED)) for what in EDGE_CASES]
        results = launch_each(calls, world_size, device="cpu", timeout_s=300)
        n = len(CASES[world_size])
        parity, rest = results[:n], results[n:]
        mismatches = rest[1 + len(loads) : 1 + len(loads) + len(MISMATCHES)]
        out[world_size] = (parity, rest[0], rest[1 : 1 + len(loads)], mismatches)
        refused = refused or rest[1 + len(loads) + len(MISMATCHES) :]
        previous = parity
    return out, dict(zip(EDGE_CASES, refused))


def test_outputs_and_tables_after_a_step_equal_the_unsharded_module(launched):
    for world_size, (parity, _, _, _) in launched[0].items():
        for (kind, rows, routings), per_rank in zip(CASES[world_size], parity):
            outs, after = unsharded_step(kind, rows, world_size)
            for rank, result in enumerate(per_rank):
                assert result["routings"] == {name: routing(routings, name) for name in rows}
                torch.testing.assert_close(result["out"], outs[rank], rtol=1e-5, atol=1e-5)
                for name, n in rows.items():
                    table = in_id_order(result["after"][name], routing(routings, name), world_size, n)
                    torch.testing.assert_close(table, after[name], rtol=1e-5, atol=1e-5)


def test_every_row_sits_on_the_rank_its_routing_names(launched):
    for world_size, (parity, _, _, _) in launched[0].items():
        for (kind, rows, routings), per_rank in zip(CASES[world_size], parity):
            unsharded = make_module(kind, rows, SEED)
            for name, n in rows.items():
                r = routing(routings, name)
                block = -(-n // world_size)
                assert per_rank[0]["after"][name].shape[0] == (n if r == CO else block * world_size)
                built = [result["built"][name] for result in per_rank]
                assert misplaced(built, table_weight(unsharded, name).detach(), r, world_size) == []
                table = in_id_order(per_rank[0]["after"][name], r, world_size, n)
                assert misplaced([res["local"][name] for res in per_rank], table, r, world_size) == []


def test_the_check_fails_when_the_local_row_is_off_by_one(launched):
    for world_size, (_, per_rank, _, _) in launched[0].items():
        kind, rows, routings = OFF_BY_ONE
        outs, _ = unsharded_step(kind, rows, world_size)
        for rank, result in enumerate(per_rank):
            assert not torch.allclose(result["out"], outs[rank], rtol=1e-5, atol=1e-5)
        for name, n in rows.items():  # the rows it built from the unsharded module are misplaced too
            built = [result["built"][name] for result in per_rank]
            weight = table_weight(make_module(kind, rows, SEED), name).detach()
            assert len(misplaced(built, weight, routings[name], world_size)) == n


def test_a_converted_checkpoint_loads_where_the_new_routing_puts_each_row(launched):
    checked = 0
    for world_size, (_, _, loads, _) in launched[0].items():
        for (index, target), per_rank in zip(LOADS.get(world_size, []), loads):
            kind, rows, _ = CASES[world_size - 1][index]
            _, after = unsharded_step(kind, rows, world_size - 1)  # what the saving launch trained
            for name in rows:
                shards = [shards[name] for shards in per_rank]
                assert misplaced(shards, after[name], routing(target, name), world_size) == []
                checked += 1
    assert checked == 8


def test_a_state_dict_saved_under_another_routing_does_not_load(launched):
    for _, (_, _, _, mismatches) in launched[0].items():
        for (_, saved, loaded, fails), per_rank in zip(MISMATCHES, mismatches):
            for error in per_rank:
                if not fails:
                    assert error is None
                    continue
                assert error.startswith("RoutingMismatch")
                assert repr(routing(saved or {}, "a")) in error and repr(loaded["a"]) in error


def test_a_bad_id_is_refused_by_name(launched):
    for error in launched[1]["bad_id"]:
        words = "feature 'f_a' of table 'a': roundrobin routing needs keys in [0, 8), got key 8"
        assert error is not None and error.startswith("ValueError") and words in error, error


def test_a_variable_batch_per_feature_is_delivered_as_torchrecs_row_wise_dist_delivers_its_slots(launched):
    for received in launched[1]["vbe"]:
        assert received["routed"] == received["torchrec"]
        values, lengths, strides = received["routed"]
        assert len(lengths) == 2 * (3 + 2) and sum(lengths) == len(values)  # W = 2 ranks' bags of both


def test_a_routed_table_beside_a_table_wise_one_gives_the_unsharded_output(launched):
    for difference in launched[1]["mixed"]:
        assert difference < 1e-5, difference


def test_need_indices_returns_the_ids_given_not_the_local_rows(launched):
    values, lengths = EDGE_IDS
    ids = dict(zip(["f_a", "f_b"], values.split([int(lengths[:2].sum()), int(lengths[2:].sum())])))
    for indices in launched[1]["need_indices"]:
        assert indices == {key: [float(i) for i in part.tolist()] for key, part in ids.items()}
