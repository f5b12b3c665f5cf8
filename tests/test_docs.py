"""The docs: docs/performance.md is exactly what its generator makes of
benchmarks/results (so no table drifts from its run), every relative link in
the README and docs/ resolves, the README stays short, the architecture
page's layout names what the tree holds, and history stays in CHANGELOG.md."""

import json
import pathlib
import re
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

import api_reference  # noqa: E402  (scripts/ is not a package)
import performance_page  # noqa: E402

DOCS = ROOT / "docs"
HAND_WRITTEN = [ROOT / "README.md", *(p for p in DOCS.glob("*.md") if p.name != "performance.md")]


def test_the_performance_page_is_what_the_results_make():
    page = performance_page.render(performance_page.RESULTS_DIR)
    assert performance_page.PAGE.read_text() == page, (
        "docs/performance.md differs from benchmarks/results: run `python scripts/performance_page.py`"
    )


def test_the_api_reference_is_what_the_docstrings_make():
    assert api_reference.PAGE.read_text() == api_reference.render(), (
        "docs/api.md differs from the docstrings: run `python scripts/api_reference.py`"
    )


@pytest.mark.parametrize("module_name", api_reference.MODULES)
def test_everything_a_subpackage_exports_is_documented_there(module_name):
    module = __import__(module_name, fromlist=["__all__"])
    page = api_reference.PAGE.read_text()
    section = page.split(f"\n## {module_name}\n", 1)[1].split("\n## ", 1)[0]
    for name in module.__all__:
        obj = getattr(module, name)
        assert re.search(rf"^### (class |dataclass )?`{name}\b", section, flags=re.M), name
        if callable(obj):
            assert (obj.__doc__ or "").strip(), f"{module_name}.{name} has no docstring"


def _write(folder, name, payload):
    (folder / name).write_text(json.dumps(payload))


def _enumerators(date, torchrec_runs, embnb_runs):
    row = {
        "model": "bench",
        "num_tables": 20,
        "device": "cpu",
        "world_size": 4,
        "local_world_size": 2,
        "num_options": 80,
        "num_shards": 200,
        "distinct_shards": 90,
        "same_options": True,
        "torchrec_s_runs": torchrec_runs,
        "embnb_s_runs": embnb_runs,
        "embnb_estimators_s_runs": [0.5, 0.5, 0.5],
    }
    return {"benchmark": "enumerators", "machine": "box x4 cores", "date": date, "repeats": 3, "rows": [row]}


def test_a_table_names_its_newest_file_machine_and_date_with_the_ratio_and_its_spread(tmp_path):
    _write(tmp_path, "enumerators-old.json", _enumerators("2026-01-01", [9.0, 9.0, 9.0], [1.0, 1.0, 1.0]))
    _write(tmp_path, "enumerators-new.json", _enumerators("2026-02-01", [2.0, 4.0, 6.0], [1.0, 2.0, 1.5]))
    _write(tmp_path, "custom-x.json", {"machine": "gpu box", "date": "2026-03-01"})
    page = performance_page.render(tmp_path)
    section = page.split("## Enumerators")[1].split("\n## ")[0]
    assert "`benchmarks/results/enumerators-new.json`" in section
    assert "machine `box x4 cores`, date 2026-02-01" in section
    # worked by hand: medians 4.0 / 1.5; the range pairs 2.0 with 2.0 and 6.0 with 1.0
    assert "| 2.67x (1.00-6.00) |" in section
    assert "| 8.00x (4.00-12.0) |" in section  # torchrec over its estimators: 4 / 0.5, 2 / 0.5, 6 / 0.5
    assert "cpu x 4 (2 hosts)" in section
    others = page.split("## Other results files")[1]  # the older run, and a benchmark without a table
    assert "`enumerators-old.json`: enumerators, machine `box x4 cores`, 2026-01-01" in others
    assert "`custom-x.json`: custom, machine `gpu box`, 2026-03-01" in others
    assert "9.00x" not in page


def test_each_machine_keeps_its_newest_table(tmp_path):
    """A GPU's run beside a CPU's: each machine's newest run is tabled, in
    the order their machines first appear; only the older CPU run is listed."""
    _write(tmp_path, "enumerators-a.json", _enumerators("2026-01-01", [9.0, 9.0, 9.0], [1.0, 1.0, 1.0]))
    gpu = _enumerators("2026-01-15", [3.0, 3.0, 3.0], [1.0, 1.0, 1.0])
    _write(tmp_path, "enumerators-b.json", {**gpu, "machine": "NVIDIA H100"})
    _write(tmp_path, "enumerators-c.json", _enumerators("2026-02-01", [5.0, 5.0, 5.0], [1.0, 1.0, 1.0]))
    page = performance_page.render(tmp_path)
    tabled = page.split("## Other results files")[0]
    assert tabled.count("## Enumerators") == 2
    # the CPU box wrote the first file, so its newest (c) comes before the H100's (b)
    assert tabled.index("enumerators-c.json") < tabled.index("enumerators-b.json")
    assert "| 5.00x" in tabled and "| 3.00x" in tabled and "| 9.00x" not in tabled
    others = page.split("## Other results files")[1]
    assert "`enumerators-a.json`" in others and "enumerators-b.json" not in others


