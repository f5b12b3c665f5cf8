"""The tables of docs/performance.md for the planner's benchmarks (planner,
end_to_end, enumerators, ablation), and the formatting every section shares.
scripts/performance_page.py assembles the page."""

from __future__ import annotations

import math
import statistics
from typing import Any

from embnb.results import Run

# Formatting ---------------------------------------------------------------


def sig(value: float | None, digits: int = 3) -> str:
    """`value` to `digits` significant digits, without an exponent."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if value == 0:
        return "0"
    decimals = max(0, digits - 1 - math.floor(math.log10(abs(value))))
    return f"{value:,.{decimals}f}"


def median_range(values: list[float], digits: int = 3, unit: str = "") -> str:
    """The median of `values` and their range: '0.47 s (0.47-0.48)'."""
    if not values:
        return "-"
    middle = sig(statistics.median(values), digits)
    return f"{middle}{unit} ({sig(min(values), digits)}-{sig(max(values), digits)})"


def ratio_range(numerators: list[float], denominators: list[float]) -> str:
    """median(numerators) / median(denominators), and the range of the ratio
    over every pairing of a numerator run with a denominator run."""
    if not numerators or not denominators:
        return "-"
    ratio = statistics.median(numerators) / statistics.median(denominators)
    low, high = min(numerators) / max(denominators), max(numerators) / min(denominators)
    if len(numerators) == len(denominators) == 1:
        return f"{sig(ratio)}x"
    return f"{sig(ratio)}x ({sig(low)}-{sig(high)})"


def cells(text: str) -> list[str]:
    """A table's header written as one line: 'a | b' -> ['a', 'b']."""
    return text.split(" | ")


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


# a bench whose file is not named after its command: after an option, or after what it refits
COMMANDS = {"steptime_capped": "steptime --hbm-gib GIB", "calibrate_gpu_refit": "gpu_refit"}


def source(run: Run) -> str:
    """The line under each heading: which file, machine and date the tables come from."""
    data = run.data
    facts = [f"machine `{run.machine}`", f"date {run.date}"]
    if data.get("cpu_model"):
        facts.append(f"CPU {data['cpu_model']}")
    stack = data.get("stack") or {}
    if stack.get("torch") or data.get("torch"):
        facts.append(f"torch {stack.get('torch') or data['torch']}")
    if stack.get("torchrec"):
        facts.append(f"torchrec {stack['torchrec']}, fbgemm-gpu {stack['fbgemm_gpu']}")
    if data.get("commit"):
        facts.append(f"commit {data['commit'][:12]}")
    if data.get("copy_gbps"):
        facts.append(f"copy bandwidth {sig(data['copy_gbps'])} GB/s")
    if data.get("load_average_before"):
        facts.append(f"one-minute load average {sig(data['load_average_before'][0], 2)} when it started")
    if data.get("bench_s"):
        facts.append(f"the bench ran {sig(data['bench_s'] / 60, 2)} min")
    command = COMMANDS.get(run.benchmark, run.benchmark)
    return (
        f"From `benchmarks/results/{run.name}` (`python -m embnb.bench {command}`): " + ", ".join(facts) + "."
    )


def shape(row: dict[str, Any]) -> str:
    """'200 x 64 (8 hosts)': tables x devices, and hosts where there are several."""
    local = row.get("local_world_size") or row["world_size"]
    hosts = row["world_size"] // local
    where = f" ({hosts} hosts)" if hosts > 1 else ""
    return f"{row['num_tables']} x {row['world_size']}{where}"


# One section per benchmark --------------------------------------------------


