"""Column-wise sharding: permute indices, stitching, and real CW lookups.

Pure functions are checked with hypothesis against definitions written out
here and against torchrec's own permute code. The lookups run once, in one
launch of 4 gloo ranks (subgroups give world sizes 1-3): embnb's reference
path and torchrec's ShardedEmbeddingCollection must both equal the unsharded
EmbeddingCollection exactly.
"""

import random
from types import SimpleNamespace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torchrec import EmbeddingConfig
from torchrec.distributed.embedding import ShardedEmbeddingCollection
from torchrec.distributed.types import ParameterSharding

from embnb.columnwise import sharding
from embnb.columnwise.sharding import CWCase, TableSpec

# ---------------------------------------------------------------- pure functions


@st.composite
def placements(draw, max_world_size=4, max_shards=6):
    world_size = draw(st.integers(1, max_world_size))
    ranks = draw(st.lists(st.integers(0, world_size - 1), min_size=1, max_size=max_shards))
    return world_size, ranks


def expected_permute(ranks):
    """Shard s lands after every shard on a lower rank and every earlier shard on its rank."""
    return [
        sum(r < ranks[s] for r in ranks) + sum(ranks[t] == ranks[s] for t in range(s))
        for s in range(len(ranks))
    ]


def torchrec_permute(ranks):
    """torchrec's own permute code, on a plan with one CW table."""
    holder = SimpleNamespace(_features_to_permute_indices={})
    config = EmbeddingConfig(name="t0", embedding_dim=len(ranks), num_embeddings=4, feature_names=["f0"])
    plan = {"t0": ParameterSharding(sharding_type="column_wise", compute_kernel="fused", ranks=list(ranks))}
    ShardedEmbeddingCollection._generate_permute_indices_per_feature(holder, [config], plan)
    return holder._features_to_permute_indices["f0"]


def test_seed_example():
    assert sharding.cw_permute_indices([0, 1, 0]) == [0, 2, 1]
    assert sharding.rank_order([0, 1, 0]) == [0, 2, 1]
    # [0, 1, 0] hides that the permute is the inverse of the arrival order:
    assert sharding.cw_permute_indices([1, 0, 0, 1]) == [2, 0, 1, 3]
    assert sharding.rank_order([1, 0, 0, 1]) == [1, 2, 0, 3]


@settings(deadline=None)  # CI machines are shared; timing is not what is tested
@given(placements())
def test_permute_matches_definition_and_torchrec(placement):
    world_size, ranks = placement
    permute = sharding.cw_permute_indices(ranks, world_size)
    assert permute == expected_permute(ranks) == torchrec_permute(ranks)
    order = sharding.rank_order(ranks)
    assert [order[p] for p in permute] == list(range(len(ranks)))  # inverses
    assert (permute == list(range(len(ranks)))) == (ranks == sorted(ranks))


@st.composite
def sharded_rows(draw):
    world_size, ranks = draw(placements())
    widths = draw(st.lists(st.integers(1, 4), min_size=len(ranks), max_size=len(ranks)))
    num_rows = draw(st.integers(0, 3))
    return world_size, ranks, widths, num_rows


@settings(deadline=None)
@given(sharded_rows())
def test_stitch_undoes_rank_order_for_any_widths(case):
    world_size, ranks, widths, num_rows = case
    dim = sum(widths)
    rows = torch.arange(num_rows * dim, dtype=torch.float32).view(num_rows, dim)
    shards = torch.split(rows, widths, dim=1)
    # What ranks send back: rank 0's shards in column order, then rank 1's, ...
    arrived = [shards[s] for r in range(world_size) for s in range(len(ranks)) if ranks[s] == r]
    assert [
        torch.equal(a, b) for a, b in zip(arrived, sharding.rank_ordered_shard_outputs(rows, ranks, widths))
    ] == [True] * len(ranks)
    assert torch.equal(sharding.stitch_cw(arrived, ranks), rows)
    if num_rows:  # distinct values: naive concatenation is right only for sorted ranks
        assert torch.equal(sharding.concat_in_rank_order(arrived), rows) == (ranks == sorted(ranks))


@pytest.mark.parametrize(
    "call, message",
    [
        (
            lambda: sharding.cw_permute_indices([0, 4, 0], world_size=4),
            r"shard_ranks \[0, 4, 0\] has rank 4 >= world_size 4; ranks must be in 0..3",
        ),
        (lambda: sharding.cw_permute_indices([]), "shard_ranks is empty"),
        (lambda: sharding.cw_permute_indices([0, -1]), r"has -1: ranks must be ints >= 0"),
        (lambda: sharding.cw_permute_indices("010"), "must be a list of ranks, got '010'"),
        (
            lambda: sharding.check_widths([4, 4, 3], 12, 3),
            r"widths \[4, 4, 3\] sum to 11, not the embedding_dim 12",
        ),
        (lambda: sharding.check_widths([6, 6], 12, 3), r"widths \[6, 6\] has 2 entries for 3 shards"),
        (lambda: sharding.check_widths([12, 0], 12), r"has 0: each shard needs an int >= 1"),
        (lambda: sharding.equal_widths(10, 3), "embedding_dim 10 is not divisible into 3 equal shards"),
        (
            lambda: sharding.stitch_cw([torch.zeros(2, 1)] * 2, [0, 1, 0]),
            r"got 2 shard outputs for shard_ranks \[0, 1, 0\] \(3 shards\)",
        ),
        (lambda: sharding.compute_kernel_for("tpu"), "device_type 'tpu' is not one of"),
        (lambda: sharding.resolve_device("gpu", 2), "device 'gpu' is not one of"),
        (lambda: sharding.run_cw_cases([]), "cases is empty"),
    ],
)
def test_bad_input_is_named(call, message):
    with pytest.raises(ValueError, match=message):
        call()


