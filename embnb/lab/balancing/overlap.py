"""What overlapping the shuffle cost the step as well as what it hid, from
notebook 04's phase breakdown (`TrainingRuns.phase_breakdown`): the paired
overlap-minus-sync difference comes first, since "never waited for" is a
proxy (on a CPU the worker shares its rank's core, so the forward pass and
the shuffle itself can grow while the loop waits less).

    cost = overlap_cost(training, "overlap", "sync")
    cost.sentence()
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from embnb.balancing.timeline import SHUFFLE_PHASES

__all__ = ["OverlapCost", "overlap_cost"]

COMPUTE_PHASES = ("forward", "backward")


@dataclass(frozen=True)
class OverlapCost:
    """Per run (the overlapped and the sync one), ms per timed step and rank:
    the loop's forward and backward, the shuffle's three phases added up
    (in whichever thread ran them), the loop's wait; and the paired step
    difference overlapped - sync with its 95% interval."""

    overlapped: str
    sync: str
    main_ms: dict[str, dict[str, float]]  # run -> loop phase -> ms
    shuffle_ms: dict[str, float]  # run -> the shuffle's phases, summed
    hidden_fraction: float  # of the overlapped shuffle, never waited for
    difference: dict[str, Any]  # timing.Difference.as_dict()

    def sentence(self) -> str:
        d, o, s = self.difference, self.overlapped, self.sync
        verdict = "excludes" if d["excludes_zero"] else "includes"
        grew = ", ".join(
            f"{phase} {self.main_ms[s][phase]:.2f} -> {self.main_ms[o][phase]:.2f} ms"
            for phase in COMPUTE_PHASES
        )
        return (
            f"{o} - {s}: {d['mean']:+.2f} ms/step (95% CI {d['ci_low']:+.2f} to {d['ci_high']:+.2f}, "
            f"{verdict} zero, {d['repeats']} repeats); what overlap cost the loop ({s} -> {o}): {grew}; "
            f"the shuffle took {self.shuffle_ms[o]:.2f} ms in the worker against {self.shuffle_ms[s]:.2f} ms "
            f"on the loop, and {self.hidden_fraction:.0%} of the worker's was never waited for"
        )

    def as_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "sentence": self.sentence()}


def overlap_cost(training: Any, overlapped: str, sync: str) -> OverlapCost:
    """`training` (experiment.TrainingRuns): the two runs' loop phases and
    shuffle time from its phase breakdown, and their paired difference."""
    breakdown = training.phase_breakdown()
    main_ms, shuffle_ms = {}, {}
    for label in (overlapped, sync):
        rows = breakdown[breakdown["run"] == label]
        main = rows[rows["thread"] == "main"].set_index("phase")["ms"]
        main_ms[label] = {phase: float(main.get(phase, 0.0)) for phase in (*COMPUTE_PHASES, "wait")}
        shuffle_ms[label] = float(rows[rows["phase"].isin(SHUFFLE_PHASES)]["ms"].sum())
    hidden = training.summaries()[overlapped].hidden_fraction
    difference = training.difference(overlapped, sync).as_dict()
    return OverlapCost(overlapped, sync, main_ms, shuffle_ms, hidden, difference)
