"""The GPU kit (scripts/gpu_kit.py): what it carries, its size, and its
command run end to end on CPU in a stand-in for the GPU machine.

The end-to-end test needs that stand-in (a Python 3.12 venv with torch 2.11
and only what scripts/gpu_machine.txt lists) and the gathered kit:
`make test-gpu-kit` builds both and runs this file; `make test` runs only
the checks that need neither.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys

import pytest
import torch

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import gpu_kit  # noqa: E402

MACHINE_PYTHON = os.environ.get("EMBNB_GPU_MACHINE_PYTHON")
needs_machine = pytest.mark.skipif(
    not MACHINE_PYTHON, reason="needs the GPU-machine stand-in: run `make test-gpu-kit`"
)


def _names(lines: list[str]) -> set[str]:
    return {re.split(r"[=<>]", line)[0].strip().lower() for line in lines}


def _machine_packages() -> set[str]:
    lines = (ROOT / "scripts" / "gpu_machine.txt").read_text().splitlines()
    return _names([line for line in lines if line.strip() and not line.startswith("#")])


def _test_cases(junit_xml: pathlib.Path) -> list[dict]:
    import xml.etree.ElementTree as ElementTree

    return [case.attrib for case in ElementTree.parse(junit_xml).getroot().iter("testcase")]


def test_the_kit_never_carries_torch_nor_what_the_machine_has():
    carried = _names(gpu_kit.kit_pins())
    assert "torch" not in carried
    assert not carried & _machine_packages()
    # What the issue names as missing there, each in the kit.
    assert {"torchrec", "fbgemm-gpu-cpu", "papermill", "nbclient", "ipykernel", "ipywidgets"} <= carried
    assert {"numberpartitioning"} <= carried


def test_the_kit_matches_the_min_stack_that_the_machine_runs():
    pins = dict(pin.split("==") for pin in gpu_kit.kit_pins())
    script = (ROOT / "scripts" / "setup_env.sh").read_text()
    minimum = dict(re.findall(r'^MIN_\w+_PIN="([A-Za-z0-9_.\-]+)==([^"]+)"', script, re.M))
    assert pins["fbgemm-gpu-cpu"] == minimum["fbgemm-gpu-cpu"]
    assert pins["torchrec"] == minimum["torchrec"]
    assert "torch==2.11.0" in (ROOT / "scripts" / "gpu_machine.txt").read_text()


def test_every_kit_notebook_parameter_exists_in_its_notebook():
    import nbformat

    for name, parameters in gpu_kit.NOTEBOOK_PARAMETERS.items():
        notebook = nbformat.read(str(ROOT / "notebooks" / f"{name}.ipynb"), as_version=4)
        cell = next(c for c in notebook.cells if "parameters" in c.metadata.get("tags", []))
        defined = set(re.findall(r"^(\w+) =", cell.source, re.M))
        assert set(parameters) <= defined, (name, set(parameters) - defined)


def _values(sizes: dict, flag: str) -> list:
    return sizes[flag] if isinstance(sizes[flag], list) else [sizes[flag]]


def test_the_balancer_bench_step_asks_for_the_checked_measured_part_at_w_8_16_and_its_short_form_for_less():
    from embnb.bench import balancer

    gpu, short = gpu_kit.BALANCER_BENCH, gpu_kit.BALANCER_BENCH_SHORT
    assert list(gpu) == list(short)  # the same flags, only the sizes differ
    # W = 64 of issue 36 left out: compared at up to 16 x 32 samples per rank it would take minutes alone
    assert gpu["--measured-world-size"] == [8, 16]
    # issue 70's acceptance check: a base batch, 4x and 16x it; 10% fixed at most for a dense model
    for sizes in (gpu, short):
        assert sizes["--sweep-factors"] == [1, 4, 16] and sizes["--max-fixed-share"] == 0.1
        # the bench's own parser takes them (argparse exits on a bad flag) and keeps the capped part
        opts = balancer._options([*gpu_kit.bench_flags(sizes), "--device", "cpu"])
        assert opts.measured_world_size == sizes["--measured-world-size"]
        assert opts.cap_world_size == sizes["--cap-world-size"] and opts.device == "cpu"
        assert opts.sweep_factors == [1, 4, 16] and opts.max_fixed_share == 0.1
    for flag in set(short) - {"--sweep-factors"}:  # every size of the short form at most the GPU's smallest
        assert max(_values(short, flag)) <= min(_values(gpu, flag)), flag


def test_the_hstu_bench_step_asks_for_recsys_examples_shape_and_its_short_form_for_less():
    from embnb.bench import hstu

    gpu, short = gpu_kit.HSTU_BENCH, gpu_kit.HSTU_BENCH_SHORT
    assert list(gpu) == list(short)
    # recsys-examples' E2E benchmark (7cf45752): width 1024, 8 layers, 32 samples per GPU, Zipf(1.2) to 4096
    assert (gpu["--width"], gpu["--layers"], gpu["--samples-per-rank"]) == (1024, 8, 32)
    assert (gpu["--alpha"], gpu["--max-length"]) == (1.2, 4096)
    assert gpu["--world-sizes"] == [8] and gpu["--more-world-sizes"] == [16] and gpu["--sweep-widths"] == []
    assert gpu["--deadline-s"] < gpu_kit.HSTU_STEP_S  # the bench stops before the kit cuts it
    assert gpu["--attention"] == short["--attention"] == "auto"  # jagged on the GPU, bucketed on a CPU
    for sizes in (gpu, short):
        assert sizes["--sweep-factors"] == [1, 4, 16] and sizes["--max-fixed-share"] == 0.1
        opts = hstu._options([*gpu_kit.bench_flags(sizes), "--device", "cpu"])
        assert opts.width == sizes["--width"] and opts.world_sizes == sizes["--world-sizes"]
        assert opts.sweep_factors == [1, 4, 16] and opts.max_fixed_share == 0.1
    gpu_opts = hstu._options([*gpu_kit.bench_flags(gpu), "--device", "cpu"])
    assert hstu._units(gpu_opts) == [(8, 1024), (16, 1024)]  # W = 8, then W = 16 if the deadline allows
    for flag in set(short) - {"--sweep-factors"}:
        if gpu[flag] == []:  # the GPU run leaves the width sweep out
            continue
        assert max(_values(short, flag)) <= min(_values(gpu, flag)) or flag == "--alpha", flag


def test_the_steptime_bench_step_and_its_short_form_parse_with_the_benchs_own_options():
    from embnb.bench import calibrate, steptime

    for sizes in (gpu_kit.CALIBRATE_BENCH, gpu_kit.CALIBRATE_BENCH_SHORT):
        opts = calibrate._parser().parse_args(gpu_kit.bench_flags(sizes))
        assert calibrate._check(opts) is None
    for sizes in (gpu_kit.STEPTIME_BENCH, gpu_kit.STEPTIME_UVM_BENCH, gpu_kit.STEPTIME_BENCH_SHORT):
        opts = steptime._parser().parse_args(gpu_kit.bench_flags(sizes))
        assert steptime._check(opts) is None
        assert opts.world_sizes == sizes["--world-sizes"]


def test_the_scale_step_measures_plans_made_beforehand_at_production_scale_and_its_short_form_tiny_ones():
    """bench-steptime-scale (issue 70, item 3): the committed plans of the bench's 100 tables of up to 10 M
    rows for one host of 8 CUDA devices, the four planners' plans (no poor ones); Zipf ids, the
    acceptance sweep over three batches, 3 rounds; its short form the same flags on a tiny plans file."""
    from embnb.bench import steptime
    from embnb.lab.planner.candidates import CALIBRATED

    gpu, short = gpu_kit.STEPTIME_SCALE_BENCH, gpu_kit.STEPTIME_SCALE_BENCH_SHORT
    assert set(short) == set(gpu) and short["--plans"] != gpu["--plans"]
    for sizes in (gpu, short):
        opts = steptime._parser().parse_args(gpu_kit.bench_flags(sizes))
        assert (
            steptime._check(opts) is None and opts.ids == "zipf" and opts.zipf_alpha == sizes["--zipf-alpha"]
        )
        assert len(set(opts.sweep_factors)) >= 3 and opts.max_fixed_share == 0.2
    assert gpu["--repeats"] >= 3 and short["--batch-size"] < gpu["--batch-size"]
    big, tiny = (json.loads((ROOT / sizes["--plans"]).read_text()) for sizes in (gpu, short))
    assert big["model"] == {"tables": 100, "max_rows": 10_000_000, "seed": 0}
    assert big["planned_on"]["torchrec"] == "1.6.1"  # the machine's torchrec (scripts/gpu_kit.txt)
    assert tiny["model"]["tables"] < 10 and tiny["model"]["max_rows"] <= 2000
    for plans in (big, tiny):
        (world,) = plans["worlds"]
        assert world["compute_device"] == "cuda" and world["local_world_size"] == world["world_size"]
        assert [p["name"] for p in world["plans"]] == [*steptime.WRITTEN_PLANNERS, CALIBRATED]
        assert all(p["options"] for p in world["plans"])
    assert big["worlds"][0]["world_size"] == 8


def test_a_gpu_run_without_cuda_kernels_or_cuda_tests_cannot_pass():
    ran = {"run": 12, "passed": 12, "skipped": 0, "failed": 0}
    assert gpu_kit.cuda_problems(True, {"cuda": True}, ran) == []
    # a GPU visible, but a CPU-only build and every CUDA test skipped: the kit fails
    skipped = {"run": 0, "passed": 0, "skipped": 12, "failed": 0}
    assert gpu_kit.cuda_problems(True, {"cuda": False}, skipped) == [
        "the library has no CUDA kernels",
        "no CUDA test ran",
        "12 CUDA tests were skipped",
    ]
    assert gpu_kit.cuda_problems(True, {}, {**ran, "failed": 2}) == [
        "the library has no CUDA kernels",
        "2 CUDA tests failed",
    ]
    assert gpu_kit.cuda_problems(False, {"cuda": False}, skipped) == []  # the CPU test of the kit


def test_the_build_step_fails_where_a_gpu_is_seen_but_the_library_has_no_cuda(tmp_path):
    # A faked visible GPU in front of a CPU-only build (the loader told not to
    # build CUDA, as where nvcc is missing): the kit's build step must exit
    # non-zero and say why.
    fake_gpu = (
        "import torch\nfrom embnb.cuda import loader\n"
        "loader.with_cuda = lambda: False\ntorch.cuda.is_available = lambda: True\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", fake_gpu + gpu_kit.BUILD_CHECK, str(tmp_path / "build.json")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode != 0
    assert "a GPU is visible but the library was built without CUDA kernels" in done.stderr
    assert json.loads((tmp_path / "build.json").read_text())["cuda"] is False
    # and without the fake, the same step passes on this CPU machine
    plain = subprocess.run(
        [sys.executable, "-c", gpu_kit.BUILD_CHECK, str(tmp_path / "plain.json")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert plain.returncode == 0, plain.stderr[-2000:]


def test_junit_counts_read_what_pytest_wrote(tmp_path):
    test_file = tmp_path / "test_three.py"
    test_file.write_text(
        "import pytest\n"
        "def test_ok(): pass\n"
        "def test_bad(): assert False\n"
        "@pytest.mark.skip(reason='x')\n"
        "def test_skipped(): pass\n"
    )
    xml = tmp_path / "report.xml"
    subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={xml}", str(test_file)],
        cwd=tmp_path,
        capture_output=True,
    )
    assert gpu_kit.junit_counts(xml) == {"run": 2, "passed": 1, "skipped": 1, "failed": 1}
    # reports of several files add up; a file whose process crashed wrote none
    assert gpu_kit.junit_counts(xml, tmp_path / "crashed.xml", xml) == {
        "run": 4,
        "passed": 2,
        "skipped": 2,
        "failed": 2,
    }
    assert gpu_kit.junit_counts(tmp_path / "missing.xml") == {
        "run": 0,
        "passed": 0,
        "skipped": 0,
        "failed": 0,
    }


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the rule where no GPU is visible")
@pytest.mark.parametrize("required, code, outcome", [(None, 0, "1 skipped"), ("1", 1, "1 error")])
def test_a_cuda_test_without_a_gpu_skips_unless_the_kit_requires_the_gpu(required, code, outcome):
    env = {k: v for k, v in os.environ.items() if k != gpu_kit.REQUIRE_GPU}
    if required:
        env[gpu_kit.REQUIRE_GPU] = required
    test = "tests/test_dist.py::test_nccl_with_one_rank_runs_its_collectives_on_the_gpu"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", test],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    assert done.returncode == code, done.stdout[-2000:]
    assert outcome in done.stdout
    if required:
        assert "EMBNB_REQUIRE_GPU=1 but no CUDA GPU is visible" in done.stdout


def test_a_kit_over_the_limit_is_refused(tmp_path):
    (tmp_path / "big-1.0-py3-none-any.whl").write_bytes(b"\0" * (gpu_kit.MAX_KIT_BYTES + 1))
    assert gpu_kit.kit_size(tmp_path) > gpu_kit.MAX_KIT_BYTES
    assert gpu_kit.check_size(tmp_path) == 1
    (tmp_path / "big-1.0-py3-none-any.whl").write_bytes(b"\0" * 1024)
    assert gpu_kit.check_size(tmp_path) == 0


@needs_machine
def test_the_gathered_kit_fits_and_holds_a_wheel_per_pin():
    kit = gpu_kit.DEFAULT_KIT
    wheels = list(kit.glob("*.whl"))
    assert 0 < gpu_kit.kit_size(kit) <= gpu_kit.MAX_KIT_BYTES
    stems = {w.name.split("-")[0].lower().replace("_", "-") for w in wheels}
    assert stems == _names(gpu_kit.kit_pins())
    for wheel in wheels:  # installable there: CPython 3.12, x86-64 Linux
        python, abi, platform = wheel.name[:-4].split("-")[-3:]
        assert "x86_64" in platform or platform == "any", wheel.name
        stable = abi == "abi3" and int(python.removeprefix("cp3")) <= 12  # the stable ABI, 3.x <= 3.12
        assert python == "cp312" or stable or (abi == "none" and python.startswith("py")), wheel.name


@needs_machine
def test_the_kit_command_runs_end_to_end_on_cpu(tmp_path):
    out = tmp_path / "out"
    # The stand-in has none of embnb's other dependencies: the kit must bring them.
    bare = subprocess.run([MACHINE_PYTHON, "-c", "import torchrec"], capture_output=True)
    assert bare.returncode != 0
    done = subprocess.run(
        [
            MACHINE_PYTHON,
            "scripts/gpu_kit.py",
            "run",
            "--kit",
            str(gpu_kit.DEFAULT_KIT),
            "--out",
            str(out),
            "--short-bench",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=3600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = json.loads((out / "kit.json").read_text())
    assert summary["device"] == "cpu" and summary["torch"].startswith("2.11.0")
    assert summary["python"].startswith("3.12")
    # the whole kit but a shorter bench: every kit test file, every notebook with the kit's parameters
    assert [s["step"] for s in summary["steps"]] == kit_steps()
    assert all(s["ok"] for s in summary["steps"])
    # a file without a CUDA test: pytest's "nothing selected" (5) is no failure
    assert {s["returncode"] for s in summary["steps"]} <= {0, 5}
    # no GPU here: the CUDA tests were collected and skipped, nothing claims CUDA ran
    assert summary["cuda_kernels"] is False and summary["notebook_device"] == "cpu"
    assert summary["cuda_tests"]["run"] == 0 and summary["cuda_tests"]["skipped"] >= 3
    assert summary["other_tests"]["run"] > 0 and summary["other_tests"]["failed"] == 0
    # every kit test file was collected: its CUDA tests (skipped here) or its CPU tests (run)
    reports = [out / "tests.xml", *out.glob("cuda-tests-*.xml")]
    collected = {case.get("classname", "").split(".")[-1] for xml in reports for case in _test_cases(xml)}
    assert {pathlib.Path(f).stem for f in gpu_kit.KIT_TESTS} <= collected
    assert summary["cuda_problems"] == []
    results = json.loads((out / "notebooks" / "01a_routing_measured.json").read_text())
    assert results["kv"]["rows_match"] and results["kernel"]["device"] == "cpu"
    (bench,) = out.glob("bucketize-*.json")
    assert all(row["identical"] for row in json.loads(bench.read_text())["rows"])
    assert "passed" in (out / "tests.log").read_text()
    (balancer,) = out.glob("balancer-*.json")
    (steptime,) = out.glob("steptime-*.json")
    (hstu,) = out.glob("hstu-*.json")
    (calibrate,) = out.glob("calibrate-*.json")
    (capped,) = out.glob("steptime_capped-*.json")
    (scale,) = out.glob("steptime_scale-*.json")
    (routing,) = out.glob("routing-*.json")
    names = [bench, balancer, steptime, hstu, calibrate, capped, scale, routing]
    assert summary["bench_results"] == sorted(path.name for path in names)
    _check_scale_results(json.loads(scale.read_text()), gpu_kit.STEPTIME_SCALE_BENCH_SHORT)
    assert [w["hbm_cap_gb"] for w in json.loads(capped.read_text())["worlds"]] == [1.0]
    assert json.loads(calibrate.read_text())["calibration"]["device_kind"] == "cpu"
    _check_hstu_results(json.loads(hstu.read_text()), gpu_kit.HSTU_BENCH_SHORT)
    worlds = json.loads(steptime.read_text())["worlds"]
    assert [w["world_size"] for w in worlds] == gpu_kit.STEPTIME_BENCH_SHORT["--world-sizes"]
    assert worlds[0]["verdict"] == f"compared at batch {worlds[0]['batch_size']}"  # at a 100% share
    assert any(plan["measured"] for plan in worlds[0]["plans"])
    assert worlds[0]["local_world_size"] == gpu_kit.STEPTIME_BENCH_SHORT["--devices-per-host"]
    assert any(plan["measured"] and "table_row_wise" in plan["shape"] for plan in worlds[0]["plans"])
    assert summary["fbgemm"]["cuda_kernels"] is False  # the kit's fbgemm-gpu-cpu, no GPU
    _check_balancer_results(json.loads(balancer.read_text()), gpu_kit.BALANCER_BENCH_SHORT)
    cases = json.loads(routing.read_text())["cases"]  # every (stream, routing) checked, whatever the verdict
    assert len(cases) == 9 and all(c["acceptance"]["batches"] == [16, 64, 256] for c in cases)
    assert all((c["ranks"] == []) == (c["chosen_batch"] is None) for c in cases)


def _check_scale_results(payload: dict, sizes: dict) -> None:
    """The kit's production-scale steptime JSON on CPU (at tiny sizes): the plans file's plans, Zipf ids
    with their exponent, each plan's acceptance sweep whatever its verdict, and a comparison only where
    every plan passed."""
    from embnb.scaling import NOT_COMPARED

    assert payload["plans_file"] == pathlib.Path(sizes["--plans"]).name
    assert (payload["ids"], payload["zipf_alpha"]) == ("zipf", sizes["--zipf-alpha"])
    (world,) = payload["worlds"]
    plans = json.loads((ROOT / sizes["--plans"]).read_text())["worlds"][0]["plans"]
    assert (
        [p["plan"] for p in world["plans"]]
        == [c["plan"] for c in world["acceptance"]]
        == [p["name"] for p in plans]
    )
    base = sizes["--batch-size"]
    for check in world["acceptance"]:
        assert check["unit"] == "bytes" and check["batches"] == [base * f for f in sizes["--sweep-factors"]]
    chosen = [c["chosen_batch"] for c in world["acceptance"]]
    if None in chosen:
        assert world["verdict"] == NOT_COMPARED and not any(p["measured"] for p in world["plans"])
    else:
        assert world["batch_size"] == max(chosen) and all(p["measured"] for p in world["plans"])
        assert all(r["bytes_read"] > 0 for p in world["plans"] for r in p["ranks"] if r["tbe_groups"])


def _check_hstu_results(payload: dict, sizes: dict) -> None:
    """The kit's HSTU JSON on CPU: every (W, width) of the short sizes with its acceptance check (a
    sweep of the base batch, 4x and 16x, whatever its verdict), every method, W ranks each, where the
    check passed, and no comparison where it did not."""
    from embnb.scaling import NOT_COMPARED
    from embnb.timing import machine_name

    assert payload["device"] == "cpu" and payload["machine"] == machine_name("cpu")
    assert payload["dtype"] == "float32" and payload["cut_by_deadline"] == []
    assert payload["config"]["attention"] == "bucketed"  # "auto" off CUDA
    width = sizes["--width"]
    expected = [(w, width) for w in sizes["--world-sizes"]]
    expected += [(sizes["--sweep-world-size"], x) for x in sizes["--sweep-widths"]]
    expected += [(w, width) for w in sizes["--more-world-sizes"]]
    assert [(w["world_size"], w["width"]) for w in payload["worlds"]] == list(dict.fromkeys(expected))
    base = sizes["--samples-per-rank"]
    for world in payload["worlds"]:
        check = world["acceptance"]
        assert check["batches"] == [base * f for f in sizes["--sweep-factors"]]
        assert check["max_fixed_share"] == sizes["--max-fixed-share"] and check["unit"] == "flops"
        assert len(check["achieved_rate"]) == len(check["fixed_share"]) == len(check["batches"])
        if check["chosen_batch"] is None:
            assert world["verdict"] == NOT_COMPARED and world["runs"] == []
            continue
        assert world["samples_per_rank"] == check["chosen_batch"]
        assert [r["method"] for r in world["runs"]] == [
            "contiguous",
            "greedy_lpt",
            "karmarkar_karp",
            "kk_swap",
        ]
        assert all(len(r["rank_ms_median"]) == world["world_size"] for r in world["runs"])


def _check_balancer_results(payload: dict, sizes: dict) -> None:
    """The kit's balancer JSON on CPU: named after this machine, the
    rank-by-rank part at the kit's W with every method, steps on the CPU
    clock, the capped balance with a peak per rank, recomputed from the raw
    per-rank numbers."""
    from embnb.timing import machine_name

    assert payload["device"] == "cpu" and payload["machine"] == machine_name("cpu")
    assert payload["torch"].startswith("2.11.0") and payload["training"] and payload["exchanges"]["identical"]
    checked, measured = payload["rank_by_rank_acceptance"], payload["rank_by_rank"]
    base = sizes["--measured-batch-size"]
    assert len(checked["cases"]) == 2 * len(sizes["--measured-world-size"])  # zipf and lognormal at each W
    for case in checked["cases"]:
        assert case["batches"] == [base * f for f in sizes["--sweep-factors"]]
        assert case["max_fixed_share"] == sizes["--max-fixed-share"]
    if measured is None:  # no W passed the acceptance check at every distribution: nothing compared
        assert checked["samples_per_rank"] is None and checked["compared_world_sizes"] == []
        return
    sizes = {**sizes, "--measured-world-size": checked["compared_world_sizes"]}
    assert measured["measured_config"]["device"] == "cpu" and measured["measured_config"]["clock"] == "thread"
    world_sizes = sizes["--measured-world-size"]
    methods = ("contiguous", "greedy_lpt", "karmarkar_karp", "kk_swap")
    runs = {(r["distribution"], r["world_size"], r["method"]): r for r in measured["measured_runs"]}
    assert sorted(runs) == sorted(
        (d, w, m) for d in ("zipf", "lognormal") for w in world_sizes for m in methods
    )
    for (_, w, _), r in runs.items():
        assert r["clock"] == "thread" and len(r["ms"]) == len(r["low_ms"]) == w and r["enqueue_ms"] is None
    for row in measured["measured_speedups"]:
        cut = runs[(row["distribution"], row["world_size"], "contiguous")]
        mine = runs[(row["distribution"], row["world_size"], row["method"])]
        assert row["step_ms"] == max(mine["ms"])
        assert row["measured"] == pytest.approx(max(cut["ms"]) / max(mine["ms"]))
    cap_world_size = sizes["--cap-world-size"]
    capped = measured["capped"]
    if cap_world_size not in checked["compared_world_sizes"]:
        assert capped == []
        return
    assert [(c["distribution"], c["world_size"]) for c in capped] == [
        ("zipf", cap_world_size),
        ("lognormal", cap_world_size),
    ]
    for c in capped:
        assert set(c["peak_bytes"]) == set(c["runs"]) and "uncapped" in c["runs"]
        for label, peaks in c["peak_bytes"].items():
            assert len(peaks) == cap_world_size and all(p > 0 for p in peaks), label
            assert label == "uncapped" or max(c["runs"][label]["tokens"]) <= c["cap"]


def kit_steps() -> list[str]:
    """The whole kit's steps in their order (but FBGEMM's, which runs only with --fbgemm-cuda): a GPU
    window's planned order (issue 70), the cheap checks first."""
    return [
        "build",
        *[f"cuda-tests-{pathlib.Path(f).stem}" for f in gpu_kit.KIT_TESTS],  # a process each
        "bench-calibrate",
        "bench-steptime-scale",  # first of the plans group: plans made beforehand, production scale
        "bench-steptime",
        "bench-steptime-uvm",
        "bench-hstu",
        "bench-balancer",
        "bench-routing",  # notebook 01 at scale (issue 70, item 5), its own group
        *[f"notebook-{name}" for name in gpu_kit.NOTEBOOK_PARAMETERS],
        "bench-bucketize",
        "tests",  # CPU-only, last: a deadline cuts them first
    ]


