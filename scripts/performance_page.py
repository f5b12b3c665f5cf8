"""Write docs/performance.md from the benchmark results, benchmarks/results/*.json.

    .venv/bin/python scripts/performance_page.py           # rewrite docs/performance.md
    .venv/bin/python scripts/performance_page.py --check   # exit 1 if the page differs from the results

Every number on the page comes from a results file, and each table names its
file, machine and date (the JSON's own metadata). The newest file of each
benchmark gets the tables; older files are listed. tests/test_docs.py
regenerates the page and fails on any difference, so no table drifts from
its run. The analysis (why the numbers are what they are) is written by hand
in docs/performance-notes.md and states no number of its own.
"""

from __future__ import annotations

import argparse
import pathlib
import sys
from typing import Any

from performance_calibration import calibrate_section  # beside this script
from performance_hstu import hstu_section  # beside this script
from performance_tables import (  # beside this script
    ablation_section,
    cells,
    end_to_end_section,
    enumerators_section,
    planner_section,
    sharders_section,
    sig,
    source,
    steptime_section,
    table,
)

from embnb.results import COMMITTED_RESULTS, Run, load_runs

ROOT = pathlib.Path(__file__).resolve().parent.parent
RESULTS_DIR = COMMITTED_RESULTS
PAGE = ROOT / "docs" / "performance.md"
COMMAND = "python scripts/performance_page.py"


def runs_by_benchmark(results_dir: pathlib.Path) -> dict[str, list[Run]]:
    """Every results file (embnb.results.load_runs), grouped by benchmark, oldest first."""
    runs: dict[str, list[Run]] = {}
    for run in load_runs(results_dir=results_dir):
        runs.setdefault(run.benchmark, []).append(run)
    return dict(sorted(runs.items()))


def bucketize_section(run: Run) -> str:
    data = run.data
    setup = data.get("input", {})

    def ratio(median: float | None, minimum: float | None, digits: int = 3) -> str:
        return "-" if median is None else f"{sig(median, digits)}x ({sig(minimum, digits)}x)"

    rows = []
    for row in data["rows"]:
        threads = row.get("threads", data.get("threads"))
        rows.append(
            [
                f"{row['num_keys']:,}",
                str(row["world_size"]),
                row.get("dist_type", "continuous"),
                "all cores" if threads == 0 else str(threads),
                "yes" if row["identical"] else "**no**",
                sig(row["embnb_mkeys_s"]),
                "-" if row["fbgemm_mkeys_s"] is None else sig(row["fbgemm_mkeys_s"]),
                ratio(row["embnb_over_fbgemm"], row["embnb_over_fbgemm_min"]),
                ratio(row["embnb_over_reference"], row["embnb_over_reference_min"], 2),
                f"{sig(100 * row['embnb_fraction_of_copy'], 2)}%",
            ]
        )
    header = cells(
        "keys | W | mode | threads | outputs identical | embnb M keys/s | "
        "FBGEMM M keys/s | embnb / FBGEMM: medians (minima) | "
        "embnb / pure-torch reference: medians (minima) | "
        "embnb's share of copy bandwidth"
    )
    fbgemm = data.get("fbgemm")
    peer = (
        "FBGEMM's `block_bucketize_sparse_features` is the peer in continuous mode"
        if fbgemm is None or any(row["fbgemm_mkeys_s"] is not None for row in data["rows"])
        else f"no FBGEMM peer here (FBGEMM: {fbgemm})"
    )
    return "\n\n".join(
        [
            "## Bucketize: routing keys to ranks",
            source(run),
            f"{setup.get('num_features', '?')} features of average length {setup.get('avg_length', '?')}, "
            f"{setup.get('indices_dtype', '?')} keys on {data.get('device', 'cpu')}; {peer}; outputs "
            f"compared before timing; medians and minima of {setup.get('repeats', '?')} "
            f"interleaved rounds after {setup.get('warmup', '?')} warm-up, every implementation at the same "
            "torch thread count.",
            table(header, rows),
        ]
    )