def planner_section(run: Run) -> str:
    data = run.data
    parts = [
        "## Planner: embnb's DP proposer against torchrec's proposers",
        source(run),
        f"Random models (`make_model`, seed {data.get('seed', '?')}) on GPU "
        f"topologies whose HBM holds {sig(100 * data['hbm_fraction'], 2)}% of the tables' fp32 rows, "
        f"batch size {data.get('batch_size', '?')}; each proposer in torchrec's planner over the same "
        "enumerated options, "
        f"cut at {data.get('timeout_s', '?')} s. A rating is torchrec's estimate of the slowest rank "
        "(its perf model), not a measurement. Ratios are peer / embnb DP: above 1, embnb's plan is "
        "rated faster or plans sooner."
        + (
            f" Storage reservation: {data['storage_reservation']}." if data.get("storage_reservation") else ""
        ),
        "**Enumeration** (the options every proposer plans over; median and range of the repeats; "
        "the ratio's range pairs every run with every run):",
        table(
            ["tables x devices", "options", "torchrec's enumerator", "embnb's", "speedup", "same options"],
            [
                [
                    shape(row),
                    f"{row['num_options']:,}",
                    median_range(row.get("enumerate_s_runs") or [row["enumerate_s"]], unit=" s"),
                    median_range(row.get("enumerate_embnb_s_runs", []), unit=" s"),
                    ratio_range(row.get("enumerate_s_runs", []), row.get("enumerate_embnb_s_runs", [])),
                    _yes(row.get("enumerate_same_options")),
                ]
                for row in data["rows"]
            ],
        ),
        "**embnb DP** (planning repeated; end to end is `create_planner(...).plan(module, sharders)` "
        "from a fresh module, enumeration included):",
        table(
            cells(
                "tables x devices | estimated rating | plans in | "
                "proposer s, partitioner s, proposals | end to end | "
                "same rating every run"
            ),
            [_embnb_dp_row(row) for row in data["rows"]],
        ),
        "**torchrec's proposers** (planned once each; a ratio's range spans embnb DP's runs; end to end is "
        "torchrec's enumeration plus the planning):",
        table(
            cells(
                "tables x devices | proposer | estimated rating / embnb DP | "
                "plans in | proposer s, partitioner s, proposals | "
                "plans in / embnb DP | end to end / embnb"
            ),
            [line for row in data["rows"] for line in _peer_rows(row)],
        ),
    ]
    if data.get("quality_vs_brute_force"):
        parts += [
            "**Plan quality against brute force** (every combination of options placed and rated by "
            "torchrec's own partitioner and perf model, on random tiny instances with binding HBM):",
            _quality_table(data["quality_vs_brute_force"]),
        ]
    return "\n\n".join(parts)


def _yes(flag: bool | None) -> str:
    return "-" if flag is None else ("yes" if flag else "**no**")


def _embnb_dp_row(row: dict[str, Any]) -> list[str]:
    dp = row["proposers"]["embnb DP"]
    return [
        shape(row),
        f"{sig(dp['perf_rating'], 5)} ms",
        median_range(dp.get("plan_s_runs") or [dp["plan_s"]], unit=" s"),
        f"{sig(dp['proposer_s'], 2)}, {sig(dp['partitioner_s'], 2)}, {dp['proposals']}",
        median_range(dp.get("end_to_end_s_runs", []), unit=" s"),
        _yes(dp.get("same_rating_every_run")),
    ]


def _peer_rows(row: dict[str, Any]) -> list[list[str]]:
    dp = row["proposers"]["embnb DP"]
    dp_plan = dp.get("plan_s_runs") or [dp["plan_s"]]
    dp_end = dp.get("end_to_end_s_runs", [])
    lines = []
    for name, peer in row["proposers"].items():
        if name == "embnb DP":
            continue
        if peer["perf_rating"] is None:
            rating = "no plan"
        else:
            rating = ratio_range([peer["perf_rating"]], [dp["perf_rating"]])
        cut = " (cut)" if peer.get("timed_out") else ""
        lines.append(
            [
                shape(row),
                name,
                rating,
                f"{sig(peer['plan_s'])} s{cut}",
                f"{sig(peer['proposer_s'], 2)}, {sig(peer['partitioner_s'], 2)}, {peer['proposals']}",
                ratio_range([peer["plan_s"]], dp_plan),
                ratio_range([peer["end_to_end_s"]], dp_end) if "end_to_end_s" in peer else "-",
            ]
        )
    return lines


def _quality_table(quality: list[dict[str, Any]]) -> str:
    rows = []
    for entry in quality:
        worst = "-" if entry["worst_ratio"] is None else f"{entry['worst_ratio']:.3f}x"
        within = "-" if entry["within_2pct"] is None else f"{sig(100 * entry['within_2pct'], 2)}%"
        rows.append(
            [
                str(entry["num_tables"]),
                entry["proposer"],
                str(entry["instances"]),
                str(entry.get("skipped", 0)),
                worst,
                within,
                str(entry["no_plan"]),
            ]
        )
    header = ["tables", "proposer", "instances", "skipped", "worst rating / optimum", "within 2%", "no plan"]
    return table(header, rows)


