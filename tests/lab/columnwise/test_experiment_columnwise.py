"""embnb.lab.columnwise.experiment: notebook 02's tables and its run of one placement."""

import pytest

from embnb.lab.columnwise import experiment


def test_shard_table_lists_columns_ranks_and_arrival():
    table = experiment.shard_table([1, 0, 0, 1], [1, 3, 2, 2])
    assert list(table.index) == ["s0", "s1", "s2", "s3"]
    assert list(table["columns"]) == ["0..0", "1..3", "4..5", "6..7"]
    # rank 0's s1, s2 arrive first, then rank 1's s0, s3
    assert list(table["arrives at position"]) == [2, 0, 1, 3]


def test_permute_derivation_adds_up_to_the_permute():
    table = experiment.permute_derivation([1, 0, 0, 1])
    assert list(table["shards on lower ranks"]) == [2, 0, 0, 2]
    assert list(table["earlier shards, same rank"]) == [0, 0, 1, 1]
    assert list(table["permute[s]"]) == [2, 0, 1, 3]


def test_a_placement_torchrec_cannot_take_runs_on_embnbs_path_only():
    # 3 shards of 2 columns: torchrec's column_wise() needs multiples of 4
    run = experiment.run_seed(experiment.SeedTable(3, 6, [2, 0, 2], num_embeddings=8), device="cpu")
    results = run.results
    assert "2 columns wide; torchrec's column_wise() needs a multiple of 4" in results.torchrec_skipped
    assert (results.device, results.backend, results.widths) == ("cpu", "gloo", [2, 2, 2])
    assert results.rank_order == [1, 0, 2] and results.permute_indices == [1, 0, 2]
    assert results.torchrec_permute_indices is None
    assert [c["path"] for c in results.checks] == ["naive", "reference"]
    assert results.check("reference")["equals_unsharded"] and not results.check("naive")["equals_unsharded"]
    assert results.check("torchrec") is None
    assert list(run.error_panels()) == ["embnb: naive concatenation in rank order"]  # the exact one is zeros


def test_bad_placements_are_refused_before_any_rank_starts():
    with pytest.raises(ValueError, match="embedding_dim 10 is not divisible into 3 equal shards"):
        experiment.run_seed(experiment.SeedTable(2, 10, [0, 1, 0]), device="cpu")
    with pytest.raises(ValueError, match="device 'gpu' is not one of"):
        experiment.run_seed(experiment.SeedTable(2, 12, [0, 1, 0]), device="gpu")
