"""embnb.rowwise.kv on real gloo ranks, checked against the single-process table.

Spawning ranks costs seconds, so each launch runs several checks: one 4-rank
launch trains and saves a table per dist_type, one 2-rank launch loads those
checkpoints, one 3-rank launch runs lookups and a layout-mismatch check.
"""

import pytest
import ranks
import torch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from embnb.dist import launch_each
from embnb.rowwise import kv
from embnb.rowwise.routing import KEY_MODES, DistType, owner_rank

DIM = 8
BLOCK = 8  # continuous blocks cover keys [0, BLOCK * W); the batches go past
SEED = 7
LR = 0.5
DIST_TYPES = list(KEY_MODES)  # the KV table takes any key; feistel_roundrobin is refused below


def make_batches(world_size: int, dist_type: DistType, seed: int):
    """Per-rank batches: 3 features, batch sizes differing per rank, repeated
    keys, empty samples, keys past the continuous blocks, one int32 batch
    and one rank with no keys at all."""
    gen = torch.Generator().manual_seed(seed)
    batches = []
    for rank in range(world_size):
        batch_size = 2 + rank % 3
        lengths = torch.randint(0, 4, (3 * batch_size,), generator=gen)
        if rank == world_size - 1:
            lengths.zero_()  # this rank only serves, it asks for nothing
        num_keys = int(lengths.sum())
        keys = torch.randint(0, 3 * BLOCK * world_size, (num_keys,), generator=gen)
        keys[::3] = keys[0] if num_keys else 0  # hot repeated key
        if rank != 1:  # rank 1 sends int32 keys
            keys[1::5] += 1 << 40  # far past the blocks
        if dist_type is not DistType.CONTINUOUS:
            keys[2::7] = -keys[2::7] - 1  # uint64 patterns >= 2**63
        dtype = torch.int32 if rank == 1 else torch.int64
        # JaggedBatch, not KeyedJaggedTensor: the ranks skip importing torchrec.
        batches.append(kv.JaggedBatch(["f0", "f1", "f2"], keys.to(dtype), lengths))
    return batches


def make_grads(batches, seed: int):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(b.values().numel(), DIM, generator=gen) for b in batches]


def spec(dist_type: DistType) -> kv.KVTableSpec:
    return kv.KVTableSpec(dist_type, DIM, BLOCK, SEED)


def reference(dist_type: DistType) -> kv.ShardedKVTable:
    return kv.ShardedKVTable("ref", DIM, dist_type, world_size=1, block_size=BLOCK, seed=SEED)


# --------------------------------------------------------- 4 ranks: train


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """Per dist_type: batches, grads, per-rank train results, checkpoint."""
    root = tmp_path_factory.mktemp("kv")
    cases, calls = {}, []
    for i, dist_type in enumerate(DIST_TYPES):
        batches = make_batches(4, dist_type, seed=i)
        grads = make_grads(batches, seed=10 + i)
        directory = str(root / dist_type.value)
        cases[dist_type] = {"batches": batches, "grads": grads, "dir": directory}
        calls.append((ranks.kv_train, (spec(dist_type), batches, grads, LR, directory)))
    for dist_type, results in zip(DIST_TYPES, launch_each(calls, 4, device="cpu")):
        cases[dist_type]["results"] = results
    return cases


@pytest.mark.parametrize("dist_type", DIST_TYPES, ids=str)
def test_sharded_step_equals_single_process(trained, dist_type):
    case = trained[dist_type]
    ref = reference(dist_type)
    for batch, result in zip(case["batches"], case["results"]):
        kjt = KeyedJaggedTensor(keys=batch.keys(), values=batch.values(), lengths=batch.lengths())
        assert torch.equal(result["rows"], ref.lookup(kjt))  # a KJT looks up as its JaggedBatch
    # Sum-of-gradients order matters in float: the owners add the ranks'
    # gradients in rank order, so the reference applies them in rank order.
    for batch, grads in zip(case["batches"], case["grads"]):
        ref.apply_gradients(batch, grads, LR)
    for batch, result in zip(case["batches"], case["results"]):
        assert torch.equal(result["rows_after"], ref.lookup(batch))
        if batch.values().numel():
            assert not torch.equal(result["rows_after"], result["rows"])


# ----------------------------------------------------- 2 ranks: reshard


