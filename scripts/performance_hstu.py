"""The performance page's section for `python -m embnb.bench hstu` (the balancer on an HSTU-like model)."""

from __future__ import annotations

from performance_tables import sig, source, table  # beside this script

from embnb.results import Run


def _ratio(ratio: dict) -> str:
    return f"{sig(ratio['median'])}x ({sig(ratio['low'])}-{sig(ratio['high'])})"


def hstu_section(run: Run) -> str:
    data, config = run.data, run.data["config"]
    # since issue 70 a (W, width) that fails the acceptance check has no runs: it is not compared
    compared = [w for w in data["worlds"] if w["runs"]]
    methods = [r["method"] for r in compared[0]["runs"][1:]] if compared else []
    rows = []
    for world in compared:
        runs = {r["method"]: r for r in world["runs"]}
        rows.append(
            [
                str(world["world_size"]),
                str(world["width"]),
                str(world.get("samples_per_rank", config["samples_per_rank"])),
                sig(runs["contiguous"]["step_ms_median"]),
            ]
            + [f"{_ratio(runs[m]['speedup_vs_cut'])}; {sig(runs[m]['flop_model_speedup'])}x" for m in methods]
        )
    checks = [_check_line(w) for w in data["worlds"] if w.get("acceptance")]
    cut = ", ".join(f"W = {c['world_size']} width {c['width']}" for c in data["cut_by_deadline"])
    sweep_w = data["sweep_world_size"]
    measured = sorted(w["width"] for w in data["worlds"] if w["world_size"] == sweep_w)
    swept = (
        f"Width sweep at W = {sweep_w}, widths measured: {', '.join(map(str, measured))}"
        + (" (the others were cut: no sweep)" if len(measured) < 2 else "")
        + ": "
    )
    return "\n\n".join(
        [
            "## Balancer on an HSTU-like model, rank by rank",
            source(run),
            f"{config['layers']} layers, {config['samples_per_rank']} samples per rank, Zipf("
            f"{config['zipf_alpha']}) lengths up to {config['max_length']}, {data['dtype']} on "
            f"{data['device']}, {data['clock']}; ranks replayed one by one on one device; the step is the "
            f"slowest rank. Speed-up over the loader's cut: median (range) over {config['repeats']} "
            "repeats; then the FLOP model's prediction:",
            table(["ranks", "width", "samples per rank", "cut, ms/step", *methods], rows)
            if rows
            else "No (W, width) passed the acceptance check: nothing compared.",
            swept + f"KK + swaps' slowest repeat beats the cut at every measured width from "
            f"{data['first_width_shortened']} on."
            if data["first_width_shortened"] is not None
            else swept + "at no measured width does KK + swaps' slowest repeat beat the cut at that width "
            "and every wider one.",
        ]
        + ([f"Cut by the bench's deadline: {cut}."] if cut else [])
        + (
            [
                "**Acceptance check** (the cut's heaviest rank at each batch; compared only where the fitted "
                "fixed share is at most the limit):",
                "\n".join(checks),
            ]
            if checks
            else []
        )
    )


def _check_line(world: dict) -> str:
    """One (W, width)'s acceptance check: fixed share and achieved TFLOPS at each batch, its verdict."""
    check = world["acceptance"]
    at = ", ".join(
        f"{b}: {sig(100 * share, 2)}% fixed, {sig(rate / 1e12)} TFLOPS"
        for b, share, rate in zip(check["batches"], check["fixed_share"], check["achieved_rate"])
    )
    return (
        f"- W = {world['world_size']}, width {world['width']} (samples per rank {at}; limit "
        f"{sig(100 * check['max_fixed_share'], 2)}%): {check['verdict']}"
    )
