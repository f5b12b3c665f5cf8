"""embnb.lab.balancing.measured.gpu_rank_rows: the committed GPU runs read back as one row per rank,
and the check that their time follows their work, on results files written here."""

import json

import pytest

from embnb.lab.balancing import measured


def _balancer(path, machine, device, ms, flops, interleaved=False):
    # interleaved: a file of the interleaved rounds (ms on the "device" clock); else an earlier one's
    # fields (wall_ms read, cpu_ms a decoy)
    times = (
        {"ms": ms, "clock": "device"}
        if interleaved
        else {"wall_ms": ms, "cpu_ms": [0.0] * len(ms), "clock": "wall"}
    )
    runs = [
        {"distribution": "zipf", "world_size": 2, "method": m, "flops": flops, **times}
        for m in ("contiguous", "kk_swap")
    ]
    payload = {
        "machine": machine,
        "date": "2026-11-26",
        "device": device,
        "rank_by_rank": {"measured_config": {"width": 32}, "measured_runs": runs},
    }
    path.write_text(json.dumps(payload))


def test_only_cuda_runs_are_read_and_the_fit_says_what_bounds_them(tmp_path):
    _balancer(tmp_path / "balancer-a-cpu.json", "x86_64 x2 cores", "cpu", [1.0, 2.0], [1e9, 2e9])
    _balancer(tmp_path / "balancer-b-gpu.json", "GPU B", "cuda", [10.0, 10.5], [1e9, 3e9])  # flat: overhead
    _balancer(tmp_path / "balancer-c-gpu.json", "GPU C", "cuda", [1.0, 3.0], [1e9, 3e9], True)  # follows work
    (tmp_path / "bucketize-d-gpu.json").write_text(json.dumps({"machine": "GPU D", "date": "2026-11-26"}))
    ranks = measured.gpu_rank_rows(tmp_path)
    assert len(ranks) == 2 * 2 * 2  # 2 files x 2 methods x 2 ranks: not the CPU run, not another bench
    assert ranks["ms"].tolist() == [10.0, 10.5] * 2 + [1.0, 3.0] * 2  # the wall clock, as the run says
    fits = measured.time_vs_work(ranks)
    assert list(fits.index) == [
        "GPU B 2026-11-26, balancer, width 32",
        "GPU C 2026-11-26, balancer, width 32",
    ]
    b, c = fits.iloc[0], fits.iloc[1]
    assert b["fixed_ms"] == pytest.approx(9.75) and not b["time_follows_work"]  # 10 = fixed + 0.25 x 1
    assert c["fixed_share"] == pytest.approx(0, abs=1e-9) and c["time_follows_work"]
    assert c["tflops"] == pytest.approx(8 / 8)  # 8 GFLOPs in 8 ms


def test_no_gpu_run_gives_an_empty_table(tmp_path):
    assert measured.gpu_rank_rows(tmp_path).empty
