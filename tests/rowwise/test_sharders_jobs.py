"""The routed sharders as a torchrec job uses them, over real gloo ranks (tests/routed_job_ranks.py).

One launch at W = 2, one at W = 3. Checked against the unsharded torchrec module trained by hand on
the same batches, and the owner rule in plain ints (tests/sharder_ranks.py):

- a feature read by two tables (torchrec's `f@t1`, `f@t2`), every routing, EC and EBC, weighted or
  not: outputs and tables after one step equal the unsharded module's;
- two collections (an unweighted and a weighted EBC) under one sharder, a table named by its name
  and one by its collection's path; a name that matches no table raises, naming it;
- a routed checkpoint saved with DCP does not load into a plain module, torchrec's row-wise module
  or another routing (DCP fails in its planning, the targets' weights untouched; `load_state_dict`
  raises naming the layouts); `load_resharded` loads it at W = 3 under another routing with every
  row and its Adagrad state where the new routing puts it; `read_rows` gives the rows in id order.
"""

from __future__ import annotations

import pytest
import torch
from routed_job_ranks import (
    LR,
    SEQ_ROWS,
    SHARED_ROWS,
    TwoCollections,
    flat,
    reshard_case,
    save_case,
    shared_batch,
    shared_feature_case,
    shared_module,
    two_collections_batch,
    two_collections_case,
)
from sharder_ranks import oracle_slots

from embnb.dist import launch_each
from embnb.rowwise import RoutingMismatch
from embnb.rowwise.dcp_rows import read_rows

SEED = 3
RR, FR, CO = "roundrobin", "feistel_roundrobin", "continuous"
SHARED_CASES = [  # (kind, routings): every routing on the shared feature's tables
    ("ebc", {"t1": RR, "t2": FR, "t3": CO}),
    ("weighted_ebc", {"t1": FR, "t2": CO, "t3": RR}),
    ("ec", {"t1": RR, "t2": FR, "t3": CO}),
    ("ec", {"t1": CO, "t2": RR, "t3": FR}),
]
COLLECTION_CASES = {
    "named": {"t_item": RR, "wbc.t_w": FR},
    "unknown_bare": {"t_item": RR, "t_typo": FR},
    "unknown_qualified": {"wbc.t_typo": FR},
}
SAVED, RESHARDED = RR, FR  # the checkpoint's routing at W = 2; the routing it is loaded under at W = 3


@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("dcp") / "checkpoint")
    calls = [(shared_feature_case, (kind, routings, SEED)) for kind, routings in SHARED_CASES]
    calls += [(two_collections_case, (routings, SEED)) for routings in COLLECTION_CASES.values()]
    calls.append((save_case, (SAVED, path, SEED)))
    at_2 = launch_each(calls, 2, device="cpu", timeout_s=300)
    (at_3,) = launch_each([(reshard_case, (RESHARDED, path, SEED))], 3, device="cpu", timeout_s=300)
    n = len(SHARED_CASES)
    collections = dict(zip(COLLECTION_CASES, at_2[n : n + len(COLLECTION_CASES)]))
    return {
        "shared": at_2[:n],
        "collections": collections,
        "saved": at_2[-1],
        "resharded": at_3,
        "path": path,
    }


def id_order(storage: torch.Tensor, routing: str, world_size: int, n: int) -> torch.Tensor:
    return storage[oracle_slots(routing, n, world_size)]


def unsharded_shared_step(kind):
    module = shared_module(kind, SEED)
    outs, loss = [], 0
    for rank in range(2):
        out = flat(module(shared_batch(kind, rank, SEED)))
        grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(SEED + rank))
        outs.append(out.detach())
        loss = loss + (out * grad).sum()
    (loss / 2).backward()
    weights = dict(module.named_parameters())
    after = {name: (w - LR * w.grad).detach() for name, w in weights.items()}
    return outs, {t: next(w for k, w in after.items() if f".{t}." in k) for t in SHARED_ROWS}


