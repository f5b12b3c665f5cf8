"""`python -m embnb.bench routing` at tiny sizes: its acceptance check recomputed from the raw times, each
rank's ids and distinct rows against the routings' arithmetic on the stream, its correlations against
numpy's; `follows`' rule against cases worked by hand. No speed is asserted."""

from __future__ import annotations

import json

import numpy as np
import pytest

from embnb.bench.__main__ import main
from embnb.bench.routing import follows, pearson
from embnb.lab.rowwise.routed_loads import case_ids
from embnb.rowwise import TableLayout
from embnb.scaling import NOT_COMPARED
from tests.test_bench_acceptance import _recheck

W, ROWS, DIM, BAG, BATCH = 4, 4096, 16, 8, 32
TINY = ["--world-size", str(W), "--rows", str(ROWS), "--dim", str(DIM), "--bag-size", str(BAG)]
TINY += ["--batch-size", str(BATCH), "--repeats", "2"]
# a comparison wherever the fitted fixed cost is below the measured time, over 8x the work: the
# comparison is tested, not the verdict (as tests/steptime/test_bench_steptime.py does)
COMPARE = ["--max-fixed-share", "1", "--sweep-factors", "1", "8"]


def _run(tmp_path, *extra: str) -> dict:
    assert main(["routing", *TINY, "--out", str(tmp_path), *extra]) == 0
    (path,) = tmp_path.glob("routing-*.json")
    return json.loads(path.read_text())


def _owners(stream: str, routing: str, batch: int) -> tuple[np.ndarray, np.ndarray]:
    """The stream's ids at `batch` bags per rank and each one's rank: continuous by torchrec's blocks,
    roundrobin by id % W, feistel_roundrobin by the layout's slots (their block)."""
    ids = case_ids(stream, W * batch * BAG, ROWS, 8, 1.05, seed=0)
    if routing == "continuous":
        return ids.numpy(), ids.numpy() // -(-ROWS // W)
    if routing == "roundrobin":
        return ids.numpy(), ids.numpy() % W
    return ids.numpy(), TableLayout(ROWS, W, routing).owner(ids).numpy()


def test_follows_by_hand():
    # times [1, 3, 2] against [1, 2, 3]: deviations (-1, 1, 0) and (-1, 0, 1): r = 1 / sqrt(2 * 2) = 0.5
    assert pearson([1.0, 3.0, 2.0], [1, 2, 3]) == pytest.approx(0.5)
    assert pearson([1.0, 1.0, 1.0], [1, 2, 3]) is None and pearson([1.0, 2.0], [5, 5]) is None
    # distinct rows r = 1; ids r = 0.5, r**2 = 0.25 < 0.8: the time follows the distinct rows
    got = follows([1.0, 3.0, 2.0], [1, 2, 3], [1, 3, 2])
    assert got["pearson_time_ids"] == pytest.approx(0.5) and got["follows"] == "distinct rows"
    # rows [1, 2, 4, 3] against times [2, 4, 6, 8]: cov 8 over sqrt(5 * 20) = 0.8, r**2 = 0.64: ids
    got = follows([2.0, 4.0, 6.0, 8.0], [1, 2, 3, 4], [1, 2, 4, 3])
    assert got["pearson_time_distinct_rows"] == pytest.approx(0.8) and got["follows"] == "ids"
    # ids [1, 2, 3, 5]: r = 6.5 / sqrt(8.75 * 5) = 0.983, r**2 = 0.966, 1 - r**2 = 0.034; rows r = 1
    # leaves 0, at most half of 0.034: the distinct rows
    got = follows([1.0, 2.0, 3.0, 4.0], [1, 2, 3, 5], [1, 2, 3, 4])
    assert got["pearson_time_ids"] == pytest.approx(6.5 / 43.75**0.5) and got["follows"] == "distinct rows"
    # ids and rows alike: both explain the time equally
    assert follows([1.0, 2.0, 3.0, 4.0], [1, 2, 3, 4], [2, 4, 6, 8])["follows"] == "not told apart"
    # times [1, 2, 1, 2] against [1, 2, 3, 4]: cov 1 over sqrt(1 * 5), r**2 = 0.2; a negative r explains
    # nothing either
    assert follows([1.0, 2.0, 1.0, 2.0], [1, 2, 3, 4], [4, 3, 2, 1])["follows"] == "neither"
    # one side constant: its r is None, the other decides
    assert follows([1.0, 2.0, 3.0], [5, 5, 5], [1, 2, 3]) == {
        "pearson_time_ids": None,
        "pearson_time_distinct_rows": pytest.approx(1.0),
        "follows": "distinct rows",
    }


