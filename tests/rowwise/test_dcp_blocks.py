"""`load_resharded` reads a checkpoint in blocks of at most `max_rows_per_read` rows, each rank only
the spans holding its own rows, over real gloo ranks (tests/routed_job_ranks.py, `block_save_case`,
`block_load_case`): DCP's FileSystemReader is wrapped to record each read it serves.

- a table saved round-robin at W = 2 loads at W = 3 under feistel_roundrobin with blocks of 4 rows:
  every row and its Adagrad state where the owner rule in plain ints puts it
  (tests/sharder_ranks.py), padding slots zero, no read larger than 4 rows;
- saved and loaded continuous (W = 2 to 3): each rank reads exactly its own rows, nothing more;
- a block reader alone (one process) returns the saved tensor's rows it is asked for;
- a max_rows_per_read that is not an int >= 1 raises naming it.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed.checkpoint as dcp
from routed_job_ranks import BLOCK_ROWS, block_load_case, block_save_case
from sharder_ranks import oracle_slots

from embnb.dist import launch_each
from embnb.rowwise import load_resharded
from embnb.rowwise.dcp_rows import _metadata, _read_block

SEED = 5
MAX_ROWS = 4  # against saved chunks of 25 rows and a table of 50
CASES = {  # name -> (routing saved at W = 2, routing loaded at W = 3)
    "rr_to_feistel": ("roundrobin", "feistel_roundrobin"),
    "continuous": ("continuous", "continuous"),
}
WEIGHT = "model.ebc.embedding_bags.t.weight"


@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    root = tmp_path_factory.mktemp("dcp_blocks")
    paths = {name: str(root / name) for name in CASES}
    saves = [(block_save_case, (saved, paths[name], SEED)) for name, (saved, _) in CASES.items()]
    saved = dict(zip(CASES, launch_each(saves, 2, device="cpu", timeout_s=300)))
    loads = [(block_load_case, (new, paths[name], SEED, MAX_ROWS)) for name, (_, new) in CASES.items()]
    loaded = dict(zip(CASES, launch_each(loads, 3, device="cpu", timeout_s=300)))
    return saved, loaded


def id_order(storage: torch.Tensor, routing: str, world_size: int) -> torch.Tensor:
    return storage[oracle_slots(routing, BLOCK_ROWS, world_size)]


@pytest.mark.parametrize("case", list(CASES))
def test_every_row_and_its_adagrad_state_land_where_the_new_routing_puts_them(launched, case):
    saved_routing, new_routing = CASES[case]
    saved, loaded = launched[0][case][0], launched[1][case]
    assert id_order(saved["momentum"], saved_routing, 2).count_nonzero() > BLOCK_ROWS // 2  # state to move
    padding = torch.ones(3 * -(-BLOCK_ROWS // 3), dtype=torch.bool)
    padding[oracle_slots(new_routing, BLOCK_ROWS, 3)] = False
    for result in loaded:
        torch.testing.assert_close(
            id_order(result["rows"], new_routing, 3), id_order(saved["rows"], saved_routing, 2)
        )
        torch.testing.assert_close(
            id_order(result["momentum"], new_routing, 3), id_order(saved["momentum"], saved_routing, 2)
        )
        if new_routing != "continuous":  # the padding slots of the round-robin storage
            assert (
                padding.any() and not result["rows"][padding].any() and not result["momentum"][padding].any()
            )


@pytest.mark.parametrize("case", list(CASES))
def test_no_read_is_larger_than_the_block(launched, case):
    for result in launched[1][case]:
        weight_key = result["found"]["t"]
        keys = {weight_key, f"optim.state.ebc.embedding_bags.t.weight{weight_key[len(WEIGHT) :]}.t.momentum1"}
        assert len(result["reads"]) > 2
        for read in result["reads"]:
            assert len(read["keys"]) == 1 and read["keys"][0] in keys, read
            assert 1 <= read["rows"] <= read["dest_rows"] <= MAX_ROWS, read


def test_a_continuous_table_s_ranks_read_only_their_own_rows(launched):
    for rank, result in enumerate(launched[1]["continuous"]):
        start, count = result["shard"]
        assert (start, count) == (17 * rank, min(17, BLOCK_ROWS - 17 * rank))
        for key in {k for read in result["reads"] for k in read["keys"]}:
            assert sum(r["rows"] for r in result["reads"] if r["keys"] == [key]) == count, key


def test_a_block_read_returns_the_saved_rows_it_asks_for(tmp_path):
    saved = torch.randn(23, 3, generator=torch.Generator().manual_seed(SEED))
    dcp.save({"w": saved}, checkpoint_id=tmp_path, no_dist=True)
    metadata = _metadata(tmp_path)
    for start, stop in [(0, 23), (5, 9), (22, 23)]:
        assert torch.equal(_read_block(tmp_path, metadata, "w", start, stop), saved[start:stop])


@pytest.mark.parametrize(
    "value, error, match",
    [
        (0, ValueError, "max_rows_per_read must be an int >= 1, got 0"),
        (2.0, TypeError, "max_rows_per_read must be an int >= 1, got float 2.0"),
        (True, TypeError, "max_rows_per_read must be an int >= 1, got bool True"),
    ],
)
def test_a_bad_max_rows_per_read_raises_naming_it(tmp_path, value, error, match):
    with pytest.raises(error, match=match):
        load_resharded(torch.nn.Module(), tmp_path, max_rows_per_read=value)
