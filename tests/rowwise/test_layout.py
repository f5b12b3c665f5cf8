"""embnb.rowwise.layout (no ranks): storage slots, padding, convert_rows, the sharder's checks.

The expected owner and local row of every id come from `owner_local` in
tests/sharder_ranks.py: each routing's rule in plain ints (its own Feistel).
"""

import itertools

import pytest
import torch
from sharder_ranks import feistel_owner_local, owner_local
from torchrec import EmbeddingBagConfig

from embnb.rowwise import Routing, TableLayout, convert_rows
from embnb.rowwise.routed import RoutingMismatch, check_compatible, check_no_empty_rank, table_layouts
from embnb.rowwise.sharders import RoutedEmbeddingBagCollectionSharder

ROUTINGS = [r.value for r in Routing]
WORLD_SIZES = (2, 3, 4)


def test_slots_put_every_id_at_its_routings_owner_and_local_row():
    for n, world_size, routing in itertools.product((1, 5, 12, 13, 100), (1, 2, 3, 4, 8), ROUTINGS):
        layout = TableLayout(n, world_size, routing)
        slots = layout.slots(torch.arange(n)).tolist()
        block = -(-n // world_size)
        owners = [owner_local(routing, i, n, world_size) for i in range(n)]
        expected = [block * rank + local for rank, local in owners]
        assert slots == expected, (n, world_size, routing)
        assert layout.storage_rows == (n if routing == "continuous" else block * world_size)


@pytest.mark.parametrize("native", [True, False], ids=["native", "torch"])
def test_feistel_slots_follow_the_plain_int_rule_natively_and_in_torch(native):
    for n, world_size, seed in itertools.product((1, 2, 7, 64, 1001), (1, 3, 8), (0, 5)):
        layout = TableLayout(n, world_size, "feistel_roundrobin", seed)
        slots = layout.slots(torch.arange(n), native=native).tolist()
        block = -(-n // world_size)
        owners = (feistel_owner_local(i, n, world_size, seed) for i in range(n))
        expected = [block * r + local for r, local in owners]
        assert slots == expected, (n, world_size, seed)


def test_native_feistel_slots_equal_the_torch_ones_on_large_tables_and_reject_bad_ids():
    generator = torch.Generator().manual_seed(0)
    for n, world_size in ((2**20 + 7, 8), (10**9, 64), (3, 2)):
        layout = TableLayout(n, world_size, "feistel_roundrobin", seed=11)
        ids = torch.randint(0, n, (20_000,), generator=generator)
        assert torch.equal(layout.slots(ids, native=True), layout.slots(ids, native=False)), n
    with pytest.raises(ValueError, match=r"id 5 is outside \[0, 5\)"):
        torch.ops.embnb.feistel_slots(torch.tensor([0, 5]), 5, 2, 2, torch.zeros(4, dtype=torch.int64))


def test_round_robin_routings_balance_rows_and_continuous_keeps_torchrecs_blocks():
    assert TableLayout(10, 4, "continuous").rows_per_rank() == [3, 3, 3, 1]
    for routing in ("roundrobin", "feistel_roundrobin"):
        layout = TableLayout(10, 4, routing)
        assert layout.rows_per_rank() == [3, 3, 3, 3]  # 2 padding rows
        owners = torch.bincount(layout.owner(torch.arange(10)), minlength=4).tolist()
        assert sorted(owners) == [2, 2, 3, 3]


def test_feistel_roundrobin_spreads_strided_ids_that_roundrobin_aliases():
    ids = torch.arange(0, 8000, 8)  # every id a multiple of W
    assert set(TableLayout(8000, 8, "roundrobin").owner(ids).tolist()) == {0}
    counts = torch.bincount(TableLayout(8000, 8, "feistel_roundrobin").owner(ids), minlength=8)
    assert int(counts.max()) < 1.3 * ids.numel() / 8


@pytest.mark.parametrize("source_ws, target_ws", list(itertools.product(WORLD_SIZES, WORLD_SIZES)))
def test_convert_rows_maps_every_saved_layout_to_every_other(source_ws, target_ws):
    n = 10  # divisible by 2, not by 3 or 4
    logical = torch.arange(n * 2, dtype=torch.float32).reshape(n, 2) + 1  # no row is zero
    for source_routing, target_routing in itertools.product(ROUTINGS, ROUTINGS):
        source = TableLayout(n, source_ws, source_routing)
        target = TableLayout(n, target_ws, target_routing)
        saved = torch.zeros(source.storage_rows, 2)
        saved[source.slots(torch.arange(n))] = logical
        before = saved.clone()
        out = convert_rows(saved, source, target)
        assert torch.equal(saved, before)  # pure
        block = -(-n // target_ws)
        for i in range(n):
            rank, local = owner_local(target_routing, i, n, target_ws)
            assert torch.equal(out[rank * block + local], logical[i]), (i, source, target)
        assert out.shape[0] == target.storage_rows
        assert int((out.abs().sum(1) > 0).sum()) == n  # nothing lost, padding zero
        assert torch.equal(convert_rows(out, target, source), saved)


def test_bad_input_raises_naming_the_value_and_what_is_allowed():
    with pytest.raises(ValueError, match="'hash' is not one of continuous, roundrobin, feistel_roundrobin"):
        Routing.parse("hash")
    with pytest.raises(ValueError, match=r"id 10 is outside \[0, 10\)"):
        TableLayout(10, 2, "roundrobin").slots(torch.tensor([3, 10]))
    with pytest.raises(ValueError, match=r"id -1 is outside"):
        TableLayout(10, 2, "feistel_roundrobin").slots(torch.tensor([-1]))
    with pytest.raises(ValueError, match="rows must have source.storage_rows=12 rows"):
        convert_rows(torch.zeros(10, 2), TableLayout(10, 4, "roundrobin"), TableLayout(10, 2))
    with pytest.raises(ValueError, match="num_embeddings=10, target 11"):
        convert_rows(torch.zeros(10, 2), TableLayout(10, 2), TableLayout(11, 2))


def test_continuous_tables_that_leave_a_rank_empty_on_cpu_are_refused():
    check_no_empty_rank({"t": TableLayout(5, 4, "roundrobin")}, "cpu")
    check_no_empty_rank({"t": TableLayout(5, 4, "continuous")}, "cuda")
    allowed = "'roundrobin' or 'feistel_roundrobin'"
    with pytest.raises(ValueError, match=f"'t'.*leave rank 3 with no rows.*{allowed}"):
        check_no_empty_rank({"t": TableLayout(5, 4, "continuous")}, "cpu")


def test_routings_must_name_row_wise_tables_of_the_module():
    from torchrec.distributed.types import ParameterSharding

    configs = [EmbeddingBagConfig(name="t", embedding_dim=4, num_embeddings=8, feature_names=["f"])]
    tw = {"t": ParameterSharding(sharding_type="table_wise", compute_kernel="fused", ranks=[0])}
    rw = {"t": ParameterSharding(sharding_type="row_wise", compute_kernel="fused", ranks=[0, 1])}
    with pytest.raises(ValueError, match="routings name tables \\['u'\\] that the module lacks"):
        table_layouts(configs, rw, 2, {"u": Routing.ROUNDROBIN}, Routing.CONTINUOUS, 0)
    with pytest.raises(ValueError, match="'t' has routing 'roundrobin' but the plan shards it 'table_wise'"):
        table_layouts(configs, tw, 2, {"t": Routing.ROUNDROBIN}, Routing.CONTINUOUS, 0)
    assert table_layouts(configs, rw, 2, {}, Routing.ROUNDROBIN, 0) == {"t": TableLayout(8, 2, "roundrobin")}


def test_a_checkpoint_loads_only_under_its_own_routing():
    check_compatible("t", None, TableLayout(10, 3, "continuous"))  # torchrec's own: continuous
    check_compatible("t", {"routing": "continuous", "world_size": 2}, TableLayout(10, 3))  # torchrec reshards
    with pytest.raises(RoutingMismatch, match="'continuous'.*'roundrobin'"):
        check_compatible("t", None, TableLayout(10, 2, "roundrobin"))
    with pytest.raises(RoutingMismatch, match="'roundrobin' \\(routing='roundrobin', world_size=2"):
        check_compatible("t", {"routing": "roundrobin", "world_size": 2}, TableLayout(10, 3, "roundrobin"))


def test_the_sharder_offers_row_wise_on_cpu():
    sharder = RoutedEmbeddingBagCollectionSharder({"t": "roundrobin"})
    assert "row_wise" in sharder.sharding_types("cpu")
    assert sharder.routings == {"t": Routing.ROUNDROBIN}
    with pytest.raises(ValueError, match="routing 'rr' is not one of"):
        RoutedEmbeddingBagCollectionSharder({"t": "rr"})
