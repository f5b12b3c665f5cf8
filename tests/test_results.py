"""embnb.results: the one reader of the benches' results files, against files
written here and against the committed folder read directly with json."""

from __future__ import annotations

import json

import pytest

from embnb.results import COMMITTED_RESULTS, load_runs, write_results


def _write(folder, name, date, machine, **extra):
    path = folder / f"{name}-{date}-{machine.replace(' ', '-')}.json"
    path.write_text(json.dumps({"date": date, "machine": machine, **extra}))
    return path


def test_runs_are_read_back_oldest_first_and_filtered_by_benchmark(tmp_path):
    _write(tmp_path, "planner", "2026-11-29", "x86_64 x2 cores", rows=[2])
    _write(tmp_path, "planner", "2026-11-21", "NVIDIA H200", rows=[1])
    _write(tmp_path, "steptime_capped", "2026-11-25", "NVIDIA H200", benchmark="steptime_capped")
    # a file's own "benchmark" key wins over its name
    _write(tmp_path, "renamed", "2026-11-22", "x86_64 x2 cores", benchmark="planner", rows=[0])

    planner = load_runs("planner", tmp_path)
    assert [run.data["rows"] for run in planner] == [[1], [0], [2]]
    assert [run.date for run in planner] == ["2026-11-21", "2026-11-22", "2026-11-29"]
    assert [run.machine for run in planner] == ["NVIDIA H200", "x86_64 x2 cores", "x86_64 x2 cores"]
    assert {run.benchmark for run in load_runs(results_dir=tmp_path)} == {"planner", "steptime_capped"}
    assert load_runs("hstu", tmp_path) == []


def test_what_write_results_writes_load_runs_reads(tmp_path):
    path = write_results("probe", {"machine": "m x1 cores", "value": 3}, tmp_path)
    (run,) = load_runs("probe", tmp_path)
    assert run.path == path and run.name == path.name
    assert run.data == json.loads(path.read_text())
    assert run.machine == "m x1 cores"


def test_every_committed_file_is_read():
    files = sorted(COMMITTED_RESULTS.glob("*.json"))
    runs = load_runs()
    assert sorted(run.path for run in runs) == files
    for run in runs:
        assert run.data == json.loads(run.path.read_text())


def test_a_file_without_date_or_machine_is_named(tmp_path):
    (tmp_path / "broken-x.json").write_text(json.dumps({"date": "2026-11-29"}))
    with pytest.raises(ValueError, match=r"broken-x\.json: a results file needs 'date' and 'machine'"):
        load_runs(results_dir=tmp_path)


def test_a_missing_folder_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="nowhere"):
        load_runs(results_dir=tmp_path / "nowhere")
