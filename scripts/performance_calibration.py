"""The calibration's tables on docs/performance.md (`python -m embnb.bench calibrate`): the fitted
coefficients, per-rank errors before and after, and the plans measured on each held-out model.
scripts/performance_page.py assembles the page."""

from __future__ import annotations

import statistics

from performance_tables import cells, sig, source, table  # beside this script

from embnb.results import Run

PAIRED = "minus_embnb DP (calibrated)"  # the bench's round-by-round difference, where it paired rounds


def calibrate_section(run: Run) -> str:
    data = run.data
    train, calibration = data["train"], data["calibration"]
    fit_abs = [abs(e) for e in calibration["fit_errors"]]
    coefficients = [
        [f"{row['sharding_type']}, {row['compute_kernel']}", *(sig(v) for v in row["fwd"])]
        for row in calibration["coefficients"]
    ]
    parts = [
        "## Calibration: torchrec's perf model fitted to measured kernels",
        source(run),
        f"Models of {data['model']['tables']} tables (`make_model`, largest {data['model']['max_rows']:,} "
        f"rows) on CPU topologies, {data['batch_size']} samples per rank. Every plan runs rank by rank on "
        f"{run.machine} with real FBGEMM kernels ({data['threads']} thread, {data['clock']} time, median of "
        f"{data['repeats']} repeats after {data['warmup']} warm-up). Fitted and compared, per rank: "
        f"{calibration['fitted']}. Training set: {len(train['plans'])} random plans of the models of seeds "
        f"{train['seeds']} at W = {train['world_sizes']}, {train['ranks']} measured ranks. Forward "
        f"coefficients fitted (backward {sig(calibration['bwd_multiplier'])} x forward):",
        table(["sharding type, kernel", *calibration["terms"]], coefficients),
    ]
    fit_errors = {"median": statistics.median(fit_abs), "worst": max(fit_abs)}
    rows = [["training set, calibrated (the fit)", percent_pair(fit_errors), str(len(fit_abs))]]
    for name, label in (("torchrec_default", "torchrec's default"), ("calibrated", "calibrated")):
        errors = data["heldout_errors"][name]
        rows.append([f"held out, {label}", percent_pair(errors), str(errors["ranks"])])
    floor = data.get("rank_repeat_gap")  # written by the bench since 2026-11-28
    if floor is not None:
        rows.append(["one placement measured twice: the gap between its runs (the noise)",
                     f"{floor['median']:.0%} median", str(floor["ranks"])])  # fmt: skip
    parts += [
        "Per-rank error |estimate / measured - 1| of each rank holding a shard (held out: the models and "
        "plans below, none fitted on):",
        table(["ranks", "median / worst", "ranks compared"], rows),
    ]
    for world in data["heldout"]:
        plans = []
        for plan in world["plans"]:
            if not plan["measured"]:
                plans.append([plan["plan"], plan["estimator"], "-", "-", "-", "-", plan["note"] or "no plan"])
                continue
            step, lookup = plan["step_ms"], plan["lookup_ms"]
            shards = ", ".join(f"{n} {kind}" for kind, n in plan["shape"].items() if kind != "shards")
            plans.append(
                [
                    plan["plan"]
                    + (" **(fastest)**" if plan["plan"] == world["fastest"] else "")
                    + (
                        f" (the same plan as {plan['same_as']})"
                        if plan.get("same_as", plan["plan"]) != plan["plan"]
                        else ""
                    ),
                    plan["estimator"],
                    f"{sig(step['median'])} ({sig(step['low'])}-{sig(step['high'])})",
                    f"{sig(lookup['median'])} ({sig(lookup['low'])}-{sig(lookup['high'])})",
                    paired_cell(plan.get(PAIRED)),
                    sig(plan["rating_ms"]),
                    f"{plan['shape']['shards']} shards: {shards}",
                ]
            )
        errors = world["errors"]
        fastest = next(p for p in world["plans"] if p["plan"] == world["fastest"])
        low, high = fastest["step_ms"]["low"], fastest["step_ms"]["high"]
        overlap = [
            p["plan"]
            for p in world["plans"]
            if p["measured"]
            and p is not fastest
            and p["step_ms"]["low"] <= high
            and p["step_ms"]["high"] >= low
        ]
        parts += [
            f"Held out: seed {world['seed']}, W = {world['world_size']}. Per-rank error (median / worst): "
            f"torchrec's default {percent_pair(errors['torchrec_default'])}, calibrated "
            f"{percent_pair(errors['calibrated'])}. "
            "Measured critical path per repeat (the slowest rank), ms, median (range):",
            table(
                cells(
                    "plan | planned on | measured step | measured lookups | step minus embnb DP "
                    "(calibrated)'s, per round: mean (95% CI) | its estimator's rating, ms (estimate) | shape"
                ),
                plans,
            ),
            f"Measured fastest (median step): **{world['fastest']}**"
            + (
                f"; within its range: {', '.join(overlap)}."
                if overlap
                else "; no other plan's range overlaps its range."
            ),
        ]
    return "\n\n".join(parts)


def paired_cell(difference: dict[str, float] | None) -> str:
    """'+1.2 (+0.3 to +2.1)': a paired difference in ms, marked where its interval excludes 0."""
    if difference is None:  # the reference itself, or a bench that did not pair its rounds
        return "-"
    text = f"{difference['mean']:+.3g} ({difference['ci_low']:+.3g} to {difference['ci_high']:+.3g})"
    return f"**{text}**" if difference["excludes_zero"] else text


def percent_pair(errors: dict[str, float]) -> str:
    """'4.1% / 12%': a median and a worst relative error."""
    return f"{sig(100 * errors['median'], 2)}% / {sig(100 * errors['worst'], 2)}%"