def test_the_groups_of_a_window_run_every_step_once_in_the_planned_order(tmp_path):
    """`--only cheap plans`, then `--only balancing`, then `--only notebooks`: each step of the whole
    kit runs in one group, in the kit's order, and every command brings FBGEMM's package and builds
    the native library (each command builds afresh)."""
    assert gpu_kit.GROUP_ORDER == ["cheap", "plans", "balancing", "routing", "notebooks"]
    every = ["fbgemm-cuda", *kit_steps()]
    ran, order = {}, []
    for command in (["cheap", "plans"], ["balancing"], ["routing"], ["notebooks"]):
        steps = gpu_kit.Steps(tmp_path, dict(os.environ), only=command)
        for name in every:
            steps.run(name, [sys.executable, "-c", "pass"])  # a step left out is neither run nor recorded
        for record in steps.records:
            ran.setdefault(record["step"], []).append(command[-1])
            order.append(record["step"])
    assert ran.pop("fbgemm-cuda") == ran.pop("build") == ["plans", "balancing", "routing", "notebooks"]
    assert sorted(ran) == sorted(every[2:]) and all(len(groups) == 1 for groups in ran.values())
    assert ran["bench-calibrate"] == ran["bench-steptime"] == ["plans"]  # the first command
    assert order[order.index("bench-calibrate") + 1] == "bench-steptime-scale"  # the plans' first step
    assert ran["bench-hstu"] == ran["bench-balancer"] == ["balancing"]
    assert ran["bench-routing"] == ["routing"]
    assert ran["notebook-03_dp_planner"] == ["notebooks"]
    assert [s for s in order if s not in ("fbgemm-cuda", "build")] == every[2:]  # the kit's order
    # each step's record is on disk as soon as it ends: a command killed later keeps them
    assert [r["step"] for r in json.loads((tmp_path / "steps.json").read_text())] == [
        "fbgemm-cuda",
        "build",
        *[n for n in every[2:] if ran[n] == ["notebooks"]],
    ]


