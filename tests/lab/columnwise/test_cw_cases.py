"""embnb.lab.columnwise.cases on real ranks: embnb's CW lookup and torchrec's
ShardedEmbeddingCollection against the unsharded EmbeddingCollection, on one table.

The lookups run once, in one launch of 4 gloo ranks (subgroups give world
sizes 1-3): embnb's reference path and torchrec's ShardedEmbeddingCollection
must both equal the unsharded EmbeddingCollection exactly.
"""

import random
import re

import pytest
import torch

from embnb.columnwise.placement import concat_in_rank_order, cw_permute_indices
from embnb.dist import launch_each
from embnb.lab.columnwise import cases
from embnb.lab.columnwise.cases import CWCase


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"shard_ranks": [0, 2]}, r"rank 2 >= world_size 2"),
        ({"shard_ranks": []}, "shard_ranks is empty"),
        ({"shard_ranks": [0, 1], "widths": [5, 6]}, r"widths \[5, 6\] sum to 11, not the embedding_dim 12"),
        ({"shard_ranks": [0, 1, 0, 1, 0]}, "embedding_dim 12 is not divisible into 5"),
        ({"shard_ranks": [0, 1], "paths": ("fast",)}, "each must be 'reference' or 'torchrec'"),
        ({"shard_ranks": [0, 1], "batch_size": 0}, "batch_size must be an int >= 1, got 0"),
        ({"shard_ranks": [0, 1], "max_length": -1}, "max_length must be an int >= 0, got -1"),
        ({"shard_ranks": [0], "num_embeddings": 0}, "num_embeddings must be an int >= 1, got 0"),
    ],
)
def test_bad_cases_are_refused_before_any_rank_starts(kwargs, message):
    with pytest.raises(ValueError, match=message):
        CWCase(**{"world_size": 2, "embedding_dim": 12, **kwargs})


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"shard_ranks": [0, 1], "batch_size": 2.0}, "batch_size must be an int >= 1, got float 2.0"),
        ({"shard_ranks": [0, 1], "max_length": True}, "max_length must be an int >= 0, got bool True"),
        ({"shard_ranks": [0, 1], "world_size": "2"}, "world_size must be an int >= 1, got str '2'"),
        ({"shard_ranks": "01"}, "shard_ranks must be a list with a rank per shard"),
    ],
)
def test_bad_types_in_cases_are_type_errors(kwargs, message):
    with pytest.raises(TypeError, match=message):
        CWCase(**{"world_size": 2, "embedding_dim": 12, **kwargs})


def test_nothing_to_run_is_refused():
    with pytest.raises(ValueError, match="cases is empty"):
        cases.run_cw_cases([])


@pytest.mark.parametrize(
    "case, message",
    [
        (
            CWCase(2, 12, [0, 1], widths=[4, 8]),
            r"uneven widths \{'t0': \[4, 8\]\}: embnb's check refuses them for torchrec",
        ),
        (CWCase(2, 12, [1, 0, 0, 1]), r"3 columns wide; torchrec's column_wise\(\) needs a multiple of 4"),
    ],
)
def test_what_torchrec_cannot_take_is_refused_before_any_rank_starts(case, message):
    # The case itself is fine: embnb's path takes it, torchrec's path does not.
    assert re.search(message, case.torchrec_problem())
    with pytest.raises(ValueError, match=message):
        cases.run_cw_cases([case], timeout_s=1)  # refused in the parent: no launch to time out


# ---------------------------------------------------------------- real ranks

DIM = 48  # 1, 2, 3, 4, 6 shards: widths that are multiples of 4, as torchrec needs


def _random_case(rng: random.Random, world_size: int) -> CWCase:
    """Shard counts whose widths are multiples of 4 (as torchrec needs), ranks with repeats and gaps."""
    num_shards = rng.choice([1, 2, 3, 4, 6])
    ranks = [rng.randrange(world_size) for _ in range(num_shards)]
    return CWCase(
        world_size,
        DIM,
        ranks,
        num_embeddings=rng.randint(3, 20),
        batch_size=rng.randint(1, 4),
        seed=rng.randrange(1000),
    )