def test_an_end_to_end_row_with_its_own_hbm_share_names_it(tmp_path):
    def row(devices: int, hbm: float) -> dict:
        runs = [1.0, 2.0, 3.0]
        return {
            "num_tables": 50,
            "world_size": devices,
            "local_world_size": 8,
            "hbm_fraction": hbm,
            "import_s_runs": runs,
            "fresh_process_s_runs": runs,
            "in_process_s_runs": runs,
            "in_process_rating": 1.0,
            "same_rating_everywhere": True,
        }

    rows = [row(16, 0.5), row(1024, 1.0)]
    data = {"benchmark": "end_to_end", "machine": "box", "date": "2026-01-01", "hbm_fraction": 0.5}
    _write(tmp_path, "end_to_end-x.json", {**data, "processes": 3, "rows": rows})
    section = performance_page.render(tmp_path).split("## Planning once, in a fresh process")[1]
    assert "holds 50% of the tables' fp32 rows" in section
    assert "| 50 x 16 (2 hosts) |" in section  # the bench's share: not repeated per row
    assert "| 50 x 1024 (128 hosts), HBM for 100% of the rows |" in section


def test_a_results_file_without_its_metadata_is_named(tmp_path):
    _write(tmp_path, "planner-x.json", {"benchmark": "planner", "rows": []})
    with pytest.raises(ValueError, match=r"planner-x.json: a results file needs 'date' and 'machine'"):
        performance_page.render(tmp_path)


def test_check_fails_on_a_changed_page_and_passes_on_a_regenerated_one(tmp_path, capsys):
    _write(tmp_path, "enumerators-a.json", _enumerators("2026-02-01", [2.0], [1.0]))
    out = tmp_path / "page.md"
    assert performance_page.main(["--results", str(tmp_path), "--out", str(out)]) == 0
    assert performance_page.main(["--results", str(tmp_path), "--out", str(out), "--check"]) == 0
    out.write_text(out.read_text().replace("2.00x", "2.10x"))
    assert performance_page.main(["--results", str(tmp_path), "--out", str(out), "--check"]) == 1
    assert "run `python scripts/performance_page.py`" in capsys.readouterr().err


def test_the_readme_is_at_most_250_lines():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 250


@pytest.mark.parametrize("page", [ROOT / "README.md", *sorted(DOCS.glob("*.md"))], ids=lambda p: p.name)
def test_every_relative_link_resolves(page):
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text())
    local = [t for t in targets if "://" not in t and not t.startswith("mailto:")]
    missing = [t for t in local if not (page.parent / t).exists()]
    assert missing == []


@pytest.mark.parametrize("page", HAND_WRITTEN, ids=lambda p: p.name)
def test_no_dated_history_outside_the_changelog(page):
    text = page.read_text()
    assert re.findall(r"\b20\d\d-\d\d-\d\d\b", text) == []
    assert re.findall(r"\b(?:used to|no longer|now sorts|did not reproduce)\b", text) == []


def _layout_paths() -> list[str]:
    """The paths the architecture page's layout block names, as embnb/... ."""
    text = (DOCS / "architecture.md").read_text()
    block = text.split("```text\n", 1)[1].split("```", 1)[0]
    paths, stack = [], []
    for line in block.splitlines():
        match = re.match(r"^( {0,8})([\w-]+(?:/|\.\w+))(?:\s|$)", line)  # deeper lines go on describing
        if not match or len(match.group(1)) % 2:
            continue
        depth = len(match.group(1)) // 2
        stack[depth:] = [match.group(2).rstrip("/")]
        paths.append("/".join(stack))
    return paths


def test_the_architecture_layout_names_what_the_tree_holds():
    named = _layout_paths()
    missing = [p for p in named if not (ROOT / p).exists()]
    assert missing == [], "the layout names paths that do not exist"
    package = ROOT / "embnb"
    present = {
        str(p.relative_to(ROOT)).removesuffix(".py")
        for p in [*package.glob("*/"), *package.glob("*.py"), *package.glob("*/*/")]
        if p.name not in {"__init__.py", "__pycache__"} and not p.name.startswith(("_", "."))
    }
    present = {p for p in present if (ROOT / p).is_dir() or (ROOT / f"{p}.py").exists()}
    named_stems = {p.removesuffix(".py") for p in named}
    assert sorted(present - named_stems) == [], "the layout leaves out these parts of embnb/"