def test_steps_past_the_deadline_are_cut_and_recorded(tmp_path):
    steps = gpu_kit.Steps(tmp_path, dict(os.environ), deadline_s=3)
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    assert not steps.run("sleeps-past-the-deadline", sleeper)
    assert not steps.run("starts-after-the-deadline", [sys.executable, "-c", "open('ran', 'w')"])
    cut, never_started = steps.records
    assert cut["returncode"] == never_started["returncode"] == "timeout"
    assert 2 < cut["seconds"] < 30  # cut at the deadline, not after the child's 60 s
    assert not (gpu_kit.ROOT / "ran").exists()
    unbounded = gpu_kit.Steps(tmp_path, dict(os.environ))
    assert unbounded.run("quick", [sys.executable, "-c", "pass"])
    assert unbounded.records[0]["returncode"] == 0


def test_a_step_passes_only_on_its_accepted_exit_codes(tmp_path):
    steps = gpu_kit.Steps(tmp_path, dict(os.environ))
    exits_5 = [sys.executable, "-c", "raise SystemExit(5)"]
    assert not steps.run("five-is-a-failure", exits_5)
    assert steps.run("five-is-accepted", exits_5, ok_codes=(0, 5))
    assert [(r["returncode"], r["ok"]) for r in steps.records] == [(5, False), (5, True)]