def _cases() -> list[CWCase]:
    hand = [
        CWCase(2, DIM, [0, 1, 0], num_embeddings=8),  # the seed example
        CWCase(2, DIM, [1, 0, 0, 1], num_embeddings=8),
        CWCase(1, DIM, [0, 0, 0], num_embeddings=8),
        CWCase(4, DIM, [2], num_embeddings=8),  # one shard, ranks 0, 1, 3 hold nothing
        CWCase(4, DIM, [3, 3, 1, 0, 2, 0], num_embeddings=8),
        CWCase(3, 20, [2, 0, 2, 1, 0], num_embeddings=8),  # five shards of 4 columns
        CWCase(4, DIM, [3, 0], max_length=0),  # no ids at all
        # embnb's own path: uneven widths
        CWCase(3, 12, [2, 0, 2], widths=[1, 8, 3], paths=("reference",)),
        CWCase(4, 10, [3, 1, 3, 0, 1], widths=[3, 1, 2, 2, 2], paths=("reference",)),
    ]
    rng = random.Random(5)  # fixed draws: each spawn costs seconds, so no shrinking search here
    return hand + [_random_case(rng, w) for w in (1, 2, 2, 3, 3, 4, 4, 4)]


@pytest.fixture(scope="module")
def runs():
    return cases.run_cw_cases(_cases(), device="cpu", timeout_s=240)


def test_cases_cover_the_issue(runs):
    cases = [r.case for r in runs]
    assert {c.world_size for c in cases} == {1, 2, 3, 4}
    assert {len(c.shard_ranks) for c in cases} == {1, 2, 3, 4, 5, 6}
    assert any(len(set(c.shard_ranks)) < len(c.shard_ranks) for c in cases)  # repeats
    assert any(set(range(c.world_size)) - set(c.shard_ranks) for c in cases)  # gaps


def test_unsharded_outputs_are_rows_of_the_weights(runs):
    run = runs[0]
    weight = cases.make_embedding_collection(run.case).embeddings["t0"].weight.detach()
    for (lengths, ids), expected in zip(cases.make_batches(run.case), run.expected):
        assert torch.equal(expected[0], lengths) and torch.equal(expected[1], weight[ids])


def test_reference_path_equals_unsharded_exactly(runs):
    assert [r.matches("reference") for r in runs] == [True] * len(runs)


def test_torchrec_sharded_collection_equals_unsharded_exactly(runs):
    torchrec_runs = [r for r in runs if "torchrec" in r.case.paths]
    assert len(torchrec_runs) >= 10
    assert [r.matches("torchrec") for r in torchrec_runs] == [True] * len(torchrec_runs)
    # the kernel torchrec's sharded module built (its batched modules' config), on each rank holding a
    # shard; a rank holding none built none
    kernels = [
        (rank.compute_kernels, r in run.case.shard_ranks)
        for run in torchrec_runs
        for r, rank in enumerate(run.ranks)
    ]
    assert all(built == (["fused"] if holds else []) for built, holds in kernels)
    assert {holds for _, holds in kernels} == {True, False}


def test_permute_indices_equal_torchrecs(runs):
    for run in runs:
        if "torchrec" in run.case.paths:
            ours = cw_permute_indices(list(run.case.shard_ranks))
            assert all(rank.torchrec_permute == ours for rank in run.ranks), run.case


def test_naive_concatenation_is_wrong_exactly_when_ranks_are_unsorted(runs):
    checked = 0
    for run in runs:
        ranks = list(run.case.shard_ranks)
        for got, want in zip(run.ranks, run.expected):
            if want[1].numel() == 0:
                continue  # no ids: every stitching is right
            naive = concat_in_rank_order(got.rank_ordered)
            assert torch.equal(naive, want[1]) == (ranks == sorted(ranks)), run.case
            checked += 1
    assert checked > 20
    assert not runs[0].matches("naive") and runs[0].max_abs_error("naive") > 0


def test_abs_errors_have_a_row_per_looked_up_id(runs):
    run = runs[1]  # shard_ranks [1, 0, 0, 1]: unsorted, so naive concatenation is wrong
    naive = run.abs_errors("naive")
    assert naive.shape == (sum(len(want[1]) for want in run.expected), DIM)
    assert float(naive.max()) == run.max_abs_error("naive") > 0
    assert not run.abs_errors("reference").any() and not run.abs_errors("torchrec").any()
    with pytest.raises(ValueError, match="path 'fast' is not one of"):
        run.abs_errors("fast")