def end_to_end_section(run: Run) -> str:
    data = run.data
    rows = []
    per_row = any("storage_reservation" in row for row in data["rows"])  # each row names its own
    default_hbm = data.get("hbm_fraction")
    for row in data["rows"]:
        rss = row.get("fresh_peak_rss_gib_runs")
        hbm = row.get("hbm_fraction", default_hbm)
        rows.append(
            [
                shape(row) + ("" if hbm == default_hbm else f", HBM for {hbm:.0%} of the rows"),
                *(
                    [row.get("storage_reservation", data.get("storage_reservation", "?")).split(",")[0]]
                    * per_row
                ),
                median_range(row["import_s_runs"], unit=" s"),
                median_range(row["fresh_process_s_runs"], unit=" s"),
                median_range(row["in_process_s_runs"], unit=" s"),
                ratio_range(row["fresh_process_s_runs"], row["in_process_s_runs"]),
                f"{sig(row['in_process_rating'], 5)} ms",
                _yes(row.get("same_rating_everywhere")),
                median_range(rss, unit=" GiB") if rss else "-",
            ]
        )
    header = cells("tables x devices" + " | storage reservation" * per_row) + cells(
        "imports | plan, fresh process | "
        "plan, repeated in one process | fresh / repeated | estimated rating | "
        "same rating everywhere | peak RSS"
    )
    if any("torchrec_dp" in row for row in data["rows"]):  # torchrec's DP, in one more fresh process
        header += cells("torchrec DP: plans in | its rating / embnb's")
        for line, row in zip(rows, data["rows"]):
            line += _torchrec_dp_cells(row.get("torchrec_dp"), row)
    return "\n\n".join(
        [
            "## Planning once, in a fresh process",
            source(run),
            f"{data.get('processes', '?')} new processes per case, each timing one "
            "`create_planner(...).plan` on the planner bench's model after its imports (timed apart), "
            "against the same call repeated in the bench's own process; median and range."
            + (
                f" Each device's HBM holds {default_hbm:.0%} of the tables' fp32 rows, spread evenly, "
                "unless a row names its own share."
                if default_hbm
                else ""
            )
            + (
                f" Storage reservation: {data['storage_reservation']}."
                if data.get("storage_reservation") and not per_row
                else " Both planners plan each row under the storage reservation it names (0.15 of each "
                "device; the heuristical one also reserves dense parameters and KJTs)."
                if per_row
                else ""
            ),
            table(header, rows),
        ]
        + (
            [
                "torchrec DP: torchrec's EmbeddingShardingPlanner with its DynamicProgrammingProposer and "
                "its enumerator, in one more fresh process, cut at "
                f"{sig(data['torchrec_dp_timeout_s'])} s (checked between proposals, so its enumeration "
                "runs past it; *stopped*: still running well past the cut, with no plan by then)."
            ]
            if data.get("torchrec_dp_timeout_s")
            else []
        )
    )


def _torchrec_dp_cells(peer: dict[str, Any] | None, row: dict[str, Any]) -> list[str]:
    """torchrec's DP in a fresh process: its planning time, and its rating over embnb's."""
    if not peer:
        return ["-", "-"]
    if peer.get("stopped_for_memory_gib"):  # past the bench's memory limit for it
        return [f"not run: memory (past {sig(peer['stopped_for_memory_gib'])} GiB)", "no plan by then"]
    if peer.get("stopped_after_s"):  # still enumerating long past its limit
        return [f"stopped after {sig(peer['stopped_after_s'])} s", "no plan by then"]
    cut = " (cut)" if peer.get("timed_out") else ""
    rating = peer.get("rating")
    if rating is None or not math.isfinite(rating):
        return [f"{sig(peer['plan_s'])} s{cut}", "no plan"]
    return [f"{sig(peer['plan_s'])} s{cut}", ratio_range([rating], [row["in_process_rating"]])]