T0 = (TableSpec("t0", 8, ("f0",)),)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"placements": {"t0": [0, 2]}}, r"rank 2 >= world_size 2"),
        ({"placements": {"t0": []}}, "shard_ranks is empty"),
        ({"placements": {"t1": [0]}}, r"placements name tables \['t1'\]; tables are \['t0'\]"),
        (
            {"placements": {"t0": [0, 1]}, "widths": {"t0": [5, 6]}},
            r"widths \[5, 6\] sum to 11, not the embedding_dim 12",
        ),
        (
            {"placements": {"t0": [0, 1]}, "widths": {"t0": [4, 8]}},
            r"uneven widths \{'t0': \[4, 8\]\}: torchrec's ShardedEmbeddingCollection cuts equal widths only",
        ),
        ({"placements": {"t0": [0, 1, 0, 1, 0]}}, "embedding_dim 12 is not divisible into 5"),
        ({"placements": {"t0": [0, 1]}, "paths": ("fast",)}, "each must be 'reference' or 'torchrec'"),
        ({"placements": {"t0": [0, 1]}, "batch_size": 0}, "batch_size must be an int >= 1, got 0"),
        (
            {"placements": {"t0": [0]}, "tables": (TableSpec("t0", 0, ("f0",)),)},
            "t0.num_embeddings must be an int >= 1, got 0",
        ),
    ],
)
def test_bad_cases_are_refused_before_any_rank_starts(kwargs, message):
    with pytest.raises(ValueError, match=message):
        CWCase(**{"world_size": 2, "embedding_dim": 12, "tables": T0, **kwargs})


def test_torchrec_path_refuses_mixed_shard_widths():
    # torchrec's EC views every CW lookup with the first table's shard width:
    # other widths assert on some ranks and leave the others hanging.
    tables = (TableSpec("t0", 8, ("f0",)), TableSpec("t1", 8, ("f1",)))
    with pytest.raises(
        ValueError, match=r"one shard width for all column-wise tables; got widths \{'t0': 8, 't1': 12\}"
    ):
        CWCase(2, 24, tables, {"t0": [0, 1, 0], "t1": [1, 0]})
    CWCase(2, 24, tables, {"t0": [0, 1, 0], "t1": [1, 0]}, paths=("reference",))  # embnb's path takes it


def test_torchrec_column_wise_helper_drops_shards_we_refuse():
    from torchrec import EmbeddingCollection
    from torchrec.distributed.sharding_plan import column_wise, construct_module_sharding_plan

    ec = EmbeddingCollection(
        tables=[EmbeddingConfig(name="t0", embedding_dim=12, num_embeddings=4, feature_names=["f0"])]
    )
    # Four shards of 3 columns: torchrec rounds the width to 4 and keeps 3 shards,
    # silently dropping rank 1's second shard.
    plan = construct_module_sharding_plan(
        ec, {"t0": column_wise(ranks=[1, 0, 0, 1])}, local_size=2, world_size=2, device_type="cpu"
    )
    assert plan["t0"].ranks == [1, 0, 0]
    with pytest.raises(
        ValueError,
        match=r"4 shards of embedding_dim 12 are 3 columns wide; "
        r"torchrec's column_wise\(\) needs a multiple of 4 \(it would make 3 shards",
    ):
        sharding.cw_sharding_plan(ec, {"t0": [1, 0, 0, 1]}, 2, "cpu")
    assert sharding.cw_sharding_plan(ec, {"t0": [1, 0, 1]}, 2, "cpu")["t0"].compute_kernel == "fused"


def test_kernel_per_device():
    # "dense" crashes ShardedEmbeddingCollection on CPU/gloo (DESIGN.md).
    assert sharding.compute_kernel_for("cpu") == "fused"
    assert sharding.backend_for("cpu") == "gloo" and sharding.backend_for("cuda") == "nccl"


# ---------------------------------------------------------------- real ranks

DIM = 48  # 1, 2, 3, 4, 6 shards: widths that are multiples of 4, as torchrec needs