def test_torchrec_without_its_permute_returns_the_rank_order_concatenation(runs):
    checked = 0
    for run in runs:
        if run.case.paths != ("reference", "torchrec"):
            continue
        ranks = list(run.case.shard_ranks)
        for got, want in zip(run.ranks, run.expected):
            unpermuted = got.torchrec_unpermuted[1]
            # embnb's stand-in for the bug and torchrec's own output without its fix agree exactly
            assert torch.equal(unpermuted, concat_in_rank_order(got.rank_ordered)), run.case
            if want[1].numel():
                assert torch.equal(unpermuted, want[1]) == (ranks == sorted(ranks)), run.case
                checked += 1
    assert checked > 20
    assert not runs[0].matches("torchrec_unpermuted") and runs[0].matches(
        "torchrec"
    )  # the permute is restored


def test_traffic_is_counted_from_the_batches(runs):
    """embnb sends each destination a count, then a rank's ids once per owner rank; torchrec sends ids
    and lengths once per shard, plus split counts per destination that grow with neither shards nor
    ids; both get every looked-up id's full row back."""
    checked, torchrec_splits = 0, set()
    for run in runs:
        case = run.case
        if case.paths != ("reference", "torchrec"):
            continue
        ids = [len(ids) for _, ids in cases.make_batches(case)]
        embnb, torchrec, world = run.traffic("reference"), run.traffic("torchrec"), case.world_size
        owners = len(set(case.shard_ranks))
        assert [r["int_elements"] for r in embnb] == [world + owners * n for n in ids], case
        if world > 1:  # at one rank torchrec calls no collective
            for sent, n in zip(torchrec, ids):
                ids_and_lengths = len(case.shard_ranks) * (n + case.batch_size)
                torchrec_splits.add((sent["int_elements"] - ids_and_lengths) / world)
        for sent in (embnb, torchrec) if world > 1 else (embnb,):
            assert sum(r["float_elements"] for r in sent) == sum(ids) * case.embedding_dim, case
        checked += 1
    assert checked >= 5
    assert len(torchrec_splits) == 1 and torchrec_splits.pop() in {2, 3, 4}  # per destination, every case
    with pytest.raises(ValueError, match="path 'naive' is not one of 'reference', 'torchrec'"):
        runs[0].traffic("naive")


def test_the_recorder_puts_all_to_all_back_whatever_happens():
    import torch.distributed as dist

    from embnb.lab.columnwise.cases import recorded_all_to_all

    original = dist.all_to_all_single
    with pytest.raises(RuntimeError, match="boom"):
        with recorded_all_to_all():
            assert dist.all_to_all_single is not original
            raise RuntimeError("boom")
    assert dist.all_to_all_single is original


@pytest.fixture(scope="module")
def size_per_rank_outcomes():
    case, sizes = CWCase(2, 48, [0, 1]), [(24, 24), (16, 32)]  # one launch, the failing one last
    calls = [cases.size_per_rank_call(case, list(s)) for s in sizes]
    return dict(zip(sizes, launch_each(calls, 2, device="cpu", timeout_s=120)))


def test_torchrec_size_per_rank_equal_widths_are_exact(size_per_rank_outcomes):
    outcomes = size_per_rank_outcomes[(24, 24)]
    assert [(o.error, o.matches, o.max_abs_error) for o in outcomes] == [(None, True, 0.0)] * 2
    assert [(o.own_width, o.local_embedding_dim) for o in outcomes] == [(24, 24)] * 2


def test_torchrec_size_per_rank_uneven_widths_are_reported_as_torchrec_raises(size_per_rank_outcomes):
    outcomes = size_per_rank_outcomes[(16, 32)]
    assert len(outcomes) == 2 and not any(o.matches for o in outcomes)
    # torchrec's EC views every rank's lookups as its first CW shard's width (16): rank 1 holds 32
    assert [(o.own_width, o.local_embedding_dim) for o in outcomes] == [(16, 16), (32, 16)]
    errors = [o.error for o in outcomes if o.error is not None]
    assert errors and all(e.split(":")[0].endswith("Error") and len(e) <= 230 for e in errors)
    # where torchrec raised, named by its own source file (the output all-to-all on this version)
    assert all(o.raised_in.startswith("torchrec/distributed/") for o in outcomes if o.error)


@pytest.mark.parametrize(
    "sizes, message",
    [
        ([16, 16], r"size_per_rank \[16, 16\] must cover embedding_dim 48"),
        ([16, 16, 16], r"size_per_rank \[16, 16, 16\] puts shard i on rank i: needs 3 ranks, has 2"),
        ([48, 0], "size_per_rank entry must be an int >= 1, got 0"),
    ],
)
def test_bad_size_per_rank_is_refused_before_any_rank_starts(sizes, message):
    with pytest.raises(ValueError, match=message):
        cases.size_per_rank_call(CWCase(2, 48, [0, 1]), sizes)