def enumerators_section(run: Run) -> str:
    data = run.data
    rows = []
    for row in data["rows"]:
        torchrec_runs, embnb_runs = row["torchrec_s_runs"], row["embnb_s_runs"]
        rows.append(
            [
                f"{row['model']}, {row['num_tables']} tables, {row['device']} x {shape(row).split(' x ')[1]}",
                f"{row['num_options']:,}",
                f"{row['distinct_shards']:,} / {row['num_shards']:,}",
                median_range(torchrec_runs, unit=" s"),
                median_range(embnb_runs, unit=" s"),
                median_range(row["embnb_estimators_s_runs"], unit=" s"),
                ratio_range(torchrec_runs, embnb_runs),
                ratio_range(torchrec_runs, row["embnb_estimators_s_runs"]),
                _yes(row.get("same_options")),
            ]
        )
    header = cells(
        "case | options | distinct / all shards | torchrec | embnb | "
        "torchrec's estimators inside embnb's | speedup | "
        "ceiling: torchrec / its estimators | same options"
    )
    return "\n\n".join(
        [
            "## Enumerators: torchrec's against embnb's DistinctShardEnumerator",
            source(run),
            f"Each case enumerated {data.get('repeats', '?')} times by each enumerator in one process "
            "(median and range; a ratio's range pairs every run with every run). `bench` is "
            "`make_model`'s tables; `mixed` is `make_mixed_model`'s weighted, multi-feature tables beside "
            "sequence tables, with UVM caches. The ceiling is what any enumerator that runs torchrec's "
            "estimators could reach.",
            table(header, rows),
        ]
    )


def ablation_section(run: Run) -> str:
    data = run.data
    parts = [
        "## Ablation: what each piece of the DP proposer buys",
        source(run),
        f"The pieces of the ablation's `LADDER` added one at a time, each planned in torchrec's planner "
        f"{data.get('repeats', '?')} times; the rating of the plan torchrec keeps (an estimate), planning "
        f"seconds as median (range); HBM holds {sig(100 * data['hbm_fraction'], 2)}% of the tables' rows.",
    ]
    for row in data["rows"]:
        rungs = [
            [
                name,
                f"{sig(rung['perf_rating'], 4)} ms",
                str(rung["plans_considered"]),
                str(rung["proposals"]),
                f"{sig(rung['plan_s'], 2)} s ({sig(rung['plan_s_min'], 2)}-{sig(rung['plan_s_max'], 2)})"
                + (" (cut)" if rung.get("timed_out") else ""),
                ", ".join(f"{k}={v}" for k, v in data.get("ladder", {}).get(name, {}).items()) or "all on",
            ]
            for name, rung in row["rungs"].items()
        ]
        header = ["rung", "estimated rating", "plans considered", "proposals", "plans in", "switches off"]
        parts += [f"**{shape(row)}**:", table(header, rungs)]
    return "\n\n".join(parts)


def _hosts(world: dict[str, Any]) -> str:
    """ "1 host of 8" or "2 hosts of 8" (files before local_world_size was recorded: one host)."""
    per_host = world.get("local_world_size") or world["world_size"]
    hosts = world["world_size"] // per_host
    return f"{hosts} host{'s' * (hosts != 1)} of {per_host}"