def balancer_section(run: Run) -> str:
    data = run.data
    parts = ["## Balancer: Karmarkar-Karp and the balanced shuffle", source(run)]
    parts += _partition_tables(data)
    if data.get("gil_main_thread_speed"):
        gil = data["gil_main_thread_speed"]
        parts += [
            "**The GIL**: main-thread Python speed while KK + swaps runs in a thread over and over, as a "
            "share of its speed alone:",
            table(["KK + swaps", "main thread's speed"], [[k, sig(v, 2)] for k, v in gil.items()]),
        ]
    for training in data.get("training", []):
        parts += _training_tables(training, data.get("training_config", {}))
    if data.get("exchanges"):
        parts += _exchange_tables(data["exchanges"])
    if data.get("rank_by_rank"):
        parts += _rank_by_rank_tables(data["rank_by_rank"])
    return "\n\n".join(parts)


def _partition_tables(data: dict[str, Any]) -> list[str]:
    entries = data["partitioning"]
    methods = list(dict.fromkeys(entry["method"] for entry in entries))
    cases = list(dict.fromkeys((entry["num_samples"], entry["num_parts"]) for entry in entries))
    cell = {(e["num_samples"], e["num_parts"], e["method"]): e for e in entries}
    speed, gap = [], []
    for samples, parts in cases:
        label = f"{samples:,} into {parts}"
        speed.append(
            [label] + [sig(cell[samples, parts, m]["speedup_vs_numberpartitioning_kk"], 2) for m in methods]
        )
        gap.append(
            [label] + [f"{sig(100 * cell[samples, parts, m]['gap_to_lower_bound'], 2)}%" for m in methods]
        )
    return [
        f"**Partitioning** samples' workloads (Zipf sequence lengths) into equal-count parts; the peer is "
        f"{data.get('peer', '?')}. Speed as peer seconds / method seconds (one median per cell; the file "
        "records no spread):",
        table(["samples into parts", *methods], speed),
        "Gap of the largest part to the lower bound max(mean, largest item):",
        table(["samples into parts", *methods], gap),
    ]


def _training_tables(training: dict[str, Any], config: dict[str, Any]) -> list[str]:
    rows = []
    for entry in training["runs"]:
        step, speedup = entry.get("step_ms"), entry.get("speedup_vs_no_balancing")
        rows.append(
            [
                entry["label"],
                entry.get("exchange", "-"),
                f"{step['median']:.1f} ({step['low']:.1f}-{step['high']:.1f})" if step else "-",
                f"{sig(speedup['median'])}x ({sig(speedup['low'])}-{sig(speedup['high'])})"
                if speedup
                else "-",
                f"{sig(entry['flops_ideal_speedup'])}x" if "flops_ideal_speedup" in entry else "-",
                sig(1000 * entry["shuffle_seconds"], 2) if "shuffle_seconds" in entry else "-",
            ]
        )
    repeats = config.get("repeats", "?")
    parts = [
        f"**Step time** on {training['world_size']} {training.get('backend', '')} ranks"
        + (" sharing one GPU" if config.get("device") == "cuda" else "")
        + ": "
        f"{config.get('batch_size', '?')} samples per rank, lengths up to {config.get('max_length', '?')}, "
        f"{len(training.get('timed_steps', [])) or '?'} timed steps of {config.get('steps', '?')}, "
        f"{repeats} repeats interleaved; ms per step at the slowest rank, median (range over the repeats):",
        table(
            cells(
                "run | exchange | ms/step | speed-up over no balancing | "
                "slowest rank's FLOPs predict | shuffle ms"
            ),
            rows,
        ),
    ]
    gain = training.get("overlap_minus_sync_ms")
    if gain:
        verdict = "excludes" if gain["excludes_zero"] else "includes"
        parts.append(
            f"Overlap minus sync, paired per repeat: {sig(gain['mean'], 2)} ms per step, 95% interval "
            f"{sig(gain['ci_low'], 2)} to {sig(gain['ci_high'], 2)} ms over {gain['repeats']} repeats "
            f"(the interval {verdict} zero)."
        )
    if training.get("phase_ms"):
        parts += [
            "Phases, ms per step (*worker*: in the background thread):",
            _phase_table(training["phase_ms"]),
        ]
    return parts


