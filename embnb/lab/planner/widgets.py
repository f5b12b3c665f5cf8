"""Notebook 03's explorer: re-plan a random model at another HBM budget, world
size or table count, and compare the proposers (`embnb.lab.widgets.Explorer`).

Re-planning takes seconds (torchrec enumerates every option, then each
proposer plans), so it runs when the "plan" button is clicked:

    explorer = PlannerExplorer(hbm_cap_gb=1.2, world_size=8, num_tables=40)
    display(explorer)
    explorer.controls["hbm_cap_gb"].value = 0.6; explorer.click()   # what a test does
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import ipywidgets as widgets
import pandas as pd
from matplotlib.figure import Figure

from embnb._checks import check_choice, check_int, check_number
from embnb.lab.planner.comparison import compare_proposers, default_proposers
from embnb.lab.planner.models import enumerate_options, make_model
from embnb.lab.planner.plots import planned_title, proposer_comparison
from embnb.lab.widgets import Explorer
from embnb.planner.topology import make_topology

__all__ = ["PlannerExplorer", "hbm_slider"]

HBM_STEPS_PER_DOUBLING = 4  # the HBM slider's grid: 2**(1/4) apart
HBM_DOUBLINGS = 4  # the slider spans the start value / 2**4 to * 2**4


def hbm_slider(value: float, description: str = "HBM GiB") -> widgets.FloatLogSlider:
    """A log slider for HBM per device whose grid passes through `value`, so
    it starts at exactly `value` (a grid from a fixed minimum would snap
    1.2 to 2**0.25 = 1.19)."""
    value = check_number("hbm_cap_gb", value, low=0, low_open=True)
    exponent = math.log2(value)
    return widgets.FloatLogSlider(
        value=value,
        base=2,
        min=exponent - HBM_DOUBLINGS,
        max=exponent + HBM_DOUBLINGS,
        step=1 / HBM_STEPS_PER_DOUBLING,
        readout_format=".3g",
        description=description,
    )


class PlannerExplorer(Explorer):
    """HBM per device, world size and table count; a click re-plans the model
    (`make_model(num_tables, seed)`) with each of `proposers` and draws
    `proposer_comparison`, titled with the settings it was planned for.

    Args:
        hbm_cap_gb, world_size, num_tables: the controls' start values.
        seed: the model's random tables.
        compute_device: "cuda" or "cpu", the topology's device.
        ddr_cap_gb: DDR per rank, GiB.
        batch_size, bins_per_device: as in `compare_proposers` and `default_proposers`.
        storage_reservation_percentage: of each device, kept for all but the
            tables; the same for every proposer.
        proposers: names from `default_proposers` to compare.
        timeout_s: time limit of each proposer.
        draw_now: plan once at construction (seconds).
    """

    def __init__(
        self,
        hbm_cap_gb: float,
        world_size: int,
        num_tables: int,
        *,
        seed: int = 0,
        compute_device: str = "cuda",
        ddr_cap_gb: float = 128.0,
        batch_size: int = 512,
        bins_per_device: int = 100,
        proposers: Sequence[str] = ("embnb DP", "torchrec DP", "Greedy", "Uniform"),
        timeout_s: float = 20,
        storage_reservation_percentage: float = 0.15,
        draw_now: bool = False,
    ):
        factories = default_proposers(bins_per_device)
        for name in proposers:
            check_choice("proposer", name, list(factories))
        self.proposers = {name: factories[name] for name in proposers}
        self.seed, self.batch_size, self.timeout_s = (
            seed,
            check_int("batch_size", batch_size, low=1),
            timeout_s,
        )
        self.compute_device = check_choice("compute_device", compute_device, ("cuda", "cpu"))
        self.ddr_cap_gb = ddr_cap_gb
        self.reservation = check_number(
            "storage_reservation_percentage", storage_reservation_percentage, low=0, high=1, high_open=True
        )
        controls = {
            "hbm_cap_gb": hbm_slider(hbm_cap_gb),
            "world_size": widgets.IntSlider(
                value=check_int("world_size", world_size, low=2, high=32),
                min=2,
                max=32,
                description="world size",
            ),
            "num_tables": widgets.IntSlider(
                value=check_int("num_tables", num_tables, low=3, high=120),
                min=3,
                max=120,
                description="tables",
            ),
        }
        super().__init__(controls, button="plan", draw_now=draw_now)

    def draw(self, hbm_cap_gb: float, world_size: int, num_tables: int) -> Figure:
        model = make_model(num_tables, self.seed)
        topology = make_topology(
            world_size, self.compute_device, hbm_cap_gb=hbm_cap_gb, ddr_cap_gb=self.ddr_cap_gb
        )
        steps = 1 + len(self.proposers)  # enumerate once, then each proposer plans
        self.progress_step(0, steps, "enumerating options")
        enumerated = enumerate_options(model.tables, topology, self.batch_size, model.constraints)
        rows = []
        for done, (name, factory) in enumerate(self.proposers.items(), start=1):
            self.progress_step(done, steps, name)
            rows.append(
                compare_proposers(
                    None,
                    topology,
                    self.batch_size,
                    constraints=model.constraints,
                    proposers={name: factory},
                    timeout_s=self.timeout_s,
                    storage_reservation_percentage=self.reservation,
                    enumerated=enumerated,
                )
            )
        table = pd.concat(rows)
        table.attrs = dict(rows[0].attrs)
        return proposer_comparison(table, title=planned_title(num_tables, world_size, hbm_cap_gb))
