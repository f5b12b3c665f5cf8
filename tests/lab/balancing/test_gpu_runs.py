"""embnb.lab.balancing.gpu_runs: the committed GPU runs of the balancer bench, read back."""

import json

from embnb.lab.balancing import gpu_runs


def _file(path, machine, device, width, measured):
    rows = [
        {"distribution": "zipf", "world_size": w, "method": m, "measured": x, "flop_model": 1.5, "bound": 1.6}
        for w, x in zip((8, 16), measured)
        for m in ("contiguous", "kk_swap")
    ]
    config = {"device": device, "width": width}
    path.write_text(
        json.dumps(
            {"machine": machine, "rank_by_rank": {"measured_config": config, "measured_speedups": rows}}
        )
    )


def test_only_cuda_runs_of_kk_swap_are_read_and_summed_up_per_gpu(tmp_path):
    _file(tmp_path / "balancer-a-cpu.json", "x86_64 x2 cores", "cpu", 32, [2.0, 2.5])
    _file(tmp_path / "balancer-b-gpu.json", "GPU B", "cuda", 256, [0.9, 1.1])
    _file(tmp_path / "balancer-c-gpu.json", "GPU A", "cuda", 32, [0.7, 1.05])
    (tmp_path / "bucketize-d-gpu.json").write_text("{}")  # another bench: not read
    table = gpu_runs.gpu_speedups(tmp_path)
    assert list(table["machine"]) == ["GPU B", "GPU B", "GPU A", "GPU A"]  # file order
    assert list(table["measured"]) == [0.9, 1.1, 0.7, 1.05] and set(table["width"]) == {32, 256}
    assert gpu_runs.gpu_sentence(table).endswith(
        "GPU A (width 32) 0.70x-1.05x; GPU B (width 256) 0.90x-1.10x, "
        "where the FLOP model predicted up to 1.50x"
    )


def test_no_gpu_run_is_said_so(tmp_path):
    table = gpu_runs.gpu_speedups(tmp_path)
    assert table.empty and list(table.columns) == gpu_runs.COLUMNS
    assert gpu_runs.gpu_sentence(table).startswith("No GPU run")