def _random_case(rng: random.Random, world_size: int) -> CWCase:
    """1-3 tables, shared features sometimes, every table with the same shard
    count (torchrec's EC needs one shard width), ranks with repeats and gaps."""
    num_shards = rng.choice([1, 2, 3, 4, 6])
    num_tables = rng.randint(1, 3)
    features = [f"f{i}" for i in range(rng.randint(1, 3))]
    tables = tuple(
        TableSpec(f"t{i}", rng.randint(3, 20), tuple(rng.sample(features, rng.randint(1, len(features)))))
        for i in range(num_tables)
    )
    placements = {t.name: [rng.randrange(world_size) for _ in range(num_shards)] for t in tables}
    return CWCase(world_size, DIM, tables, placements, batch_size=rng.randint(1, 4), seed=rng.randrange(1000))


def _cases() -> list[CWCase]:
    tables2 = (TableSpec("t0", 10, ("f0", "f1")), TableSpec("t1", 7, ("f1", "f2")))
    hand = [
        CWCase(2, DIM, T0, {"t0": [0, 1, 0]}),  # the seed example
        CWCase(2, DIM, T0, {"t0": [1, 0, 0, 1]}),
        CWCase(1, DIM, T0, {"t0": [0, 0, 0]}),
        CWCase(4, DIM, T0, {"t0": [2]}),  # one shard, ranks 0, 1, 3 hold nothing
        CWCase(4, DIM, T0, {"t0": [3, 3, 1, 0, 2, 0]}),
        CWCase(3, 20, T0, {"t0": [2, 0, 2, 1, 0]}),  # five shards of 4 columns
        CWCase(3, DIM, tables2, {"t0": [2, 0, 2], "t1": [1, 1, 0]}),  # gap: rank 1 in t0; f1 shared
        CWCase(4, DIM, tables2, {"t0": [3, 0], "t1": [0, 3]}, max_length=0),  # no ids at all
        # embnb's own path: uneven widths, a different shard count per table
        CWCase(
            3,
            12,
            tables2,
            {"t0": [2, 0, 2], "t1": [1, 0]},
            widths={"t0": [1, 8, 3], "t1": [5, 7]},
            paths=("reference",),
        ),
        CWCase(4, 10, T0, {"t0": [3, 1, 3, 0, 1]}, widths={"t0": [3, 1, 2, 2, 2]}, paths=("reference",)),
    ]
    rng = random.Random(5)  # fixed draws: each spawn costs seconds, so no shrinking search here
    return hand + [_random_case(rng, w) for w in (1, 2, 2, 3, 3, 4, 4, 4)]


@pytest.fixture(scope="module")
def runs():
    return sharding.run_cw_cases(_cases(), device="cpu", timeout_s=240)


def test_cases_cover_the_issue(runs):
    cases = [r.case for r in runs]
    assert {c.world_size for c in cases} == {1, 2, 3, 4}
    assert {len(p) for c in cases for p in c.placements.values()} == {1, 2, 3, 4, 5, 6}
    assert any(len(set(p)) < len(p) for c in cases for p in c.placements.values())  # repeats
    assert any(set(range(c.world_size)) - set(p) for c in cases for p in c.placements.values())  # gaps
    assert any("@" in name for c in cases for name in c.output_tables())  # shared features
    assert any(len(c.tables) > 1 for c in cases)


def test_unsharded_outputs_are_rows_of_the_weights(runs):
    run = runs[0]
    ec = sharding.make_embedding_collection(run.case)
    weight = ec.embeddings["t0"].weight.detach()
    for batch, expected in zip(sharding.make_batches(run.case), run.expected):
        lengths, ids = batch["f0"]
        assert torch.equal(expected["f0"][0], lengths) and torch.equal(expected["f0"][1], weight[ids])


def test_reference_path_equals_unsharded_exactly(runs):
    assert [r.reference_matches() for r in runs] == [True] * len(runs)


def test_torchrec_sharded_collection_equals_unsharded_exactly(runs):
    torchrec_runs = [r for r in runs if "torchrec" in r.case.paths]
    assert len(torchrec_runs) >= 10
    assert [r.torchrec_matches() for r in torchrec_runs] == [True] * len(torchrec_runs)
    assert {rank["compute_kernel"] for r in torchrec_runs for rank in r.ranks} == {"fused"}


def test_permute_indices_equal_torchrecs(runs):
    for run in runs:
        if "torchrec" not in run.case.paths:
            continue
        ours = {
            name: sharding.cw_permute_indices(run.case.placements[table])
            for name, table in run.case.output_tables().items()
        }
        for rank in run.ranks:
            assert rank["torchrec_permute"] == ours, run.case


def test_naive_concatenation_is_wrong_exactly_when_ranks_are_unsorted(runs):
    checked = 0
    for run in runs:
        for name, table in run.case.output_tables().items():
            ranks = run.case.placements[table]
            for got, want in zip(run.ranks, run.expected):
                if want[name][1].numel() == 0:
                    continue  # no ids: every stitching is right
                naive = sharding.concat_in_rank_order(got["rank_ordered"][name])
                assert torch.equal(naive, want[name][1]) == (ranks == sorted(ranks)), (run.case, name)
                checked += 1
    assert checked > 20
    assert not runs[0].naive_matches() and runs[0].max_abs_error("naive") > 0
