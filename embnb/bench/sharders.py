"""`python -m embnb.bench sharders`: the routed sharder's input distribution against torchrec's own.

One launch of W gloo ranks on the CPU shards the same two-table EmbeddingBagCollection row-wise three
ways: torchrec's own `ShardedEmbeddingBagCollection` (continuous blocks) and the routed one under
`roundrobin` and `feistel_roundrobin`. Each rank feeds all three the same KeyedJaggedTensor (Zipf ids,
a vocabulary numbered by frequency); a call is one whole input distribution, bucketing and all-to-all,
waited for (`input_dist(ctx, kjt).wait().wait()`), the three interleaved round by round
(`embnb.timing.interleaved_seconds`); a round's time is its slowest rank's. Reported: routed / torchrec
per round, median and range.
"""

from __future__ import annotations

import argparse
import os
import time
from functools import partial
from typing import Any

import torch

from embnb.bench.results import add_out_argument, quiet_torchrec_logs, write_results
from embnb.dist import launch
from embnb.lab.rowwise.routed_loads import case_ids
from embnb.timing import interleaved_seconds, paired_ratio

ROUTINGS = ("roundrobin", "feistel_roundrobin")
TABLES = ("item_table", "user_table")  # not "items": a ModuleDict attribute


def _module(rows: int, dim: int):
    from torchrec import EmbeddingBagCollection, EmbeddingBagConfig

    configs = [
        EmbeddingBagConfig(name=t, embedding_dim=dim, num_embeddings=rows, feature_names=[f"f_{t}"])
        for t in TABLES
    ]
    return EmbeddingBagCollection(tables=configs, device=torch.device("meta"))


def _sharded(world_size: int, rows: int, dim: int, routing: str | None):
    """torchrec's own row-wise module (routing None) or the routed one."""
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.sharding_plan import construct_module_sharding_plan, row_wise
    from torchrec.distributed.types import ShardingEnv

    from embnb.rowwise import RoutedEmbeddingBagCollectionSharder

    module = _module(rows, dim)
    routed = RoutedEmbeddingBagCollectionSharder(dict.fromkeys(TABLES, routing or "continuous"))
    # torchrec's sharder offers row_wise on CUDA only, so the plan comes from the routed sharder;
    # the plan is the same (continuous blocks), the sharded module torchrec's own.
    plan = construct_module_sharding_plan(
        module,
        {t: row_wise(compute_kernel="fused") for t in TABLES},
        sharder=routed,
        local_size=world_size,
        world_size=world_size,
        device_type="cpu",
    )
    env = ShardingEnv.from_process_group(torch.distributed.group.WORLD)
    sharder = routed if routing else EmbeddingBagCollectionSharder()
    return sharder.shard(module, plan, env, torch.device("cpu"))


def _batch(rank: int, rows: int, batch: int, pooling: int, alpha: float):
    """Zipf(alpha) ranks as ids (id 0 the most frequent: appendix 01a's `frequency` stream)."""
    from torchrec import KeyedJaggedTensor

    ids = case_ids("frequency", batch * pooling * len(TABLES), rows, 1, alpha, seed=rank)
    lengths = torch.full((batch * len(TABLES),), pooling, dtype=torch.int64)
    return KeyedJaggedTensor.from_lengths_sync(keys=[f"f_{t}" for t in TABLES], values=ids, lengths=lengths)


def _input_dist(module, kjt) -> None:
    module.input_dist(module.create_context(), kjt).wait().wait()


def rank_seconds(rank: int, world_size: int, config: dict[str, Any]) -> dict[str, list[float]]:
    """On each rank: seconds per input distribution of each module, round by round."""
    quiet_torchrec_logs()
    modules = {
        r or "torchrec": _sharded(world_size, config["rows"], config["dim"], r) for r in [None, *ROUTINGS]
    }
    kjt = _batch(rank, config["rows"], config["batch"], config["pooling"], config["alpha"])
    calls = {name: partial(_input_dist, module, kjt) for name, module in modules.items()}
    times, _ = interleaved_seconds(calls, config["repeats"], config["warmup"], threads=1)
    return times


def run(world_size: int, config: dict[str, Any]) -> dict[str, Any]:
    load_before, start = os.getloadavg(), time.perf_counter()
    per_rank = launch(rank_seconds, world_size, config, device="cpu", timeout_s=600)
    slowest = {  # a round's time: its slowest rank's
        name: [max(ranks) for ranks in zip(*(times[name] for times in per_rank))] for name in per_rank[0]
    }
    ratios = {r: paired_ratio(slowest[r], slowest["torchrec"]) for r in ROUTINGS}
    return {
        "world_size": world_size,
        "backend": "gloo",
        "device": "cpu",
        "cores": os.cpu_count(),
        "config": config,
        "ids_per_rank": config["batch"] * config["pooling"] * len(TABLES),
        "seconds": slowest,
        "ratio_to_torchrec": {r: ratio.as_dict() for r, ratio in ratios.items()},
        "load_average_before": list(load_before),
        "load_average_after": list(os.getloadavg()),
        "torch": torch.__version__,
        "bench_s": time.perf_counter() - start,
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m embnb.bench sharders", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--world-size", type=int, default=8)
    parser.add_argument("--rows", type=int, default=1_000_000, help="rows per table")
    parser.add_argument("--dim", type=int, default=16)
    parser.add_argument("--batch", type=int, default=512, help="samples per rank")
    parser.add_argument("--pooling", type=int, default=16, help="ids per sample and table")
    parser.add_argument("--alpha", type=float, default=1.05, help="Zipf exponent of the ids")
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--no-write", action="store_true")
    add_out_argument(parser)
    args = parser.parse_args(argv)
    if args.world_size < 2:
        parser.error(f"--world-size must be at least 2, got {args.world_size}")
    config = {k: getattr(args, k) for k in ("rows", "dim", "batch", "pooling", "alpha", "repeats", "warmup")}
    payload = run(args.world_size, config)
    for routing, ratio in payload["ratio_to_torchrec"].items():
        print(
            f"W={args.world_size} {routing}: input dist {ratio['median']:.2f}x torchrec's "
            f"({ratio['low']:.2f}-{ratio['high']:.2f} over {ratio['repeats']} rounds)"
        )
    if not args.no_write:
        print(f"wrote {write_results('sharders', payload, args.out)}")
    return 0
