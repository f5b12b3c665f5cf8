"""The README's notebooks table states only counts and estimates at the
notebooks' default parameters and seeds; each is recomputed here from the
notebook's own parameters cell (read from the committed notebook) with the
package, not copied from a run. The cells stay short: one finding each."""

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def _row(notebook: str) -> list[str]:
    line = next(line for line in README.splitlines() if line.startswith(f"| `{notebook}` |"))
    return [cell.strip() for cell in line.strip().strip("|").split(" | ")]


def _defaults(notebook: str) -> dict:
    """The literals of the notebook's `parameters` cell."""
    import nbformat

    nb = nbformat.read(str(ROOT / "notebooks" / f"{notebook}.ipynb"), as_version=4)
    cell = next(c for c in nb.cells if "parameters" in c.metadata.get("tags", []))
    tree = ast.parse(cell.source)
    return {
        node.targets[0].id: ast.literal_eval(node.value) for node in tree.body if isinstance(node, ast.Assign)
    }


@pytest.mark.parametrize(
    "notebook", ["01_modulo_aliasing", "02_cw_permute_indices", "03_dp_planner", "04_balancer_overlap"]
)
def test_each_headline_is_one_short_finding(notebook):
    assert len(_row(notebook)[2].split()) <= 30


def test_01_stride_12_on_8_ranks():
    from embnb.lab.rowwise import aliasing

    p = _defaults("01_modulo_aliasing")
    assert (p["stride"], p["world_size"], p["num_keys"]) == (12, 8, 1_000_000)
    streams = aliasing.KeyStreams(["strided"], p["seed"], {"strided": {"stride": 12}})
    table = aliasing.load_table(streams, ["roundrobin", "hash_roundrobin"], [8], p["num_keys"])
    ratio = dict(zip(table["dist_type"], table["max_over_mean"]))
    assert ratio["roundrobin"] == pytest.approx(4.0, rel=0.01)  # gcd(12, 8), by hand
    finding = _row("01_modulo_aliasing")[2]
    assert f"{ratio['roundrobin']:.2f} with `key % W`, {ratio['hash_roundrobin']:.2f} hashed" in finding


def test_02_permute_of_the_default_placement():
    from embnb.columnwise import cw_permute_indices

    p = _defaults("02_cw_permute_indices")
    finding = _row("02_cw_permute_indices")[2]
    assert f"shards on ranks {p['shard_ranks']}: permute {cw_permute_indices(p['shard_ranks'])}" in finding
    assert "torchrec's output equals the unsharded collection's with its permute and not without" in finding


def test_04_worst_gaps_on_the_seeded_zipf_batches():
    from embnb.balancing.lengths import LengthDistribution
    from embnb.lab.balancing import comparison

    p = _defaults("04_balancer_overlap")
    table = comparison.comparison_table(
        {"zipf": LengthDistribution("zipf", alpha=p["zipf_alpha"])},
        p["sample_counts"],
        p["part_counts"],
        p["seeds"],
        p["comparison_max_length"],
    )
    worst = comparison.worst_gaps(table).loc[("zipf", "tokens")]
    finding = _row("04_balancer_overlap")[2]
    kk_swap = comparison.percent(worst["kk_swap"])
    kk = comparison.percent(worst["karmarkar_karp"])
    assert f"KK + swaps lands at worst {kk_swap} above the lower bound on tokens, plain KK {kk}" in finding


def test_03_dp_equals_brute_force_on_the_small_instances():
    from embnb.lab.planner.comparison import quality_study, quality_summary

    p = _defaults("03_dp_planner")
    study = quality_study(
        p["quality_instances"], p["seed"], storage_reservation_percentage=p["storage_reservation_percentage"]
    )
    summary = quality_summary(study).loc["embnb DP"]  # rating / brute force's best, among its plans
    assert summary.worst_ratio == pytest.approx(1.0) and summary.no_plan == 0
    finding = _row("03_dp_planner")[2]
    assert (
        f"on {p['quality_instances']} small random instances embnb DP rated equal to brute force" in finding
    )
