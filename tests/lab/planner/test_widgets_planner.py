"""embnb.lab.planner.explore.PlannerExplorer, driven headlessly on a small model:
every control re-plans with real torchrec when the button is clicked."""

import logging
import math

import pytest

from embnb import planner
from embnb.lab.planner.comparison import Planning, compare_proposers, default_proposers
from embnb.lab.planner.explore import ExplorerStart, PlannerExplorer
from embnb.lab.planner.models import make_model

logging.getLogger("torchrec").setLevel(logging.ERROR)


def small_explorer(**kwargs):
    """3 tables (0.94 GiB of fp32 rows) on 2 devices with 0.8 GiB HBM each;
    0.05 GiB DDR, so that a small HBM leaves no plan."""
    draw_now = kwargs.pop("draw_now", False)
    start = ExplorerStart(0.8, 2, 3, **{"proposers": ("embnb DP", "Uniform"), "ddr_cap_gb": 0.05, **kwargs})
    return PlannerExplorer(start, Planning(timeout_s=10), draw_now=draw_now)


def title(explorer):
    return explorer.figure._suptitle.get_text()


def bar_labels(explorer):
    """The proposers drawn, top to bottom."""
    axis = explorer.figure.axes[0]
    labels = sorted(axis.get_yticklabels(), key=lambda label: -label.get_position()[1])
    return [label.get_text() for label in labels]


def test_nothing_is_planned_until_the_button_is_clicked():
    explorer = small_explorer()
    assert explorer.draws == 0 and explorer.figure is None
    assert explorer.button.description == "plan"
    explorer.click()
    assert explorer.draws == 1 and explorer.error is None
    assert title(explorer) == "3 tables, 2 devices, 0.8 GiB HBM each"
    assert bar_labels(explorer) == ["embnb DP", "Uniform"]


def test_a_replan_shows_its_steps_on_a_progress_bar_then_hides_it():
    explorer = small_explorer()
    seen = []
    explorer.progress.observe(lambda change: seen.append(explorer.progress.description), names="value")
    explorer.click()
    # enumeration, then one step per proposer, each announced before it runs
    assert explorer.progress_steps == [(0, 3, "enumerating options"), (1, 3, "embnb DP"), (2, 3, "Uniform")]
    assert seen[:2] == ["embnb DP", "Uniform"]  # the bar moved while planning
    assert explorer.progress.layout.visibility == "hidden" and explorer.progress.value == 0
    assert bar_labels(explorer) == ["embnb DP", "Uniform"]


@pytest.mark.parametrize(
    "control, value, expected",
    [
        ("hbm_cap_gb", 1.6, "3 tables, 2 devices, 1.6 GiB HBM each"),
        ("world_size", 5, "3 tables, 5 devices, 0.8 GiB HBM each"),
        ("num_tables", 4, "4 tables, 2 devices, 0.8 GiB HBM each"),
    ],
)
def test_each_control_replans_with_its_new_setting(control, value, expected):
    explorer = small_explorer(draw_now=True)
    before = explorer.draws
    explorer.controls[control].value = value
    assert explorer.draws == before and explorer.button.description == "plan (settings changed)"
    explorer.click()
    assert explorer.draws == before + 1 and explorer.error is None
    assert title(explorer) == expected and explorer.button.description == "plan"


def test_a_budget_without_any_plan_shows_why_instead_of_raising():
    explorer = small_explorer()
    explorer.controls["hbm_cap_gb"].value = explorer.controls["hbm_cap_gb"].min  # 0.05 GiB
    explorer.click()
    assert explorer.error.startswith("ValueError: no proposer found a plan")
    assert "fits on no device" in explorer.error  # the DP's reason, naming the table
    assert "no proposer found a plan" in explorer.status.value
    explorer.controls["hbm_cap_gb"].value = 0.8
    explorer.click()
    assert explorer.error is None and title(explorer).endswith("0.8 GiB HBM each")


@pytest.mark.parametrize("value", [1.2, 0.5, 3.0, 0.07])
def test_the_hbm_slider_starts_at_exactly_the_value(value):
    slider = PlannerExplorer(ExplorerStart(value, 2, 3)).controls["hbm_cap_gb"]
    assert slider.value == value
    # the frontend snaps to min + k * step: the value is on that grid, k whole
    steps = (math.log2(value) - slider.min) / slider.step
    assert steps == pytest.approx(round(steps), abs=1e-9)
    assert slider.base ** (slider.min + round(steps) * slider.step) == pytest.approx(value, rel=1e-12)


def test_bad_explorer_settings_are_named():
    with pytest.raises(ValueError, match="proposer 'nosuch' is not one of"):
        small_explorer(proposers=("nosuch",))
    with pytest.raises(ValueError, match="hbm_cap_gb must be a finite number > 0, got 0"):
        PlannerExplorer(ExplorerStart(0, 2, 3))
    with pytest.raises(ValueError, match="world_size must be an int in \\[2, 32\\], got 64"):
        PlannerExplorer(ExplorerStart(1.0, 64, 3))


def test_the_explorer_plans_what_compare_proposers_plans():
    explorer = small_explorer(draw_now=True)
    model = make_model(3, 0)
    topology = planner.make_topology(2, "cuda", hbm_cap_gb=0.8, ddr_cap_gb=0.05)
    proposers = {k: v for k, v in default_proposers().items() if k in ("embnb DP", "Uniform")}
    table = compare_proposers(model.tables, topology, Planning(constraints=model.constraints), proposers)
    (dots,) = explorer.figure.axes[0].collections  # one per proposer, top down: its rating over the best
    assert dots.get_offsets()[:, 0].tolist() == pytest.approx(
        (table.perf_rating / table.perf_rating.min()).tolist()
    )
