"""The acceptance check in `python -m embnb.bench hstu` and `balancer` (issue #70), real CPU runs at
tiny sizes: whatever the verdict, the results JSON carries the sweep, its fit and achieved rate, and
compares methods only at the batch the check chose. The fit, shares and chosen batch are recomputed
from the JSON's raw times with numpy's least squares; the work from the batches' lengths."""

import json

import numpy as np
import pytest

from embnb.balancing.hstu import hstu_flops
from embnb.bench.__main__ import main
from embnb.data import zipf_lengths
from embnb.scaling import NOT_COMPARED


def _recheck(check: dict, limit: float) -> None:
    """The check's numbers, recomputed from its raw times: medians, the least-squares line, the
    fixed shares and the smallest batch under the limit."""
    medians = [float(np.median(s)) for s in check["seconds"]]
    slope, intercept = np.polyfit(check["work"], medians, 1)
    assert check["median_s"] == pytest.approx(medians)
    assert check["fit"]["fixed_s"] == pytest.approx(intercept, rel=1e-6, abs=1e-12)
    assert check["fit"]["per_work_s"] == pytest.approx(slope, rel=1e-6, abs=1e-24)
    shares = [intercept / t for t in medians]
    assert check["fixed_share"] == pytest.approx(shares, rel=1e-6, abs=1e-9)
    assert check["achieved_rate"] == pytest.approx([w / t for w, t in zip(check["work"], medians)])
    passing = [b for b, s in zip(check["batches"], shares) if s <= limit]
    assert check["max_fixed_share"] == limit
    assert check["chosen_batch"] == (passing[0] if passing else None)
    assert check["verdict"] == (f"compared at batch {passing[0]}" if passing else NOT_COMPARED)


def _hstu(tmp_path, *extra):
    argv = ["hstu", "--world-sizes", "2", "--sweep-widths", "16", "--sweep-world-size", "2", "--layers", "1"]
    assert main([*argv, "--repeats", "2", "--device", "cpu", "--out", str(tmp_path), *extra]) == 0
    (path,) = tmp_path.glob("hstu-*.json")
    return json.loads(path.read_text())


def test_the_hstu_bench_checks_each_case_by_a_batch_sweep_before_comparing(tmp_path, capsys):
    payload = _hstu(tmp_path)
    config = payload["config"]
    assert config["sweep_factors"] == [1, 4, 16] and config["max_fixed_share"] == 0.10
    base = config["samples_per_rank"]
    for world in payload["worlds"]:
        check, w = world["acceptance"], world["world_size"]
        assert check["unit"] == "flops" and check["batches"] == [base, 4 * base, 16 * base]
        _recheck(check, 0.10)
        # the work: 3x the forward FLOPs of the loader's cut's heaviest rank (b consecutive samples)
        for f, b, work in zip((1, 4, 16), check["batches"], check["work"]):
            lengths = zipf_lengths(w * b, config["zipf_alpha"], config["max_length"], seed=w * f)
            flops = hstu_flops(lengths, world["width"], config["layers"]).reshape(w, b).sum(1)
            assert work == pytest.approx(3 * float(flops.max()))
        if check["chosen_batch"] is None:  # overhead-bound: no speed-up, no step reported
            assert (
                world["verdict"] == NOT_COMPARED and world["runs"] == [] and world["samples_per_rank"] is None
            )
        else:
            chosen = check["chosen_batch"]
            f = (1, 4, 16)[check["batches"].index(chosen)]
            lengths = zipf_lengths(w * chosen, config["zipf_alpha"], config["max_length"], seed=w * f)
            assert world["samples_per_rank"] == chosen
            assert sum(world["runs"][0]["rank_tokens"]) == int(lengths.sum())
    not_compared = [
        {"world_size": w["world_size"], "width": w["width"]} for w in payload["worlds"] if not w["runs"]
    ]
    assert payload["not_compared"] == not_compared
    out = capsys.readouterr().out
    assert all(f"width {w['width']:>5}: " in out for w in payload["worlds"])


def test_the_hstu_bench_compares_the_methods_at_the_chosen_batch_only(tmp_path):
    # a fixed share of at most 100% passes wherever the fitted fixed cost is below the measured time:
    # 8x the work, so that noise on a busy machine cannot tilt the fitted slope below zero
    payload = _hstu(tmp_path, "--max-fixed-share", "1", "--sweep-factors", "1", "8")
    for world in payload["worlds"]:
        check = world["acceptance"]
        _recheck(check, 1.0)
        assert check["batches"] == [4, 32]
        chosen = world["samples_per_rank"]
        assert chosen == check["chosen_batch"] is not None, check
        assert [r["method"] for r in world["runs"]] == [
            "contiguous",
            "greedy_lpt",
            "karmarkar_karp",
            "kk_swap",
        ]
        f = (1, 8)[check["batches"].index(chosen)]
        lengths = zipf_lengths(2 * chosen, payload["config"]["zipf_alpha"], 64, seed=2 * f).tolist()
        for run in world["runs"]:
            assert sum(run["rank_tokens"]) == sum(lengths) and len(run["rank_ms_median"]) == 2
            assert run["rank_enqueue_ms_median"] is None  # a CPU has no queue: left out
    assert payload["clock"] == "thread CPU time" and payload["not_compared"] == []


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--sweep-factors", "4", "4"], "--sweep-factors needs two different factors"),
        (["--sweep-factors", "0", "4"], "--sweep-factors must be >= 1"),
        (["--max-fixed-share", "0"], "--max-fixed-share must be in (0, 1], got 0.0"),
    ],
)
def test_the_hstu_bench_refuses_a_sweep_it_cannot_fit(argv, message, capsys, tmp_path):
    with pytest.raises(SystemExit):
        main(["hstu", *argv, "--out", str(tmp_path)])
    assert message in capsys.readouterr().err


