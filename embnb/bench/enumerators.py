"""torchrec's EmbeddingEnumerator against embnb's DistinctShardEnumerator on
models beyond the planner bench's: `python -m embnb.bench enumerators`.

Cases: `make_model`'s tables (one EmbeddingBagCollection, one feature per
table) on GPU and CPU topologies, and `make_mixed_model`'s (weighted tables
that several features read, each with its pooling factor, beside sequence
tables in an EmbeddingCollection; UVM caches, with statistics, on GPUs).
Each enumerator enumerates each case `--repeats` times in one process
(median and range); the first enumerations are checked to hold the same
options (`same_options`: option by option, floats to the bit).

Also measured on embnb's side: the seconds its enumeration spends inside
torchrec's own estimators, which it runs unchanged (once per distinct shard
size of an option). torchrec's time over those seconds is the most an
enumerator that runs torchrec's estimators could gain (`speedup_ceiling`).

    python -m embnb.bench enumerators [--tables 200] [--repeats 3] [--out DIR]
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time
from dataclasses import dataclass

import torch
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.planner.enumerators import EmbeddingEnumerator
from torchrec.modules.embedding_modules import EmbeddingBagCollection

from embnb import planner
from embnb._torchrec_private import estimators_of
from embnb.bench.results import add_out_argument, quiet_torchrec_logs, spread, write_results
from embnb.lab.planner.models import MixedModel, fused_table_gb, make_mixed_model, make_model
from embnb.planner.enumerator import DistinctShardEnumerator, same_options
from embnb.timing import Stopwatch, machine_name

BATCH_SIZE = 512


@dataclass(frozen=True)
class Case:
    model: str  # "bench" (make_model's tables) or "mixed" (make_mixed_model)
    device: str
    world_size: int
    local_world_size: int | None = None  # None: one host


CASES = (
    Case("bench", "cuda", 8),
    Case("bench", "cuda", 64, 8),
    Case("bench", "cpu", 8),
    Case("bench", "cpu", 32, 8),
    Case("mixed", "cuda", 8),
    Case("mixed", "cuda", 64, 8),
    Case("mixed", "cpu", 16, 4),
)


def _model(case: Case, num_tables: int) -> MixedModel:
    if case.model == "mixed":
        return make_mixed_model(num_tables, seed=0, uvm_caching=case.device == "cuda")
    model = make_model(num_tables, seed=0)
    module = EmbeddingBagCollection(tables=model.tables, device=torch.device("meta"))
    return MixedModel(module, [EmbeddingBagCollectionSharder()], model.constraints, model.tables)


class _EstimatorClock:
    """Seconds spent in the `estimate` of each of an enumerator's estimators."""

    def __init__(self, enumerator: EmbeddingEnumerator) -> None:
        self.watch = Stopwatch()
        for estimator in estimators_of(enumerator):
            estimator.estimate = self._timed(estimator.estimate)  # on the instance: its type is unchanged

    @property
    def seconds(self) -> float:
        return self.watch.total_s

    def _timed(self, estimate):
        def timed(*args, **kwargs):
            with self.watch:
                return estimate(*args, **kwargs)

        return timed


def bench_case(case: Case, num_tables: int, repeats: int) -> dict:
    model = _model(case, num_tables)
    fused_gb = fused_table_gb(model.tables)
    caps = (
        {"hbm_cap_gb": fused_gb / case.world_size * 0.5}
        if case.device == "cuda"
        else {"ddr_cap_gb": fused_gb / case.world_size * 2}
    )
    topology = planner.make_topology(
        case.world_size, case.device, local_world_size=case.local_world_size, **caps
    )
    runs: dict[str, list[float]] = {"torchrec": [], "embnb": []}
    estimators_s, first = [], {}
    for name, kind in (("torchrec", EmbeddingEnumerator), ("embnb", DistinctShardEnumerator)):
        for _ in range(repeats):
            gc.collect()  # each run starts from a heap without the last run's garbage
            enumerator = kind(topology, BATCH_SIZE, model.constraints)
            clock = _EstimatorClock(enumerator) if name == "embnb" else None
            with Stopwatch() as watch:
                options = enumerator.enumerate(model.module, model.sharders)
            runs[name].append(watch.wall_s)
            if clock:
                estimators_s.append(clock.seconds)
            first.setdefault(name, options)
            del enumerator, options
    options = first["torchrec"]
    torchrec_s, embnb_s = statistics.median(runs["torchrec"]), statistics.median(runs["embnb"])
    return {
        "model": case.model,
        "num_tables": len(model.tables),
        "device": case.device,
        "world_size": case.world_size,
        "local_world_size": topology.local_world_size,
        "num_options": len(options),
        "num_shards": sum(len(o.shards) for o in options),
        "distinct_shards": sum(len({tuple(s.size) for s in o.shards}) for o in options),
        "uvm_caching_options": sum(o.compute_kernel == "fused_uvm_caching" for o in options),
        "cache_statistics_options": sum(bool(o.cache_params and o.cache_params.stats) for o in options),
        "multi_feature_options": sum(len(o.input_lengths) > 1 for o in options),
        "same_options": same_options(options, first["embnb"]),
        "torchrec_s": torchrec_s,
        "torchrec_s_runs": runs["torchrec"],
        "embnb_s": embnb_s,
        "embnb_s_runs": runs["embnb"],
        "embnb_estimators_s": statistics.median(estimators_s),
        "embnb_estimators_s_runs": estimators_s,
        "speedup": torchrec_s / embnb_s,
        "speedup_ceiling": torchrec_s / statistics.median(estimators_s),
    }


def _line(row: dict) -> str:
    hosts = row["world_size"] // row["local_world_size"]
    return (
        f"{row['model']:5s} {row['num_tables']:4d} tables, {row['device']:4s} x {row['world_size']:2d} "
        f"({hosts} host{'s' if hosts > 1 else ''}), {row['num_options']} options, "
        f"{row['distinct_shards']}/{row['num_shards']} distinct shards: "
        f"torchrec {spread(row['torchrec_s_runs'], 3)}, "
        f"embnb {spread(row['embnb_s_runs'], 3)} (torchrec's estimators {row['embnb_estimators_s']:.3f} s), "
        f"{row['speedup']:.1f}x (ceiling {row['speedup_ceiling']:.1f}x), "
        f"{'same options' if row['same_options'] else 'OPTIONS DIFFER'}"
    )


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m embnb.bench enumerators", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--tables", type=int, default=200, help="tables per model (mixed: and a quarter more)"
    )
    parser.add_argument("--repeats", type=int, default=3, help="enumerations per enumerator and case")
    add_out_argument(parser)
    opts = parser.parse_args(argv)
    if opts.tables < 1 or opts.repeats < 1:
        parser.error(f"--tables and --repeats must be >= 1, got {opts.tables}, {opts.repeats}")
    quiet_torchrec_logs()
    start, rows = time.perf_counter(), []
    for case in CASES:
        rows.append(bench_case(case, opts.tables, opts.repeats))
        print(_line(rows[-1]), flush=True)
    payload = {
        "benchmark": "enumerators",
        "machine": machine_name(),
        "batch_size": BATCH_SIZE,
        "repeats": opts.repeats,
        "rows": rows,
        "bench_s": time.perf_counter() - start,
    }
    print(f"wrote {write_results('enumerators', payload, opts.out)}")
    return 0
