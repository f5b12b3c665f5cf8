"""embnb.lab.rowwise.kv_experiment on real gloo ranks: the KV lookups of every
dist_type in one launch, the checkpoint resharded, the results dict."""

from __future__ import annotations

import pytest
import torch

from embnb.data import make_keys
from embnb.lab.rowwise import aliasing, kv_experiment
from embnb.lab.rowwise.reference import fmix64, jump_bucket
from embnb.rowwise import kv
from embnb.rowwise.routing import owner_rank

MODES = ["continuous", "roundrobin", "hash_roundrobin"]
DIM, SEED, WORLD = 4, 3, 2


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    directory = str(tmp_path_factory.mktemp("kv01"))
    keys = make_keys("strided", 2 * 48, seed=1, stride=4)
    batches = aliasing.make_batches(keys, WORLD, keys_per_sample=4)
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


def test_every_dist_type_serves_each_key_at_its_owner(saved):
    _, keys, batches, blocks, run = saved
    assert (run.world_size, run.backend) == (WORLD, "gloo")
    assert run.rows_match(batches, DIM, SEED)
    for mode in MODES:
        # Expected counts with Python sets and lists, per owner rank.
        owners = owner_rank(keys, WORLD, mode, blocks.get(mode)).tolist()
        served = [owners.count(rank) for rank in range(WORLD)]
        held = [len({k for k, o in zip(keys.tolist(), owners) if o == rank}) for rank in range(WORLD)]
        assert run.keys_served()[mode] == served
        assert run.rows_held()[mode] == held
        assert run.max_over_mean()[mode] == pytest.approx(max(served) * WORLD / sum(served))
    assert run.keys_served()["roundrobin"] == [len(keys), 0]  # strided keys alias onto rank 0


def test_a_wrong_row_is_noticed(saved):
    _, _, batches, _, run = saved
    tampered = kv_experiment.KVLookupRun(
        run.world_size, run.backend, {"roundrobin": [r + 1 for r in run.rows["roundrobin"]]}, run.stats, 0.0
    )
    assert not tampered.rows_match(batches, DIM, SEED)


def test_reshard_into_three_ranks_keeps_every_row_once(saved):
    directory, keys, _, _, run = saved
    report = kv_experiment.reshard(
        directory, "hash_roundrobin", run.rows_held()["hash_roundrobin"], 3, None, DIM, SEED
    )
    distinct = keys.unique()
    assert report.saved_world_size == WORLD and report.load_world_size == 3
    assert sum(report.rows_saved) == sum(report.rows_loaded) == report.distinct_keys_loaded == len(distinct)
    assert report.every_key_on_owner and report.rows_exact
    moved = (
        owner_rank(distinct, WORLD, "hash_roundrobin") != owner_rank(distinct, 3, "hash_roundrobin")
    ).sum()
    assert report.rows_moved_fraction == pytest.approx(int(moved) / len(distinct))
    jumps = [jump_bucket(fmix64(k), WORLD) != jump_bucket(fmix64(k), 3) for k in distinct.tolist()]
    assert report.jump_hash_moved_fraction == pytest.approx(sum(jumps) / len(distinct))
    assert report.as_dict()["rows_loaded"] == report.rows_loaded


def test_loaders_compared_at_the_saved_and_a_new_world_size(saved):
    directory, keys, _, _, _ = saved
    distinct = keys.unique().tolist()
    rows = kv_experiment.compare_loaders(directory, "hash_roundrobin", [WORLD, 3])
    assert [r["world_size"] for r in rows] == [WORLD, 3]
    for row in rows:
        assert row["rows_saved"] == row["embnb_rows_loaded"] == len(distinct)
        assert row["embnb_rows_off_owner"] == row["embnb_rows_dropped"] == 0
    # dynamicemb, replayed with plain ints: the saved file of a key is its hash
    # owner at WORLD; at WORLD each rank reads its own file and keeps key % W ==
    # rank (the rest is dropped), at 3 every rank reads every file
    same, new = rows
    kept = [k for k in distinct if k % WORLD == fmix64(k) % WORLD]
    assert (same["dynamicemb_rows_loaded"], same["dynamicemb_rows_off_owner"]) == (len(kept), 0)
    assert same["dynamicemb_rows_dropped"] == len(distinct) - len(kept)
    assert same["dynamicemb_files_read_per_rank"] == 1 and new["dynamicemb_files_read_per_rank"] == WORLD
    assert (new["dynamicemb_rows_loaded"], new["dynamicemb_rows_dropped"]) == (len(distinct), 0)
    assert new["dynamicemb_rows_off_owner"] == sum(k % 3 != fmix64(k) % 3 for k in distinct)


def test_dynamicemb_replay_reads_own_file_at_the_saved_world_size_only():
    files = [torch.tensor([0, 2, 5]), torch.tensor([1, 3, 4])]  # saved by 2 ranks
    assert kv_experiment.dynamicemb_keys_loaded(files, 0, 2).tolist() == [0, 2]  # own file, key % 2 == 0
    assert kv_experiment.dynamicemb_keys_loaded(files, 1, 2).tolist() == [1, 3]
    assert kv_experiment.dynamicemb_keys_loaded(files, 2, 3).tolist() == [2, 5]  # every file, key % 3 == 2
    assert kv_experiment.dynamicemb_keys_loaded(files[:1], 0, 1).tolist() == [0, 2, 5]  # W = 1: no mask
    assert "e4fc876" in kv_experiment.DYNAMICEMB_COMMIT


def test_loading_with_another_dist_type_is_refused(saved):
    directory = saved[0]
    message = kv_experiment.mismatch_message(directory, 3, "roundrobin")
    assert "'hash_roundrobin'" in message and "'roundrobin'" in message
    assert kv_experiment.mismatch_message(directory, 3, "hash_roundrobin") is None


def test_init_rows_are_what_the_run_returned(saved):
    _, _, batches, _, run = saved
    first = run.rows["hash_roundrobin"][0]
    assert torch.equal(first, kv.init_rows(batches[0].values(), DIM, SEED))
