"""embnb.lab.balancing.gpu_runs: the committed GPU runs read back, with the check that their time
follows their work, on files written here."""

import json

import pytest

from embnb.lab.balancing import gpu_runs


def _balancer(path, machine, device, ms, flops):
    runs = [
        {
            "distribution": "zipf",
            "world_size": 2,
            "method": m,
            "wall_ms": ms,
            "cpu_ms": ms,
            "flops": flops,
            "clock": "wall",
        }
        for m in ("contiguous", "kk_swap")
    ]
    speedups = [
        {"distribution": "zipf", "world_size": 2, "method": m, "measured": 1.1, "flop_model": 1.5}
        for m in ("contiguous", "kk_swap")
    ]
    config = {"device": device, "width": 32}
    payload = {
        "machine": machine,
        "device": device,
        "rank_by_rank": {"measured_config": config, "measured_runs": runs, "measured_speedups": speedups},
    }
    path.write_text(json.dumps(payload))


def test_only_cuda_runs_are_read_and_the_fit_says_what_bounds_them(tmp_path):
    _balancer(tmp_path / "balancer-a-cpu.json", "x86_64", "cpu", [1.0, 2.0], [1e9, 2e9])
    _balancer(tmp_path / "balancer-b-gpu.json", "GPU B", "cuda", [10.0, 10.5], [1e9, 3e9])  # flat: overhead
    _balancer(tmp_path / "balancer-c-gpu.json", "GPU C", "cuda", [1.0, 3.0], [1e9, 3e9])  # follows work
    (tmp_path / "bucketize-d-gpu.json").write_text("{}")  # another bench: not read
    fits = gpu_runs.gpu_time_vs_work(tmp_path).set_index("machine")
    assert list(fits.index) == ["GPU B", "GPU C"]
    assert fits.loc["GPU B", "fixed_ms"] == pytest.approx(9.75)  # 10 = fixed + 0.25 x 1
    assert fits.loc["GPU B", "time_follows_work"] == False  # noqa: E712 (numpy bool)
    assert fits.loc["GPU C", "fixed_share"] == pytest.approx(0, abs=1e-9)
    assert fits.loc["GPU C", "time_follows_work"] == True  # noqa: E712
    table = gpu_runs.gpu_speedups(tmp_path)
    assert list(table["machine"]) == ["GPU B", "GPU C"] and list(table["measured"]) == [1.1, 1.1]


def test_no_gpu_run_gives_empty_tables(tmp_path):
    assert gpu_runs.gpu_speedups(tmp_path).empty and gpu_runs.gpu_time_vs_work(tmp_path).empty