def _balancer(tmp_path, *extra):
    argv = ["balancer", "--samples", "64", "--parts", "4", "--budget", "0.02", "--no-train"]
    argv += ["--exchange-world-size", "--measured-world-size", "2", "3", "--measured-batch-size", "4"]
    argv += ["--measured-max-length", "32", "--measured-width", "8", "--measured-repeats", "2"]
    assert main([*argv, "--cap-world-size", "3", "--out", str(tmp_path), *extra]) == 0
    (path,) = tmp_path.glob("balancer-*.json")
    return json.loads(path.read_text())


def _check_balancer_cases(checked: dict, limit: float, factors: tuple[int, ...]) -> None:
    """Each (distribution, W) case's sweep recomputed; the W compared are those where every
    distribution passed, at the largest batch they chose."""
    from embnb.balancing.lengths import LengthDistribution
    from embnb.lab.balancing.measured import sequence_dense_flops

    spec = {"zipf": LengthDistribution("zipf", alpha=1.5), "lognormal": LengthDistribution("lognormal")}
    assert checked["max_fixed_share"] == limit and checked["sweep_factors"] == list(factors)
    assert sorted((c["distribution"], c["world_size"]) for c in checked["cases"]) == sorted(
        (d, w) for d in ("zipf", "lognormal") for w in (2, 3)
    )
    for case in checked["cases"]:
        _recheck(case, limit)
        w = case["world_size"]
        assert case["batches"] == [4 * f for f in factors]
        for b, work in zip(case["batches"], case["work"]):
            lengths = spec[case["distribution"]].draw(w * b, 32, w)  # seed 0 * 1009 + W, as measured draws
            flops = sequence_dense_flops(lengths, 8, (64,)).reshape(w, b).sum(1)
            assert work == pytest.approx(3 * float(flops.max()))
    passed = {w: all(c["chosen_batch"] for c in checked["cases"] if c["world_size"] == w) for w in (2, 3)}
    assert checked["compared_world_sizes"] == [w for w in (2, 3) if passed[w]]
    chosen = [c["chosen_batch"] for c in checked["cases"] if passed[c["world_size"]]]
    assert checked["samples_per_rank"] == (max(chosen) if chosen else None)


def test_the_balancer_bench_checks_each_case_and_reports_no_comparison_where_none_passes(tmp_path):
    payload = _balancer(tmp_path, "--sweep-factors", "1", "4", "16")
    checked, measured = payload["rank_by_rank_acceptance"], payload["rank_by_rank"]
    _check_balancer_cases(checked, 0.10, (1, 4, 16))
    if checked["samples_per_rank"] is None:  # overhead-bound: nothing rank by rank is reported
        assert checked["verdict"] == NOT_COMPARED and measured is None
    else:
        assert checked["verdict"] == f"compared at batch {checked['samples_per_rank']}"
        assert measured["measured_config"]["local_batch_size"] == checked["samples_per_rank"]
        assert {r["world_size"] for r in measured["measured_runs"]} == set(checked["compared_world_sizes"])


def test_the_balancer_bench_compares_rank_by_rank_at_the_chosen_batch_only(tmp_path):
    payload = _balancer(tmp_path, "--sweep-factors", "1", "8", "--max-fixed-share", "1")
    checked, measured = payload["rank_by_rank_acceptance"], payload["rank_by_rank"]
    _check_balancer_cases(checked, 1.0, (1, 8))
    assert checked["compared_world_sizes"] == [2, 3], checked  # below 100% fixed: passes
    config = measured["measured_config"]
    assert config["local_batch_size"] == checked["samples_per_rank"] and config["world_sizes"] == [2, 3]
    for batch in measured["measured_batches"]:  # each batch holds W x the chosen samples per rank
        assert len(batch["lengths"]) == batch["world_size"] * checked["samples_per_rank"]
    assert [c["world_size"] for c in measured["capped"]] == [3, 3]
    assert all(r["clock"] == "thread" for r in measured["measured_runs"])  # the CPU's clock on a CPU


def test_a_unit_out_of_memory_prints_its_verdict():
    from embnb.bench.hstu import _line

    world = {
        "world_size": 8,
        "width": 1024,
        "runs": [],
        "verdict": "out of memory in the sweep: not compared",
    }
    assert _line(world | {"acceptance": None}) == "out of memory in the sweep: not compared"
