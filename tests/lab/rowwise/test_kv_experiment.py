"""embnb.lab.rowwise.kv_experiment on real gloo ranks: the KV lookups of every dist_type in one
launch, the checkpoint reloaded at the saved and at another world size by embnb's loader and by
dynamicemb's as embnb replays it."""

from __future__ import annotations

import pytest
import torch

from embnb.data import make_keys
from embnb.lab.rowwise import aliasing, kv_experiment
from embnb.lab.rowwise.core import jump_bucket
from embnb.rowwise import kv
from embnb.rowwise.routing import owner_rank
from tests.lab.rowwise.plain_routing import fmix64

MODES = ["continuous", "roundrobin", "hash_roundrobin"]
DIM, SEED, WORLD = 4, 3, 2


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    directory = str(tmp_path_factory.mktemp("kv01"))
    keys = make_keys("strided", 2 * 48, seed=1, stride=4)
    batches = kv_experiment.make_batches(keys, WORLD, keys_per_sample=4)
    blocks = {"continuous": aliasing.block_size_for(keys, WORLD)}
    run = kv_experiment.run_kv_lookups(
        batches,
        MODES,
        DIM,
        block_sizes=blocks,
        seed=SEED,
        dump_dir=directory,
        dump_dist_type="hash_roundrobin",
        device="cpu",
    )
    return directory, keys, batches, blocks, run


def test_make_batches_splits_keys_into_one_batch_per_rank():
    batches = kv_experiment.make_batches(torch.arange(24), 3, keys_per_sample=4)
    assert torch.equal(torch.cat([b.values() for b in batches]), torch.arange(24))
    assert batches[1].lengths().tolist() == [4, 4] and batches[0].keys() == ["item_id"]
    with pytest.raises(ValueError, match="do not split"):
        kv_experiment.make_batches(torch.arange(10), 3)


def test_every_dist_type_serves_each_key_at_its_owner(saved):
    _, keys, batches, blocks, run = saved
    assert (run["world_size"], run["backend"]) == (WORLD, "gloo")
    assert run["rows_match"] is True
    for mode in MODES:
        # Expected counts with Python sets and lists, per owner rank.
        owners = owner_rank(keys, WORLD, mode, blocks.get(mode)).tolist()
        served = [owners.count(rank) for rank in range(WORLD)]
        held = [len({k for k, o in zip(keys.tolist(), owners) if o == rank}) for rank in range(WORLD)]
        assert run["keys_served"][mode] == served
        assert run["rows_held"][mode] == held
        assert run["max_over_mean"][mode] == pytest.approx(max(served) * WORLD / sum(served))
        for rows, batch in zip(run["rows"][mode], batches):  # each key's initial row, in input order
            assert torch.equal(rows, kv.init_rows(batch.values(), DIM, SEED))
    assert run["keys_served"]["roundrobin"] == [len(keys), 0]  # strided keys alias onto rank 0


def test_reloads_at_the_saved_and_a_new_world_size(saved):
    directory, keys, _, _, _ = saved
    distinct = keys.unique().tolist()
    rows = kv_experiment.reload(directory, "hash_roundrobin", [WORLD, 3], DIM, SEED)
    assert [r["world_size"] for r in rows] == [WORLD, 3]
    for row in rows:
        assert row["rows_saved"] == row["embnb_rows_loaded"] == len(distinct)
        assert row["embnb_rows_off_owner"] == row["embnb_rows_dropped"] == 0 and row["embnb_rows_exact"]
    # dynamicemb, replayed with plain ints: the saved file of a key is its hash owner at WORLD; at
    # WORLD each rank reads its own file and keeps key % W == rank (the rest is dropped), at 3 every
    # rank reads every file
    same, new = rows
    kept = [k for k in distinct if k % WORLD == fmix64(k) % WORLD]
    assert (same["dynamicemb_rows_loaded"], same["dynamicemb_rows_off_owner"]) == (len(kept), 0)
    assert same["dynamicemb_rows_dropped"] == len(distinct) - len(kept)
    assert same["dynamicemb_files_read_per_rank"] == 1 and new["dynamicemb_files_read_per_rank"] == WORLD
    assert (new["dynamicemb_rows_loaded"], new["dynamicemb_rows_dropped"]) == (len(distinct), 0)
    assert new["dynamicemb_rows_off_owner"] == sum(k % 3 != fmix64(k) % 3 for k in distinct)
    assert same["rows_moved_fraction"] == 0 and same["jump_hash_moved_fraction"] == 0
    moved = sum(fmix64(k) % WORLD != fmix64(k) % 3 for k in distinct)
    assert new["rows_moved_fraction"] == pytest.approx(moved / len(distinct))
    jumps = [jump_bucket(fmix64(k), WORLD) != jump_bucket(fmix64(k), 3) for k in distinct]
    assert new["jump_hash_moved_fraction"] == pytest.approx(sum(jumps) / len(distinct))


def test_dynamicemb_replay_reads_own_file_at_the_saved_world_size_only():
    files = [torch.tensor([0, 2, 5]), torch.tensor([1, 3, 4])]  # saved by 2 ranks
    assert kv_experiment.dynamicemb_keys_loaded(files, 0, 2).tolist() == [0, 2]  # own file, key % 2 == 0
    assert kv_experiment.dynamicemb_keys_loaded(files, 1, 2).tolist() == [1, 3]
    assert kv_experiment.dynamicemb_keys_loaded(files, 2, 3).tolist() == [2, 5]  # every file, key % 3 == 2
    assert kv_experiment.dynamicemb_keys_loaded(files[:1], 0, 1).tolist() == [0, 2, 5]  # W = 1: no mask
    assert kv_experiment.DYNAMICEMB_LOADER["commit"].startswith("e4fc876")


def test_loading_with_another_dist_type_is_refused(saved):
    directory = saved[0]
    message = kv_experiment.mismatch_message(directory, 3, "roundrobin")
    assert "'hash_roundrobin'" in message and "'roundrobin'" in message
    assert kv_experiment.mismatch_message(directory, 3, "hash_roundrobin") is None
