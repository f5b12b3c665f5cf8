"""`python -m embnb.bench sharders` on tiny sizes: the JSON holds every module's rounds, and each
ratio is the routed module's rounds over torchrec's, paired round by round (no timing asserted)."""

from __future__ import annotations

import json

import pytest

from embnb.bench.__main__ import main
from embnb.timing import paired_ratio


def test_sharders_bench_ratios_pair_the_rounds_it_wrote(tmp_path):
    args = ["--world-size", "2", "--rows", "1000", "--batch", "8", "--repeats", "3", "--warmup", "1"]
    assert main(["sharders", *args, "--out", str(tmp_path)]) == 0
    (path,) = tmp_path.glob("sharders-*.json")
    data = json.loads(path.read_text())
    seconds = data["seconds"]
    assert set(seconds) == {"torchrec", "roundrobin", "feistel_roundrobin"}
    assert all(len(rounds) == 3 and min(rounds) > 0 for rounds in seconds.values())
    for routing, ratio in data["ratio_to_torchrec"].items():
        assert ratio == paired_ratio(seconds[routing], seconds["torchrec"]).as_dict()
    assert data["world_size"] == 2 and data["ids_per_rank"] == 8 * 16 * 2


def test_sharders_bench_refuses_one_rank(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["sharders", "--world-size", "1", "--no-write"])
    assert exit_.value.code == 2
    assert "--world-size must be at least 2, got 1" in capsys.readouterr().err