def _phase_table(phases: list[dict[str, Any]]) -> str:
    """One row per run, one column per phase."""
    names = list(dict.fromkeys(p["phase"] for p in phases))
    runs = list(dict.fromkeys(p["run"] for p in phases))
    cell = {(p["run"], p["phase"]): p for p in phases}
    rows = []
    for run in runs:
        row = [run]
        for name in names:
            phase = cell.get((run, name))
            worker = " *worker*" if phase and phase["thread"] != "main" else ""
            row.append(f"{sig(phase['ms'])}{worker}" if phase else "-")
        rows.append(row)
    return table(["run", *names], rows)


def _exchange_tables(exchanges: dict[str, Any]) -> list[str]:
    per_rank = exchanges["bytes_per_rank"]
    bytes_rows = [
        [str(world), f"{sig(sizes['allgather'] / 1000)} KB", f"{sig(sizes['alltoall'] / 1000)} KB"]
        for world, sizes in per_rank.items()
    ]
    measured = [
        [
            str(m["world_size"]),
            m["exchange"],
            f"{sig(m['ms_median'])} ({sig(m['ms_low'])}-{sig(m['ms_high'])})",
        ]
        for m in exchanges.get("measured", [])
    ]
    return [
        f"**Exchanges** ({exchanges.get('batch_size', '?')} samples per rank; bytes a rank receives, the "
        "largest over ranks, computed from the batch's sizes):",
        table(["ranks", "all-gather", "all-to-all"], bytes_rows),
        "Measured, ms (median and range):",
        table(["ranks", "exchange", "ms"], measured),
    ]


def _rank_by_rank_tables(measured: dict[str, Any]) -> list[str]:
    """The balanced step rank by rank: speed-ups over the loader's cut by
    method, then the memory-capped balance."""
    config = measured["measured_config"]
    methods = list(dict.fromkeys(s["method"] for s in measured["measured_speedups"]))
    methods.remove("contiguous")  # the reference: 1.00x by definition
    by_case: dict[tuple[str, int], dict[str, dict[str, Any]]] = {}
    for speedup in measured["measured_speedups"]:
        by_case.setdefault((speedup["distribution"], speedup["world_size"]), {})[speedup["method"]] = speedup
    rows = []
    for (distribution, world), cases in by_case.items():
        bound = cases["contiguous"]
        limit = " (longest sample)" if bound["longest_sets_bound"] else ""
        rows.append(
            [distribution, str(world)]
            + [f"{sig(cases[m]['measured'])}x ({sig(cases[m]['flop_model'])}x)" for m in methods]
            + [f"{sig(bound['bound'])}x{limit}"]
        )
    capped = [
        [
            c["distribution"],
            str(c["world_size"]),
            f"{c['cap']:.0f} ({sig(c['cap'] / c.get('mean', c.get('mean_tokens')))}x mean)",
            "yes" if c["binds"] else "no",
        ]
        + [f"{sig(c['cost'][m])}x, {sig(max(c['peak_bytes'][m]) / 2**20)} MiB" for m in c["cost"]]
        for c in measured["capped"]
    ]
    cap_methods = list(measured["capped"][0]["cost"]) if measured["capped"] else []
    return [
        f"**Rank by rank** ({config['local_batch_size']} samples per rank, lengths up to "
        f"{config['max_length']}, {config['threads']} thread, median of {config['repeats']} repeats of each "
        "rank's forward and backward, one rank after another; the step is the slowest rank, by "
        + {"wall": "synchronized wall time", "device": "CUDA events"}.get(
            config.get("clock"), "thread CPU time"
        )
        + f" on {config.get('device', 'cpu')}): "
        "speed-up over the loader's contiguous cut, measured (the FLOP model's prediction in brackets), "
        "and the FLOP model's bound (max(mean, longest sample) per rank):",
        table(["lengths", "ranks", *methods, "bound"], rows),
        "**Under a token cap** per rank (KK + swaps, greedy and KK partition by FLOPs with the cap): the "
        "measured step over the uncapped step, and the largest measured peak activation memory of any rank:",
        table(["lengths", "ranks", "cap, tokens", "binds", *cap_methods], capped),
    ]