@pytest.mark.parametrize("case", range(len(SHARED_CASES)), ids=[f"{k}-{r['t1']}" for k, r in SHARED_CASES])
def test_a_feature_read_by_two_tables_is_looked_up_in_each_tables_layout(launched, case):
    kind, routings = SHARED_CASES[case]
    outs, after = unsharded_shared_step(kind)
    for rank, result in enumerate(launched["shared"][case]):
        torch.testing.assert_close(result["out"], outs[rank], rtol=1e-5, atol=1e-5)
        for table, n in SHARED_ROWS.items():
            got = id_order(result["after"][table], routings[table], 2, n)
            torch.testing.assert_close(got, after[table], rtol=1e-5, atol=1e-5)


def test_two_collections_under_one_sharder_take_their_own_routings(launched):
    model = TwoCollections(SEED)
    for rank, result in enumerate(launched["collections"]["named"]):
        assert result["routings"] == {"t_item": RR, "t_w": FR}
        torch.testing.assert_close(result["out"], model(*two_collections_batch(rank)), rtol=1e-5, atol=1e-5)


def test_a_routing_that_names_no_table_of_the_model_raises_naming_it(launched):
    for error in launched["collections"]["unknown_bare"]:
        assert error.startswith("ValueError: routings name tables ['t_typo'] that no collection"), error
        assert "'t_item'" in error and "'wbc.t_w'" in error
    for error in launched["collections"]["unknown_qualified"]:
        assert error.startswith("ValueError: routings name tables ['wbc.t_typo'] that the module at 'wbc'")


def test_a_routed_checkpoint_carries_its_layout_in_every_key(launched):
    suffix = f"@{SAVED}(world_size=2)"
    for result in launched["saved"]:
        assert result["keys"] == [f"ebc.embedding_bags.t.weight{suffix}"]
        assert result["optimizer_keys"] == [f"ebc.embedding_bags.t.weight{suffix}"]


def test_dcp_refuses_a_routed_checkpoint_in_another_layout_before_writing_anything(launched):
    for result in launched["saved"]:
        for target, wanted in [
            ("plain", "model.ebc.embedding_bags.t.weight."),
            ("torchrec", "model.ebc.embedding_bags.t.weight."),
            ("other_routing", "model.ebc.embedding_bags.t.weight@feistel_roundrobin(world_size=2,seed=0)."),
        ]:
            error = result[f"dcp_{target}"]
            assert error is not None and f"Missing key in checkpoint state_dict: {wanted}" in error, error
            assert result[f"{target}_unchanged"], target


def test_load_state_dict_refuses_a_routed_state_dict_in_another_layout(launched):
    unexpected = f'embedding_bags.t.weight@{SAVED}(world_size=2)"'
    for result in launched["saved"]:
        for target in ("torchrec", "plain"):
            error = result[f"load_{target}"]
            assert error.startswith("RuntimeError") and "Unexpected key(s)" in error and unexpected in error
        error = result["load_other_routing"]
        assert error.startswith("RoutingMismatch: table 't'") and "'roundrobin'" in error
        assert "'feistel_roundrobin'" in error


def test_load_resharded_puts_every_row_and_its_optimizer_state_where_the_new_routing_does(launched):
    saved = launched["saved"][0]
    rows = id_order(saved["rows"], SAVED, 2, SEQ_ROWS)
    momentum = id_order(saved["momentum"], SAVED, 2, SEQ_ROWS)
    assert momentum.abs().sum() > 0  # the step left Adagrad state to move
    for result in launched["resharded"]:
        assert result["found"] == {"t": f"model.ebc.embedding_bags.t.weight@{SAVED}(world_size=2)"}
        assert result["key"] == f"embedding_bags.t.weight@{RESHARDED}(world_size=3,seed=0)"
        torch.testing.assert_close(id_order(result["rows"], RESHARDED, 3, SEQ_ROWS), rows)
        torch.testing.assert_close(id_order(result["momentum"], RESHARDED, 3, SEQ_ROWS), momentum)


def test_read_rows_gives_a_routed_tables_rows_in_id_order(launched):
    rows = read_rows(launched["path"], "model.ebc.embedding_bags.t.weight", SEQ_ROWS)
    torch.testing.assert_close(rows, id_order(launched["saved"][0]["rows"], SAVED, 2, SEQ_ROWS))
    with pytest.raises(RoutingMismatch, match="holds 12 rows, but a table of num_embeddings=8"):
        read_rows(launched["path"], "model.ebc.embedding_bags.t.weight", 8)
