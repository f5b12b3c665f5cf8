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
        kernel_call_terms(calibration),
    ]
    fit_errors = {"median": statistics.median(fit_abs), "worst": max(fit_abs)}
    rows = [["training set, calibrated (the fit)", percent_pair(fit_errors), str(len(fit_abs))]]
    for name, label in (
        ("torchrec_default", "torchrec's default"),
        ("calibrated_per_shard", "calibrated per shard only (the same fit without the kernel-call term)"),
        ("calibrated", "calibrated"),
    ):
        errors = data["heldout_errors"].get(name)  # the per-shard fit: benches since issue #69
        if errors is not None:
            rows.append([f"held out, {label}", percent_pair(errors), str(errors["ranks"])])
    floor = data.get("rank_repeat_gap")  # written by the bench since 2026-11-28
    if floor is not None:
        rows.append(
            [
                "one placement measured twice: the gap between its runs (the noise)",
                f"{floor['median']:.0%} median",
                str(floor["ranks"]),
            ]
        )
    parts += [
        "Per-rank error |estimate / measured - 1| of each rank holding a shard (held out: the models and "
        "plans below, none fitted on):",
        table(["ranks", "median / worst", "ranks compared"], rows),
    ]
    repeated = data.get("repeated_runs")  # this file's bench and its repeats, each with its own seed
    if repeated:
        medians = [run_["heldout_median"] for run_ in repeated]
        seeds = ", ".join(str(r["seed"]) for r in repeated)
        parts.append(
            f"The same bench run {len(repeated)} times (`--seed` {seeds}, "
            f"this file one of them): held-out median per-rank error "
            f"{', '.join(f'{100 * m:.1f}%' for m in medians)}; their median "
            f"{100 * statistics.median(medians):.1f}%."
        )
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
    gpu = gpu_refit_section()
    return "\n\n".join([*parts, gpu] if gpu else parts)


def kernel_call_terms(calibration: dict) -> str:
    """The rating's terms outside torchrec's per-shard estimate (`KernelCallPerfModel`)."""
    collectives = calibration.get("collective_ms") or {}
    fixed = ", ".join(f"{kind} {sig(ms)} ms" for kind, ms in collectives.items() if ms)
    fixed = f"{fixed} (each sharding type's collectives timed on real ranks)" if fixed else "0 (not measured)"
    return (
        "Outside torchrec's per-shard estimate, in the planner's rating (`KernelCallPerfModel`): "
        f"`kernel_call_ms` = {sig(calibration.get('kernel_call_ms', 0.0))} ms per TBE call on a rank, "
        "fitted with the coefficients on each rank's count of torchrec's TBE groups; "
        f"`collective_ms` = {fixed}."
    )


def gpu_refit_section() -> str:
    """The committed H200 runs refitted with the kernel-call term (issue #69), where committed."""
    from embnb.results import load_runs

    runs = load_runs("calibrate_gpu_refit")
    if not runs:
        return ""
    run = runs[-1]
    data = run.data
    parts = ["### The committed GPU runs refitted", source(run)]
    if not data["fitted"]:
        return "\n\n".join([*parts, f"Not fitted: {data['why']}."])
    rows = [
        [label, percent_pair(data["heldout_errors"][name]), str(data["heldout_errors"][name]["ranks"])]
        for name, label in (
            ("torchrec_default", "torchrec's default"),
            ("calibrated_per_shard", "refitted per shard only"),
            ("calibrated", "refitted with the kernel-call term"),
        )
    ]
    proposed = [
        [
            f"W = {p['world_size']}" + (f", {p['hbm_cap_gb']} GiB HBM" if p["hbm_cap_gb"] else ""),
            groups_cell(p["uncalibrated"]),
            groups_cell(p),
        ]
        for p in distinct_topologies(data["proposed"])
    ]
    parts += [
        f"{data['scale']['label']} ({data['machine']}). {data['rebuildable_plans']} of "
        f"{data['plans_in_files']} measured plans of {len(data['runs'])} runs planned again here with the "
        f"same per-rank estimates; on their {data['ranks']} ranks, {' + '.join(data['terms'])} per (sharding "
        f"type, kernel) and `kernel_call_ms` = {sig(data['calibration']['kernel_call_ms'])} ms. Per-rank "
        "error, each run held out of the fit in turn (median / worst):",
        table(["estimate", "median / worst", "ranks"], rows),
        "embnb's DP on each planned topology, before (torchrec's estimates) and under the refit: TBE groups "
        "per rank",
        table(["topology", "embnb DP", "embnb DP (GPU refit)"], proposed),
    ]
    return "\n\n".join(parts)


def distinct_topologies(proposed: list[dict]) -> list[dict]:
    """The proposals, one per topology (runs that planned one topology alike give one plan)."""
    seen: dict[tuple, dict] = {}
    for p in proposed:
        seen.setdefault((p["world_size"], p["hbm_cap_gb"], p.get("local_world_size")), p)
    return list(seen.values())


def groups_cell(plan: dict) -> str:
    groups = plan.get("tbe_groups_per_rank")
    if not groups:
        return "no plan"
    shape = ", ".join(f"{n} {kind}" for kind, n in plan["shape"].items() if kind != "shards")
    return f"{shape}; groups per rank {groups} (at most {max(groups)})"


def paired_cell(difference: dict[str, float] | None) -> str:
    """'+1.2 (+0.3 to +2.1)': a paired difference in ms, marked where its interval excludes 0."""
    if difference is None:  # the reference itself, or a bench that did not pair its rounds
        return "-"
    text = f"{difference['mean']:+.3g} ({difference['ci_low']:+.3g} to {difference['ci_high']:+.3g})"
    return f"**{text}**" if difference["excludes_zero"] else text


def percent_pair(errors: dict[str, float]) -> str:
    """'4.1% / 12%': a median and a worst relative error."""
    return f"{sig(100 * errors['median'], 2)}% / {sig(100 * errors['worst'], 2)}%"