@pytest.fixture(scope="module")
def reloaded(trained):
    calls = [
        (ranks.kv_load_and_lookup, (trained[d]["dir"], d, SEED, make_batches(2, d, seed=20)))
        for d in DIST_TYPES
    ]
    return dict(zip(DIST_TYPES, launch_each(calls, 2, device="cpu")))


@pytest.mark.parametrize("dist_type", DIST_TYPES, ids=str)
def test_dump_on_4_load_on_2_keeps_every_row_once(trained, reloaded, dist_type):
    case, loaded = trained[dist_type], reloaded[dist_type]
    keys = torch.cat([r["keys"] for r in loaded])
    rows = torch.cat([r["rows"] for r in loaded])
    expected = torch.unique(torch.cat([b.values().to(torch.int64) for b in case["batches"]]))
    assert torch.equal(keys.sort().values, expected)  # none lost or repeated
    for rank, r in enumerate(loaded):
        assert (owner_rank(r["keys"], 2, dist_type, BLOCK) == rank).all()
    ref = reference(dist_type)
    for batch, grads in zip(case["batches"], case["grads"]):
        ref.apply_gradients(batch, grads, LR)
    everything = KeyedJaggedTensor(keys=["f0"], values=keys, lengths=torch.tensor([len(keys)]))
    assert torch.equal(rows, ref.lookup(everything))
    # The 2-rank table keeps serving: old keys trained, new keys initial.
    for batch, r in zip(make_batches(2, dist_type, seed=20), loaded):
        assert torch.equal(r["lookup"], ref.lookup(batch))


# ---------------------------------------- 3 ranks: lookups, load counters


@pytest.fixture(scope="module")
def three_ranks():
    batches = {d: make_batches(3, d, seed=30 + i) for i, d in enumerate(DIST_TYPES)}
    calls = [(kv.lookup_on_rank, (spec(d), batches[d])) for d in DIST_TYPES] + [(ranks.kv_rank_mismatch, ())]
    *lookups, mismatches = launch_each(calls, 3, device="cpu")
    return batches, dict(zip(DIST_TYPES, lookups)), mismatches


@pytest.mark.parametrize("dist_type", DIST_TYPES, ids=str)
def test_three_rank_lookup_and_counters(three_ranks, dist_type):
    batches, results, _ = three_ranks
    batches, results = batches[dist_type], results[dist_type]
    ref = reference(dist_type)
    for batch, result in zip(batches, results):
        assert torch.equal(result["rows"], ref.lookup(batch))
    # Independent count: route every rank's keys with owner_rank.
    keys = torch.cat([b.values().to(torch.int64) for b in batches])
    owners = owner_rank(keys, 3, dist_type, BLOCK).tolist()
    key_counts = [owners.count(rank) for rank in range(3)]
    unique_counts = [len({k for k, o in zip(keys.tolist(), owners) if o == rank}) for rank in range(3)]
    stats = [r["stats"] for r in results]
    assert [s["keys_served"] for s in stats] == key_counts
    assert [s["unique_keys_served"] for s in stats] == unique_counts
    assert [s["rows_held"] for s in stats] == unique_counts
    assert [s["bytes_served"] for s in stats] == [c * DIM * 4 for c in key_counts]
    assert [s["keys_requested"] for s in stats] == [b.values().numel() for b in batches]
    assert sum(s["keys_served"] for s in stats) == len(keys)


def test_layout_contradicting_the_group_raises(three_ranks):
    for rank, messages in enumerate(three_ranks[2]):
        assert len(messages) == 2
        assert "world_size=4" in messages[0]
        assert f"rank={(rank + 1) % 3}" in messages[1]


# ------------------------------------------------- single process only


def test_init_rows_is_a_pure_function_of_key_and_seed():
    keys = torch.tensor([5, -1, 1 << 40, 5])
    rows = kv.init_rows(keys, 16, seed=3)
    assert rows.dtype == torch.float32 and rows.shape == (4, 16)
    assert torch.equal(rows[0], rows[3])
    assert torch.equal(rows[1:3], kv.init_rows(keys[1:3], 16, seed=3))
    assert torch.equal(kv.init_rows(keys.to(torch.int32)[:1], 16, 3), rows[:1])
    assert not torch.equal(rows, kv.init_rows(keys, 16, seed=4))
    assert rows.min() >= -kv.INIT_SCALE and rows.max() < kv.INIT_SCALE
    assert len(torch.unique(rows[0])) == 16  # columns differ


