"""A routed EmbeddingCollection (the sequence collection, weights under "embeddings") through a DCP
checkpoint, over real gloo ranks (tests/routed_job_ranks.py, `ec_save_case`, `ec_load_case`):

- saved round-robin at W = 2 after one row-wise Adagrad step, loaded at W = 3 under
  feistel_roundrobin by `load_resharded` in blocks of 4 rows: every row and its Adagrad state where
  the owner rule in plain ints puts it (`oracle_slots`, tests/sharder_ranks.py), padding slots zero;
- no DCP read returns more than the 4 rows of a block, each of the EC's weight or its Adagrad state;
- the loaded model's sequence embeddings of a batch equal an unsharded EmbeddingCollection's holding
  the saved rows;
- `read_rows` on the EC key returns the saved rows in id order.
"""

from __future__ import annotations

import pytest
import torch
from routed_job_ranks import BLOCK_ROWS, DIM, ec_batch, ec_load_case, ec_save_case
from sharder_ranks import oracle_slots
from torchrec import EmbeddingCollection, EmbeddingConfig

from embnb.dist import launch_each
from embnb.rowwise import read_rows

SEED = 7
MAX_ROWS = 4  # against saved chunks of 25 rows and a table of 50
SAVED, LOADED = "roundrobin", "feistel_roundrobin"  # at W = 2, at W = 3
KEY = "model.ec.embeddings.t.weight"


@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("dcp_ec") / "checkpoint")
    (saved,) = launch_each([(ec_save_case, (SAVED, path, SEED))], 2, device="cpu", timeout_s=300)
    (loaded,) = launch_each([(ec_load_case, (LOADED, path, SEED, MAX_ROWS))], 3, device="cpu", timeout_s=300)
    return saved[0], loaded, path


def id_order(storage: torch.Tensor, routing: str, world_size: int) -> torch.Tensor:
    return storage[oracle_slots(routing, BLOCK_ROWS, world_size)]


def test_the_checkpoint_holds_the_ec_table_under_its_layout_key(launched):
    saved, local = launched[0], KEY[len("model.") :]  # the model's own keys; DCP's carry "model."
    assert [k for k in saved["keys"] if k.startswith(local)] == [f"{local}@roundrobin(world_size=2)"]
    assert [k for k in saved["optimizer_keys"] if ".t." in k] == [f"{local}@roundrobin(world_size=2)"]


def test_every_row_and_its_adagrad_state_land_where_the_new_routing_puts_them(launched):
    saved, loaded, _ = launched
    rows, momentum = id_order(saved["rows"], SAVED, 2), id_order(saved["momentum"], SAVED, 2)
    assert momentum.count_nonzero() > BLOCK_ROWS // 2  # a state to move: the step reached most rows
    padding = torch.ones(3 * -(-BLOCK_ROWS // 3), dtype=torch.bool)
    padding[oracle_slots(LOADED, BLOCK_ROWS, 3)] = False
    assert padding.any()
    for result in loaded:
        assert result["found"] == {"t": f"{KEY}@roundrobin(world_size=2)"}
        torch.testing.assert_close(id_order(result["rows"], LOADED, 3), rows)
        torch.testing.assert_close(id_order(result["momentum"], LOADED, 3), momentum)
        assert not result["rows"][padding].any() and not result["momentum"][padding].any()


def test_no_read_is_larger_than_the_block(launched):
    saved_key = f"{KEY}@roundrobin(world_size=2)"
    keys = {saved_key, f"optim.state.ec.{saved_key[len('model.ec.') :]}.t.momentum1"}
    for result in launched[1]:
        assert len(result["reads"]) > 2
        for read in result["reads"]:
            assert len(read["keys"]) == 1 and read["keys"][0] in keys, read
            assert 1 <= read["rows"] <= read["dest_rows"] <= MAX_ROWS, read
        assert {read["keys"][0] for read in result["reads"]} == keys


def test_read_rows_returns_the_ec_table_in_id_order(launched):
    saved, _, path = launched
    rows = read_rows(path, KEY, num_embeddings=BLOCK_ROWS)
    assert rows.shape == (BLOCK_ROWS, DIM)
    torch.testing.assert_close(rows, id_order(saved["rows"], SAVED, 2))


def test_the_loaded_model_s_sequences_equal_an_unsharded_ec_of_the_saved_rows(launched):
    _, loaded, path = launched
    config = EmbeddingConfig(name="t", embedding_dim=DIM, num_embeddings=BLOCK_ROWS, feature_names=["f"])
    unsharded = EmbeddingCollection(tables=[config])
    with torch.no_grad():
        unsharded.embeddings["t"].weight.copy_(read_rows(path, KEY, num_embeddings=BLOCK_ROWS))
        for rank, result in enumerate(loaded):
            expected = unsharded(ec_batch(rank, SEED + 1))["f"]
            assert result["out"].shape == (len(expected.values()), DIM) and len(expected.values()) > 0
            torch.testing.assert_close(result["lengths"], expected.lengths())
            torch.testing.assert_close(result["out"], expected.values())