def steptime_section(run: Run) -> str:
    data = run.data
    topologies = " and ".join(sorted({w["compute_device"].upper() for w in data["worlds"]}))
    # On CUDA before CUDA events, "cpu" was a synchronized thread's CPU time: synchronize spin-waits,
    # so it equalled the wall time whatever bound the phase, and it is left out.
    cpu_clock = data.get("cpu_clock") or ("spin" if data["device"] == "cuda" else "thread")
    clocks = {
        "thread": "the rank thread's CPU time is the clock other jobs on the machine do not stretch, wall "
        "time is beside it",
        "enqueue": "each phase's time between CUDA events is the measure (the wall columns); the CPU "
        "time column is the time to enqueue it, nothing synchronized (the launches)",
        "spin": "wall time, the GPU synchronized at each phase's edges, is the measure; no CPU time is "
        "shown: the run timed the synchronized thread, whose spin-wait made it equal the wall time",
    }[cpu_clock]
    caps = {w.get("hbm_cap_gb") for w in data["worlds"]} - {None}
    capped = (
        f" The topology's HBM is capped at {' and '.join(f'{c:g}' for c in sorted(caps))} GiB per device, "
        "below the model's share: the planners put tables in UVM (FBGEMM's UVM and UVM-caching "
        "kernels, run as planned); the poor plans are built by hand, not planned."
        if caps
        else ""
    )
    parts = [
        "## Plans measured rank by rank" + (", HBM capped" if caps else ""),
        source(run),
        f"`make_model({data['model']['tables']}, seed={data['model']['seed']})` (largest table "
        f"{data['model']['max_rows']:,} rows) on a {topologies} topology, {data['batch_size']} "
        f"samples per rank: each plan's ranks run one after another on {run.machine} with real FBGEMM "
        f"kernels (forward, backward and {data['optimizer']}, {data['threads']} thread), median of "
        f"{data['repeats']} repeats. The critical path is the slowest rank's step (lookups and the dense "
        f"part); {clocks}. torchrec's rating is its estimate of the same plan. Spearman: rank correlation "
        "across the measured plans." + capped,
    ]
    for world in data["worlds"]:
        rows = []
        for plan in world["plans"]:
            if not plan.get("measured"):
                rows.append(
                    [plan["plan"], *["-"] * (3 if cpu_clock == "spin" else 4), plan.get("note") or "no plan"]
                )
                continue
            shards = ", ".join(f"{n} {kind}" for kind, n in plan["shape"].items() if kind != "shards")
            if plan.get("kernels"):
                shards += "; kernels: " + ", ".join(f"{n} {k}" for k, n in plan["kernels"].items())
            if "tbe_groups" in plan["ranks"][0]:  # recorded since issue #69: each rank's TBEs
                shards += f"; TBEs per rank up to {max(len(r['tbe_groups']) for r in plan['ranks'])}"
            rows.append(
                [
                    plan["plan"],
                    *([] if cpu_clock == "spin" else [f"{sig(plan['critical_path_cpu_s'] * 1e3)} ms"]),
                    f"{sig(plan['critical_path_s'] * 1e3)} ms",
                    f"{sig(plan['lookup_critical_path_s'] * 1e3)} ms",
                    f"{sig(plan['rating_s'] * 1e3)} ms",
                    f"{plan['shape'].get('shards', '?')} shards: {shards}",
                ]
            )
        header = cells(
            "plan | "
            + ("" if cpu_clock == "spin" else "critical path, CPU time | ")
            + "critical path, wall | slowest lookups, wall | torchrec's estimated rating | shape"
        )
        spearman = world["spearman_vs_rating"]
        by_cpu = "" if cpu_clock == "spin" else f"{sig(spearman['critical_path_cpu_s'], 2)} by CPU time, "
        parts += [
            f"W = {world['world_size']} ({world['compute_device']} topology, {_hosts(world)}): "
            f"Spearman against the rating {by_cpu}{sig(spearman['critical_path_s'], 2)} by wall time.",
            table(header, rows),
        ]
    return "\n\n".join(parts)


def sharders_section(run: Run) -> str:
    data, config = run.data, run.data["config"]
    rounds = data["seconds"]["torchrec"]
    parts = [
        "## Routed sharders: input distribution against torchrec's own",
        source(run),
        f"One launch of W = {data['world_size']} {data['backend']} ranks on the {data['device']} "
        f"({data['cores']} cores): two tables of {config['rows']:,} rows, "
        f"{data['ids_per_rank']:,} ids per rank (Zipf({config['alpha']}) ranks as ids), the same batch "
        "through torchrec's `ShardedEmbeddingBagCollection` and embnb's routed one, interleaved round by "
        "round; a round's time is its slowest rank's, the whole input distribution (the bucketing, "
        "FBGEMM's for torchrec's module and embnb's bucketize op for the routed ones, then torchrec's "
        "all-to-all, waited for). "
        "Issue 47 asks for at most 1.1x.",
    ]
    rows = [["torchrec (continuous)", median_range(rounds, unit=" s"), "1x"]]
    for routing, ratio in data["ratio_to_torchrec"].items():
        spread = f"{sig(ratio['median'])}x ({sig(ratio['low'])}-{sig(ratio['high'])} over {ratio['repeats']})"
        rows.append([f"embnb `{routing}`", median_range(data["seconds"][routing], unit=" s"), spread])
    header = ["sharded module", "input dist per batch, median (range)", "routed / torchrec per round"]
    return "\n\n".join([*parts, table(header, rows)])