def test_single_process_table_inserts_and_sums_duplicate_grads():
    table = kv.ShardedKVTable("t", 4, "hash_roundrobin")
    assert (table.world_size, table.rank) == (1, 0)
    batch = KeyedJaggedTensor(
        keys=["a", "b"], values=torch.tensor([9, 3, 9]), lengths=torch.tensor([2, 0, 1, 0])
    )
    rows = table.lookup(batch)
    assert torch.equal(rows, kv.init_rows(torch.tensor([9, 3, 9]), 4))
    assert table.keys.tolist() == [3, 9]
    grads = torch.ones(3, 4)
    table.apply_gradients(batch, grads, lr=0.25)
    after = table.lookup(batch)
    torch.testing.assert_close(after[0], rows[0] - 0.5)  # key 9 twice
    torch.testing.assert_close(after[1], rows[1] - 0.25)
    assert table.stats()["unique_keys_served"] == 4  # 2 per lookup


def bad_batch(values):
    return KeyedJaggedTensor(keys=["a"], values=torch.tensor(values), lengths=torch.tensor([len(values)]))


def test_bad_inputs_raise_naming_the_value(tmp_path):
    table = kv.ShardedKVTable("t", 4, "continuous", block_size=8)
    with pytest.raises(ValueError, match=r"\(2, 4\).*\(2, 5\)"):
        table.apply_gradients(bad_batch([1, 2]), torch.zeros(2, 5), 0.1)
    with pytest.raises(ValueError, match="lr"):
        table.apply_gradients(bad_batch([1, 2]), torch.zeros(2, 4), float("nan"))
    with pytest.raises(ValueError, match="-3"):
        table.lookup(bad_batch([1, -3]))
    with pytest.raises(ValueError, match="KeyedJaggedTensor or JaggedBatch"):
        table.lookup(torch.tensor([1, 2]))
    with pytest.raises(TypeError, match="block_size must be an int >= 1, got NoneType None"):
        kv.ShardedKVTable("t", 4, "continuous")
    with pytest.raises(ValueError, match=r"rank must be an int in \[0, 1\], got 2"):
        kv.ShardedKVTable("t", 4, "roundrobin", world_size=2, rank=2)
    with pytest.raises(TypeError, match="world_size must be an int >= 1, got bool True"):
        kv.ShardedKVTable("t", 4, "roundrobin", world_size=True)
    with pytest.raises(ValueError, match="embedding_dim"):
        kv.ShardedKVTable("t", 0, "roundrobin")
    with pytest.raises(ValueError, match="modulo"):
        kv.ShardedKVTable("t", 4, "modulo")
    with pytest.raises(ValueError, match="feistel_roundrobin routes the ids of a table.*hash_roundrobin"):
        kv.ShardedKVTable("t", 4, "feistel_roundrobin")
    two = kv.ShardedKVTable("t", 4, "roundrobin", world_size=2, rank=1)
    with pytest.raises(ValueError, match="no process group"):
        two.lookup(bad_batch([1]))
    with pytest.raises(ValueError, match="3 entries.*world_size=2"):
        kv.lookup_on_rank(0, 2, spec(DistType.ROUNDROBIN), [bad_batch([1])] * 3)

    table.lookup(bad_batch([1, 2, 100]))
    table.dump(tmp_path)
    with pytest.raises(ValueError, match="'continuous'.*'hash_roundrobin'"):
        kv.ShardedKVTable.load(tmp_path, "t", "hash_roundrobin")
    loaded = kv.ShardedKVTable.load(tmp_path, "t", "continuous")
    assert loaded.block_size == 8
    assert torch.equal(loaded.keys, table.keys)
    assert torch.equal(loaded.rows, table.rows)


def test_loaded_table_makes_new_rows_with_the_saved_seed(tmp_path):
    table = kv.ShardedKVTable("t", 4, "roundrobin", seed=7)
    table.lookup(bad_batch([1, 2]))
    table.dump(tmp_path)
    loaded = kv.ShardedKVTable.load(tmp_path, "t", "roundrobin")
    assert loaded.seed == 7
    new_keys = bad_batch([1, 99])
    assert torch.equal(loaded.lookup(new_keys), table.lookup(new_keys))
