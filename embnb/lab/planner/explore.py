"""Notebook 03's explorer: a click re-plans a random model at another HBM budget, world size or
table count and compares the proposers (`embnb.lab.widgets.Explorer`); it takes seconds."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import ipywidgets as widgets
import pandas as pd
from matplotlib.figure import Figure

from embnb._checks import check_choice, check_int, check_number
from embnb.lab.planner.comparison import Planning, compare_proposers, default_proposers
from embnb.lab.planner.figures import planned_title, proposer_comparison
from embnb.lab.planner.models import enumerate_options, make_model
from embnb.lab.widgets import Explorer
from embnb.planner.topology import make_topology

__all__ = ["ExplorerStart", "PlannerExplorer"]


@dataclass(frozen=True)
class ExplorerStart:
    """The explorer's model and topology: the controls' start values and what stays fixed."""

    hbm_cap_gb: float  # per device (a control)
    world_size: int  # a control
    num_tables: int  # a control: `make_model(num_tables, seed)`
    seed: int = 0
    compute_device: str = "cuda"  # the topology's
    ddr_cap_gb: float = 128.0  # per rank
    proposers: tuple[str, ...] = ("embnb DP", "torchrec DP", "Greedy", "Uniform")


class PlannerExplorer(Explorer):
    """HBM per device, world size and table count; a click re-plans the model with each of
    `start.proposers` under `planning` and draws `proposer_comparison`, titled with the settings."""

    def __init__(
        self, start: ExplorerStart, planning: Planning = Planning(timeout_s=20), draw_now: bool = False
    ):
        factories = default_proposers()
        self.proposers = {
            name: factories[check_choice("proposer", name, list(factories))] for name in start.proposers
        }
        reservation = planning.storage_reservation_percentage
        check_number("storage_reservation_percentage", reservation, low=0, high=1, high_open=True)
        self.start, self.planning = start, planning
        world_size = check_int("world_size", start.world_size, low=2, high=32)
        num_tables = check_int("num_tables", start.num_tables, low=3, high=120)
        # HBM per device from /16 to x16 in steps of 2**(1/4) on a grid through the start value, so the
        # slider starts there (a grid from a fixed minimum would snap 1.2 to 1.19)
        exponent = math.log2(check_number("hbm_cap_gb", start.hbm_cap_gb, low=0, low_open=True))
        super().__init__(
            {
                "hbm_cap_gb": widgets.FloatLogSlider(
                    value=start.hbm_cap_gb,
                    base=2,
                    min=exponent - 4,
                    max=exponent + 4,
                    step=0.25,
                    readout_format=".3g",
                    description="HBM GiB",
                ),
                "world_size": widgets.IntSlider(value=world_size, min=2, max=32, description="world size"),
                "num_tables": widgets.IntSlider(value=num_tables, min=3, max=120, description="tables"),
            },
            button="plan",
            draw_now=draw_now,
        )

    def draw(self, hbm_cap_gb: float, world_size: int, num_tables: int) -> Figure:
        start = self.start
        model = make_model(num_tables, start.seed)
        caps = {"hbm_cap_gb": hbm_cap_gb, "ddr_cap_gb": start.ddr_cap_gb}
        topology = make_topology(world_size, start.compute_device, **caps)
        steps = 1 + len(self.proposers)  # enumerate once, then each proposer plans
        self.progress_step(0, steps, "enumerating options")
        enumerated = enumerate_options(model.tables, topology, self.planning.batch_size, model.constraints)
        planning = replace(self.planning, constraints=model.constraints)
        rows = []
        for done, (name, factory) in enumerate(self.proposers.items(), start=1):
            self.progress_step(done, steps, name)
            rows.append(compare_proposers(enumerated, topology, planning, {name: factory}))
        return proposer_comparison(pd.concat(rows), planned_title(num_tables, world_size, hbm_cap_gb))
