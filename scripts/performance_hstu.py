"""The performance page's section for `python -m embnb.bench hstu` (the balancer on an HSTU-like model)."""

from __future__ import annotations

from performance_tables import sig, source, table  # beside this script

from embnb.results import Run


def _ratio(ratio: dict) -> str:
    return f"{sig(ratio['median'])}x ({sig(ratio['low'])}-{sig(ratio['high'])})"


def hstu_section(run: Run) -> str:
    data, config = run.data, run.data["config"]
    methods = [r["method"] for r in data["worlds"][0]["runs"][1:]] if data["worlds"] else []
    rows = []
    for world in data["worlds"]:
        runs = {r["method"]: r for r in world["runs"]}
        rows.append(
            [str(world["world_size"]), str(world["width"]), sig(runs["contiguous"]["step_ms_median"])]
            + [f"{_ratio(runs[m]['speedup_vs_cut'])}; {sig(runs[m]['flop_model_speedup'])}x" for m in methods]
        )
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
            table(["ranks", "width", "cut, ms/step", *methods], rows),
            swept + f"KK + swaps' slowest repeat beats the cut at every measured width from "
            f"{data['first_width_shortened']} on."
            if data["first_width_shortened"] is not None
            else swept + "at no measured width does KK + swaps' slowest repeat beat the cut at that width "
            "and every wider one.",
        ]
        + ([f"Cut by the bench's deadline: {cut}."] if cut else [])
    )
