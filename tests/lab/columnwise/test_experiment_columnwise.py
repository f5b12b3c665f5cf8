"""embnb.lab.columnwise.experiment: notebook 02's tables and its run of one placement."""

import pytest

from embnb.lab.columnwise import experiment
from embnb.lab.columnwise.cases import CWCase


def test_shard_table_lists_columns_ranks_and_the_permute_with_its_two_parts():
    table = experiment.shard_table([1, 0, 0, 1], [1, 3, 2, 2])
    assert list(table.index) == ["s0", "s1", "s2", "s3"]
    assert list(table["columns"]) == ["0..0", "1..3", "4..5", "6..7"]
    assert list(table["shards on lower ranks"]) == [2, 0, 0, 2]
    assert list(table["earlier shards, same rank"]) == [0, 0, 1, 1]
    # rank 0's s1, s2 arrive first, then rank 1's s0, s3
    assert list(table["permute[s]"]) == [2, 0, 1, 3]


def test_a_placement_torchrec_cannot_take_runs_on_embnbs_path_only():
    # 3 shards of 2 columns: torchrec's column_wise() needs multiples of 4
    results, run = experiment.run_seed(CWCase(3, 6, [2, 0, 2], num_embeddings=8), device="cpu")
    assert "2 columns wide; torchrec's column_wise() needs a multiple of 4" in results["torchrec_skipped"]
    assert (results["device"], results["backend"], results["widths"]) == ("cpu", "gloo", [2, 2, 2])
    assert results["rank_order"] == [1, 0, 2] and results["permute_indices"] == [1, 0, 2]
    assert results["torchrec_permute_indices"] is None
    checks = {c["path"]: c["equals_unsharded"] for c in results["checks"]}
    assert checks == {"naive": False, "reference": True}  # torchrec's paths did not run
    panels = experiment.error_panels(results, run)
    assert list(panels) == ["embnb: naive concatenation in rank order"]  # the exact one is zeros


def test_bad_placements_are_refused_before_any_rank_starts():
    with pytest.raises(ValueError, match="embedding_dim 10 is not divisible into 3 equal shards"):
        experiment.run_seed(CWCase(2, 10, [0, 1, 0]), device="cpu")
    with pytest.raises(ValueError, match="device 'gpu' is not one of"):
        experiment.run_seed(CWCase(2, 12, [0, 1, 0]), device="gpu")