def test_routing_bench_checks_then_compares_each_case(tmp_path, capsys):
    payload = _run(tmp_path, *COMPARE)
    assert payload["options"]["rows"] == ROWS and payload["clock"] == "thread" and payload["threads"] == 1
    assert payload["cut_by_deadline"] == [] and payload["copy_bandwidth_bytes_per_s"] > 0
    cases = payload["cases"]
    assert [(c["stream"], c["routing"]) for c in cases] == [
        (s, r)
        for s in ("frequency", "strided", "hashed")
        for r in ("continuous", "roundrobin", "feistel_roundrobin")
    ]
    compared = 0
    for case in cases:
        check = case["acceptance"]
        _recheck(check, 1.0)
        assert check["unit"] == "bytes" and check["batches"] == [BATCH, 8 * BATCH]
        assert check["reference_rate"] == payload["copy_bandwidth_bytes_per_s"]
        # the busiest rank: the most ids at the largest batch; it reads each id's row of DIM fp32
        _, owners = _owners(case["stream"], case["routing"], 8 * BATCH)
        counts = np.bincount(owners, minlength=W)
        assert case["busiest_rank"] == int(counts.argmax())
        for batch, num_ids, work in zip(check["batches"], check["num_ids"], check["work"]):
            _, owners = _owners(case["stream"], case["routing"], batch)
            assert num_ids == int((owners == case["busiest_rank"]).sum()) and work == num_ids * DIM * 4
        assert f"{case['stream']}/{case['routing']}" in payload["summary"]
        if case["chosen_batch"] is None:
            assert case["verdict"] == NOT_COMPARED and case["ranks"] == [] and "follows" not in case
            continue
        compared += 1
        ids, owners = _owners(case["stream"], case["routing"], case["chosen_batch"])
        ranks = case["ranks"]
        assert [r["ids"] for r in ranks] == np.bincount(owners, minlength=W).tolist()
        assert [r["distinct_rows"] for r in ranks] == [len(np.unique(ids[owners == r])) for r in range(W)]
        assert [r["bytes_read"] for r in ranks] == [r["ids"] * DIM * 4 for r in ranks]
        for r in ranks:
            assert len(r["seconds"]) == 2 and r["median_s"] == pytest.approx(np.median(r["seconds"]))
        medians = [r["median_s"] for r in ranks]
        for key, column in (("pearson_time_ids", "ids"), ("pearson_time_distinct_rows", "distinct_rows")):
            values = [r[column] for r in ranks]
            want = None if len(set(values)) < 2 else np.corrcoef(medians, values)[0, 1]
            assert case[key] == (None if want is None else pytest.approx(want))
        assert (
            case["follows"]
            == follows(medians, [r["ids"] for r in ranks], [r["distinct_rows"] for r in ranks])["follows"]
        )
        assert case["slowest_rank"] == int(np.argmax(medians)) and case["follows"] in payload["summary"]
    assert compared, "no case compared: the comparison's path did not run"
    assert "copy bandwidth" in capsys.readouterr().out


def test_routing_bench_at_its_own_limit_whatever_the_verdict(tmp_path):
    payload = _run(tmp_path, "--streams", "strided", "--routings", "roundrobin", "--deadline-s", "1e-9")
    # the deadline passed before the first case: nothing measured, the case named as cut
    assert payload["cases"] == [] and payload["cut_by_deadline"] == [
        {"stream": "strided", "routing": "roundrobin"}
    ]
    (tmp_path / "again").mkdir()
    (case,) = _run(tmp_path / "again", "--streams", "strided", "--routings", "roundrobin")["cases"]
    _recheck(case["acceptance"], 0.2)
    assert case["acceptance"]["batches"] == [BATCH, 4 * BATCH, 16 * BATCH]
    assert case["busiest_rank"] == 0  # stride 8 at W = 4: every id is a multiple of 4
    assert (case["ranks"] == []) == (case["chosen_batch"] is None)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--world-size", "1"], "--world-size must be >= 2"),
        (["--rows", "2", "--world-size", "4"], "--rows must be >= --world-size and --stride, got 2"),
        (["--dim", "0"], "--dim must be >= 1, got 0"),
        (["--zipf-alpha", "0"], "--zipf-alpha and --deadline-s > 0"),
        (["--streams", "zipf"], "invalid choice: 'zipf'"),
        (["--sweep-factors", "4"], "--sweep-factors needs two different factors"),
    ],
)
def test_routing_bench_refuses_bad_options(argv, message, tmp_path, capsys):
    try:
        code = main(["routing", "--out", str(tmp_path), *argv])
    except SystemExit as stop:  # argparse
        code = stop.code
    assert code == 2 and message in capsys.readouterr().err
    assert not list(tmp_path.glob("*.json"))