SECTIONS = {
    "bucketize": bucketize_section,
    "planner": planner_section,
    "end_to_end": end_to_end_section,
    "enumerators": enumerators_section,
    "ablation": ablation_section,
    "balancer": balancer_section,
    "hstu": hstu_section,
    "steptime": steptime_section,
    "steptime_capped": steptime_section,
    "calibrate": calibrate_section,
    "sharders": sharders_section,
}
# Results a section above reads beside its own bench's (the calibration section shows the GPU refit).
READ_BY_A_SECTION = {"calibrate_gpu_refit"}


def newest_per_machine(group: list[Run]) -> list[Run]:
    """The newest run of each machine (a GPU's results do not hide a CPU's),
    machines in the order their first file was written."""
    newest: dict[str, Run] = {}
    for run in group:  # oldest first: later runs replace earlier ones
        newest[run.machine] = run
    return list(newest.values())


def render(results_dir: pathlib.Path = RESULTS_DIR) -> str:
    """The whole page, from the results files in `results_dir`."""
    runs = runs_by_benchmark(results_dir)
    parts = [
        "# Performance",
        f"<!-- Generated by `{COMMAND}` from benchmarks/results/*.json. Do not edit: "
        "tests/test_docs.py regenerates this page and fails on any difference. -->",
        "Measured with `python -m embnb.bench NAME`. Every speed is a ratio against a peer timed in the same "
        "run; each table names the results file, machine and date it comes from. The CPU machines are "
        "shared, and other jobs move ratios between runs: compare ratios within one table. What the "
        "numbers mean, and why they are what they are: [performance-notes.md](performance-notes.md).",
    ]
    tabled = {name: newest_per_machine(group) for name, group in runs.items() if name in SECTIONS}
    for name, section in SECTIONS.items():
        parts += [section(run) for run in tabled.get(name, [])]
    earlier = [
        run for name, group in runs.items() for run in group if run not in tabled.get(name, group[-1:])
    ]
    untabled = [
        run
        for name, group in runs.items()
        if name not in SECTIONS and name not in READ_BY_A_SECTION
        for run in group[-1:]
    ]
    if earlier or untabled:
        lines = [f"- `{r.name}`: {r.benchmark}, machine `{r.machine}`, {r.date}" for r in earlier + untabled]
        parts += [
            "## Other results files",
            "Kept in benchmarks/results but not tabled here:",
            "\n".join(lines),
        ]
    return "\n\n".join(parts) + "\n"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=pathlib.Path, default=RESULTS_DIR, help="results folder")
    parser.add_argument("--out", type=pathlib.Path, default=PAGE, help="the page to write")
    parser.add_argument("--check", action="store_true", help="exit 1 if the page differs; write nothing")
    opts = parser.parse_args(argv)
    page = render(opts.results)
    if opts.check:
        current = opts.out.read_text() if opts.out.exists() else ""
        if current != page:
            print(f"{opts.out} differs from {opts.results}: run `{COMMAND}`", file=sys.stderr)
            return 1
        return 0
    opts.out.parent.mkdir(parents=True, exist_ok=True)
    opts.out.write_text(page)
    print(f"wrote {opts.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
