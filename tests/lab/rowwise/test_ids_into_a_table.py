"""embnb.lab.rowwise.aliasing: raw ids into a torchrec table, run against the peers."""

import math
from collections import Counter

import pytest

from embnb.data import make_keys
from embnb.lab.rowwise import aliasing
from tests.lab.rowwise.plain_routing import fmix64


def test_the_peers_refuse_an_id_past_the_table_or_read_row_zero():
    runs = aliasing.out_of_range_lookup(10, 2**60)
    assert [r["peer"].split(" ")[0] for r in runs] == ["torchrec", "FBGEMM", "FBGEMM"]
    outcomes = [r["outcome"] for r in runs]
    assert len(outcomes) == 3
    assert outcomes[0].startswith("raised")  # torchrec's EmbeddingBagCollection
    assert outcomes[1].startswith("raised")  # TBE, FATAL
    # TBE, WARNING: returns row 0's values and says so in its C++ log, caught
    # here instead of landing on the notebook's stderr
    returned, logged = outcomes[2].split("; logged: ")
    assert returned == "returned; the bad id's bag equals row 0: True"
    assert f"idx: {2**60}" in logged and "num_rows: 10" in logged
    with pytest.raises(ValueError, match="bad_id must be >= num_rows"):
        aliasing.out_of_range_lookup(10, 9)


def test_pipeline_table_counts_rows_and_collisions_with_plain_ints():
    keys = make_keys("snowflake", 3000, seed=2)
    table = aliasing.pipeline_table(keys, [2**20, 10**6], [4, 6])
    assert len(table) == 2 * 2 * 2 * 2  # sizes x mappings x world sizes x dist_types
    distinct = sorted(set(keys.tolist()))
    for row in table.itertuples():
        rows, hashed = row.table_rows, row.into_table == "hash"

        def to_row(k, rows=rows, hashed=hashed):
            return (fmix64(k) if hashed else k) % rows

        per_row = Counter(to_row(k) for k in distinct)
        assert row.rows_used == len(per_row)
        assert row.ids_sharing_a_row == pytest.approx(
            sum(c for c in per_row.values() if c > 1) / len(distinct)
        )
        assert row.ids_sharing_a_row_random == pytest.approx(
            1 - (1 - 1 / row.table_rows) ** (len(distinct) - 1)
        )
        looked_up = [to_row(k) for k in keys.tolist()]
        if row.dist_type == "continuous":
            block = math.ceil(row.table_rows / row.world_size)
            owners = Counter(r // block for r in looked_up)
        else:
            owners = Counter(r % row.world_size for r in looked_up)
        assert row.max_over_mean == pytest.approx(max(owners.values()) * row.world_size / len(looked_up))
    # a power-of-two table keeps the ids' low bits: snowflake ids share rows
    modulo = table[(table.table_rows == 2**20) & (table.into_table == "modulo")].iloc[0]
    hashed = table[(table.table_rows == 2**20) & (table.into_table == "hash")].iloc[0]
    assert modulo.ids_sharing_a_row > 10 * hashed.ids_sharing_a_row
