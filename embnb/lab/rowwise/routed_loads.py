"""Notebook 01's measured section: torchrec row-wise tables under each routing of embnb's sharders.

Three id streams (`case_ids`) go into one table of `num_embeddings` rows: `frequency` (Zipf ranks as
ids: id 0 the hottest), `strided` (`k * stride`; the stride does not know W), `hashed` (uniform raw
keys, `fmix64(key) % num_embeddings`). Each is laid out by `embnb.rowwise.TableLayout` at each W;
the ids per rank are counted from the layout, then each rank's lookups are replayed with real
kernels, one rank after another (`embnb.steptime.measure_ranks` on the storage slots in torchrec's
contiguous blocks: each rank looks up the local rows the routed sharder's input distribution sends
it). `train_rank` trains a small DMP model with the sharder on real gloo ranks and counts the ids
torchrec's input all-to-all delivers to each rank.
"""

from __future__ import annotations

import statistics
import warnings
from dataclasses import asdict, dataclass

import torch

from embnb._checks import check_choice, check_int
from embnb.data import make_keys, zipf_probs
from embnb.lab.rowwise.aliasing import into_table
from embnb.metrics import max_over_mean
from embnb.rowwise import Routing, TableLayout
from embnb.steptime import batch_from_keys
from embnb.steptime.measure import StepOptions, measure_ranks
from embnb.steptime.work import routing_work

__all__ = [
    "CASES",
    "ROUTINGS",
    "LoadsConfig",
    "RoutedCase",
    "RoutedLoads",
    "case_ids",
    "measure_loads",
    "TrainConfig",
    "train_rank",
]

CASES = ("frequency", "strided", "hashed")
ROUTINGS = tuple(r.value for r in Routing)
TABLE = "table"


def case_ids(
    case: str, num_ids: int, num_embeddings: int, stride: int, alpha: float, seed: int
) -> torch.Tensor:
    """`num_ids` ids in [0, num_embeddings) of one stream (module docstring)."""
    check_choice("case", case, CASES)
    check_int("num_embeddings", num_embeddings, low=1)
    gen = torch.Generator().manual_seed(seed)
    if case == "frequency":  # inverse CDF of Zipf(alpha) over the vocabulary: the rank is the id
        cdf = torch.cumsum(zipf_probs(num_embeddings, alpha).to(torch.float64), 0)
        ranks = torch.searchsorted(cdf, torch.rand(num_ids, generator=gen, dtype=torch.float64) * cdf[-1])
        return ranks.clamp_(max=num_embeddings - 1)
    if case == "strided":
        check_int("stride", stride, low=1, high=num_embeddings)
        return torch.randint(0, -(-num_embeddings // stride), (num_ids,), generator=gen) * stride
    return into_table(make_keys("uniform", num_ids, seed), num_embeddings, "hash")


@dataclass(frozen=True)
class LoadsConfig:
    """What section 8's rank-by-rank replay measures (defaults: the notebook's)."""

    world_sizes: tuple[int, ...] = (8, 64)
    cases: tuple[str, ...] = CASES
    routings: tuple[str, ...] = ROUTINGS
    ids_per_rank: int = 2048  # ids in each rank's local batch
    bag_size: int = 16  # ids per bag
    num_embeddings: int = 1_048_576  # rows of the table
    embedding_dim: int = 64
    stride: int = 8  # the strided stream's stride
    alpha: float = 1.05  # Zipf exponent of the frequency-numbered vocabulary
    threads: int = 1  # intra-op threads while a rank is replayed
    warmup: int = 1
    repeats: int = 5
    seed: int = 0


@dataclass(frozen=True)
class RoutedCase:
    """One (case, W, routing): per rank, its storage rows, the ids it owns (counted from the
    layout), the ids the replayed lookup received, and the lookup's median time in ms
    (forward + backward with the fused optimizer; thread CPU time and wall time)."""

    case: str
    world_size: int
    routing: str
    rows_per_rank: list[int]
    ids_per_rank: list[int]
    ids_replayed: list[int]
    lookup_ms: list[float]
    lookup_wall_ms: list[float]
    lookup_ms_range: list[list[float]]  # per rank: [min, max] over repeats, thread CPU time

    @property
    def ids_max_over_mean(self) -> float:
        return max_over_mean(self.ids_per_rank)

    @property
    def time_max_over_mean(self) -> float:
        return max_over_mean(self.lookup_ms)

    def to_json(self) -> dict:
        return {
            **asdict(self),
            "ids_max_over_mean": self.ids_max_over_mean,
            "time_max_over_mean": self.time_max_over_mean,
            "busiest_rank": self.ids_per_rank.index(max(self.ids_per_rank)),
            "slowest_rank": self.lookup_ms.index(max(self.lookup_ms)),
        }


@dataclass(frozen=True)
class RoutedLoads:
    config: LoadsConfig
    cases: list[RoutedCase]
    machine: str

    def case(self, case: str, world_size: int, routing: str) -> RoutedCase:
        return next(c for c in self.cases if (c.case, c.world_size, c.routing) == (case, world_size, routing))

    def to_json(self) -> dict:
        return {
            "config": asdict(self.config),
            "machine": self.machine,
            "clock": "cpu",
            "cases": [c.to_json() for c in self.cases],
        }


def measure_case(ids: torch.Tensor, layout: TableLayout, config: LoadsConfig, case: str) -> RoutedCase:
    """Rank by rank, the lookups of the global batch `ids` (rank 0's local ids first) under `layout`:
    torchrec's blocks over the storage slots (each rank the local rows the sharder sends it); no
    collectives counted."""
    w = layout.world_size
    batch = batch_from_keys(list(layout.slots(ids).view(w, -1)), config.bag_size, table=TABLE)
    rows, dims, block = (
        {TABLE: layout.storage_rows},
        {TABLE: config.embedding_dim},
        {TABLE: layout.block_size},
    )
    times = measure_ranks(
        lambda rank: routing_work(batch, "continuous", rows, dims, rank, block),
        w,
        options=StepOptions(
            threads=config.threads,
            warmup=config.warmup,
            repeats=config.repeats,
            hidden=(8,),  # the dense part at its smallest: every rank has the same local batch
        ),
    )
    return RoutedCase(
        case,
        w,
        layout.routing.value,
        layout.rows_per_rank(),
        torch.bincount(layout.owner(ids), minlength=w).tolist(),
        [r.num_ids for r in times.ranks],
        [r.lookup.median_s("cpu") * 1e3 for r in times.ranks],
        [r.lookup.median_s("wall") * 1e3 for r in times.ranks],
        [[t * 1e3 for t in r.lookup.range_s("cpu")] for r in times.ranks],
    )


def measure_loads(config: LoadsConfig, progress: bool = False) -> RoutedLoads:
    """Every (case, W, routing) of `config`; one global batch per (case, W), the same for each routing."""
    grid = [(case, w) for w in config.world_sizes for case in config.cases]
    if progress:
        from tqdm.auto import tqdm

        grid = tqdm(grid, desc="case, W", leave=False)
    cases = []
    for case, w in grid:
        check_int("world_size", w, low=2)
        ids = case_ids(
            case, w * config.ids_per_rank, config.num_embeddings, config.stride, config.alpha, config.seed
        )
        for routing in config.routings:
            layout = TableLayout(config.num_embeddings, w, routing, config.seed)
            cases.append(measure_case(ids, layout, config, case))
    from embnb.timing import machine_name

    return RoutedLoads(config, cases, machine_name("cpu"))


def summary_rows(loads: RoutedLoads) -> list[dict]:
    """Per (case, W, routing): ids and time max/mean, and the slowest rank's ms."""
    return [
        {
            "case": c.case,
            "W": c.world_size,
            "routing": c.routing,
            "ids max/mean": c.ids_max_over_mean,
            "time max/mean (cpu)": c.time_max_over_mean,
            "slowest rank ms (cpu)": max(c.lookup_ms),
            "median rank ms (cpu)": statistics.median(c.lookup_ms),
        }
        for c in loads.cases
    ]


@dataclass(frozen=True)
class TrainConfig:
    """The small DMP model of section 8: one row-wise table and a linear head, trained on
    frequency-numbered ids (the `frequency` stream)."""

    num_embeddings: int = 4096
    embedding_dim: int = 16
    batch_size: int = 64  # samples per rank per step
    bag_size: int = 8
    alpha: float = 1.05
    steps: int = 5
    learning_rate: float = 0.05
    seed: int = 0


def _local_batch(config: TrainConfig, rank: int, step: int):
    from torchrec import KeyedJaggedTensor

    num = config.batch_size * config.bag_size
    ids = case_ids("frequency", num, config.num_embeddings, 1, config.alpha, config.seed + 1000 * step + rank)
    kjt = KeyedJaggedTensor.from_lengths_sync(
        keys=["f"], values=ids, lengths=torch.full((config.batch_size,), config.bag_size)
    )
    label = (ids.view(config.batch_size, -1) < 16).float().mean(1)  # a target that needs the rows
    return ids, kjt, label


def train_rank(rank: int, world_size: int, routing: str, config: TrainConfig) -> dict:
    """On this rank: shard one EBC table row-wise with the routed sharder under DMP, train
    `config.steps` steps (fused SGD on the table, SGD on the head) and count, per step, the ids
    torchrec's input all-to-all delivers to this rank. Returns the losses, the ids
    received, this rank's local rows, and its local batches' ids (for the parent's oracle)."""
    import torch.distributed as dist
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from torch import nn
    from torchrec import EmbeddingBagCollection, EmbeddingBagConfig
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.distributed.sharding_plan import construct_module_sharding_plan, row_wise
    from torchrec.distributed.types import ShardingEnv, ShardingPlan

    from embnb.rowwise import RoutedEmbeddingBagCollectionSharder
    from embnb.rowwise.sharded_rows import weight_key

    # torchrec 1.8's sharded modules call c10d's deprecated reduce_scatter_tensor and
    # all_gather_into_tensor: a FutureWarning per rank that a user of torchrec cannot act on
    warnings.filterwarnings("ignore", r".*is deprecated\. Please use .*", FutureWarning)
    torch.manual_seed(config.seed)
    table = EmbeddingBagConfig(
        name=TABLE,
        embedding_dim=config.embedding_dim,
        num_embeddings=config.num_embeddings,
        feature_names=["f"],
    )

    class Model(nn.Module):
        def __init__(self, device: torch.device) -> None:
            super().__init__()
            self.ebc = EmbeddingBagCollection(tables=[table], device=device)
            self.head = nn.Linear(config.embedding_dim, 1)

        def forward(self, kjt):
            return self.head(self.ebc(kjt)["f"]).squeeze(1)

    fused = {"optimizer": EmbOptimType.EXACT_SGD, "learning_rate": config.learning_rate}
    sharder = RoutedEmbeddingBagCollectionSharder({TABLE: routing}, fused_params=fused)
    model = Model(torch.device("meta"))
    plan = construct_module_sharding_plan(
        model.ebc,
        {TABLE: row_wise(compute_kernel="fused")},
        sharder=sharder,
        local_size=world_size,
        world_size=world_size,
        device_type="cpu",
    )
    with warnings.catch_warnings():
        # torchrec's own DDP wrapping passes DDP's deprecated `broadcast_buffers`:
        # nothing a reader can act on, printed once per rank in `make run`
        warnings.filterwarnings("ignore", message="`broadcast_buffers` is deprecated", category=FutureWarning)
        dmp = DistributedModelParallel(
            model,
            env=ShardingEnv.from_process_group(dist.group.WORLD),
            device=torch.device("cpu"),
            plan=ShardingPlan({"ebc": plan}),
            sharders=[sharder],
        )
    received: list[int] = []
    sharded = dmp.module.ebc
    head = torch.optim.SGD([p for n, p in dmp.named_parameters() if "head" in n], lr=config.learning_rate)
    losses, local_ids = [], []
    for step in range(config.steps):
        ids, kjt, label = _local_batch(config, rank, step)
        local_ids.append(ids)
        # what torchrec's row-wise input all-to-all delivers to this rank for this batch (the
        # sharder's public input_dist, run once more beside the step: every rank calls it in turn)
        with torch.no_grad():
            delivered = sharded.input_dist(sharded.create_context(), kjt).wait().wait()
        received.append(_kjt_ids(delivered))
        head.zero_grad()
        loss = ((dmp(kjt) - label) ** 2).mean()
        loss.backward()
        head.step()
        losses.append(float(loss.detach()))
    (shard,) = sharded.state_dict()[weight_key(sharded, TABLE)].local_shards()
    return {
        "routing": str(sharded.routings[TABLE]),
        "losses": losses,
        "ids_received": received,
        "local_rows": int(shard.tensor.shape[0]),
        "local_ids": [i.tolist() for i in local_ids],
    }


def _kjt_ids(features) -> int:
    """Ids in a KeyedJaggedTensor, or in a list of them (torchrec's KJTList)."""
    if not hasattr(features, "values"):
        return sum(_kjt_ids(f) for f in features)
    return features.values().numel()


def received_by_layout(
    local_ids: list[list[list[int]]], routing: str, config: TrainConfig
) -> list[list[int]]:
    """Per step, per rank: the ids the layout says each rank owns in that step's global batch
    (`local_ids[rank][step]`: a rank's local ids), the count each rank's lookup should receive."""
    world_size = len(local_ids)
    layout = TableLayout(config.num_embeddings, world_size, routing, config.seed)
    steps = []
    for step in range(len(local_ids[0])):
        ids = torch.tensor([i for rank_ids in local_ids for i in rank_ids[step]], dtype=torch.int64)
        steps.append(torch.bincount(layout.owner(ids), minlength=world_size).tolist())
    return steps


def training_rows(runs: dict[str, list[dict]], config: TrainConfig) -> list[dict]:
    """Per routing of the DMP run: each rank's local rows and ids received over all steps, whether
    they equal the layout's count, and the losses of rank 0 (first and last step)."""
    rows = []
    for routing, ranks in runs.items():
        expected = received_by_layout([r["local_ids"] for r in ranks], routing, config)
        received = [[r["ids_received"][s] for r in ranks] for s in range(config.steps)]
        totals = [sum(step[r] for step in received) for r in range(len(ranks))]
        rows.append(
            {
                "routing": routing,
                "routing_on_module": ranks[0]["routing"],
                "local_rows": [r["local_rows"] for r in ranks],
                "ids_received": totals,
                "ids_max_over_mean": max_over_mean(totals),
                "received_equals_layout": received == expected,
                "loss_first": ranks[0]["losses"][0],
                "loss_last": ranks[0]["losses"][-1],
            }
        )
    return rows


IMBALANCED = 2.0  # ids max/mean from which a case counts as imbalanced in `describe`
SAME = 1.1  # routings whose ids max/mean are within this factor balance a stream alike


def _spread(loads: RoutedLoads, case: str, w: int) -> float:
    ratios = [loads.case(case, w, r).ids_max_over_mean for r in loads.config.routings]
    return max(ratios) / min(ratios)


def busiest_slower(c: RoutedCase) -> bool:
    """The ranks owning the most ids measured a longer median lookup than the median of the others."""
    top = max(c.ids_per_rank)
    busiest = [t for n, t in zip(c.ids_per_rank, c.lookup_ms) if n == top]
    rest = [t for n, t in zip(c.ids_per_rank, c.lookup_ms) if n != top]
    return bool(rest) and statistics.median(busiest) > statistics.median(rest)


@dataclass(frozen=True)
class TimeClaims:
    """What the replay's times show, counted once for `describe` and `summary_part`."""

    steps: list[dict]  # per (stream, W) whose routings differ: the least balanced routing against the step
    slowest: int  # of `steps`: its slowest rank is the slowest of all routings' (the step waits for it)
    heavy: list[RoutedCase]  # cases with ids max/mean >= IMBALANCED
    slower: int  # of `heavy`: the busiest ranks measured slower than the others' median
    below: int  # of `heavy`: lookup time max/mean below ids max/mean

    @property
    def ratios(self) -> str:
        return ", ".join(
            f"{r['case']} W={r['world_size']} {r['routing']} {r['step_ratio']:.2f}x" for r in self.steps
        )


def time_claims(loads: RoutedLoads) -> TimeClaims:
    steps = []
    for case in loads.config.cases:
        for w in loads.config.world_sizes:
            if _spread(loads, case, w) < SAME:
                continue
            cases = [loads.case(case, w, r) for r in loads.config.routings]
            worst = max(cases, key=lambda c: c.ids_max_over_mean)
            others = [max(c.lookup_ms) for c in cases if c is not worst]
            slowest = max(worst.lookup_ms)
            steps.append(
                dict(
                    case=case,
                    world_size=w,
                    routing=worst.routing,
                    slowest_of_all=slowest > max(others),
                    step_ratio=slowest / min(others),
                )
            )
    heavy = [c for c in loads.cases if c.ids_max_over_mean >= IMBALANCED]
    return TimeClaims(
        steps,
        sum(r["slowest_of_all"] for r in steps),
        heavy,
        sum(busiest_slower(c) for c in heavy),
        sum(c.time_max_over_mean < c.ids_max_over_mean for c in heavy),
    )


def describe(loads: RoutedLoads) -> list[str]:
    """What the replay shows, one sentence per stream and a few on time, generated from its numbers."""
    config, claims, lines = loads.config, time_claims(loads), []
    for case in config.cases:
        per_w = "; ".join(
            f"W={w}: "
            + ", ".join(
                f"{c.routing} {c.ids_max_over_mean:.2f} ({c.time_max_over_mean:.2f})"
                for c in (loads.case(case, w, r) for r in config.routings)
            )
            for w in config.world_sizes
        )
        alike = all(_spread(loads, case, w) < SAME for w in config.world_sizes)
        verdict = f"every routing within {SAME:g}x of the others at every W: routing changes nothing here"
        lines.append(
            f"{case} ids, max/mean of ids per rank (of lookup time): {per_w}; "
            f"{verdict if alike else 'the routings differ'}."
        )
    lines.append(
        f"Where the routings differ (ids max/mean {SAME:g}x apart or more), the routing with the least "
        f"balanced ids had the slowest rank of all routings in {claims.slowest} of {len(claims.steps)} "
        f"(stream, W) pairs; its slowest rank's lookup over the other routings' fastest slowest rank: "
        f"{claims.ratios}."
    )
    lines.append(
        f"In {claims.slower} of {len(claims.heavy)} cases with ids max/mean >= {IMBALANCED:g}, the ranks "
        "owning the most ids measured slower lookups than the median of the other ranks."
    )
    if claims.heavy:
        worst = max(claims.heavy, key=lambda c: c.ids_max_over_mean)
        lines.append(
            f"Lookup time max/mean is below ids max/mean in {claims.below} of those {len(claims.heavy)} "
            f"cases; at the largest, {worst.case} ids under {worst.routing} at W={worst.world_size}: ids "
            f"{worst.ids_max_over_mean:.2f}, time {worst.time_max_over_mean:.2f}."
        )
    balanced = [c.time_max_over_mean for c in loads.cases if c.ids_max_over_mean < SAME]
    if balanced:
        lines.append(
            f"Where the ids are balanced (max/mean < {SAME:g}, {len(balanced)} cases) the lookup time's "
            f"max/mean is {min(balanced):.2f} to {max(balanced):.2f}: the replay's rank-to-rank spread, "
            "not the ids."
        )
    return lines


def summary_part(loads: RoutedLoads, training: list[dict]) -> str:
    """Section 8 for the one-line summary: the routings' ids max/mean per stream and W, what the
    times show, and whether the DMP ranks received what the layouts count."""
    config, claims = loads.config, time_claims(loads)
    streams = "; ".join(
        f"{case} ids "
        + ", ".join(
            f"W={w} " + " / ".join(f"{loads.case(case, w, r).ids_max_over_mean:.2f}" for r in config.routings)
            for w in config.world_sizes
        )
        for case in config.cases
    )
    return (
        f"torchrec row-wise with embnb's sharders, ids max/mean per rank ({' / '.join(config.routings)}): "
        f"{streams}; measured (CPU, replayed rank by rank), the routing with the least balanced ids had "
        f"the slowest rank in {claims.slowest} of {len(claims.steps)} (stream, W) pairs where the routings "
        f"differ ({claims.ratios} the others' fastest slowest rank), lookup time max/mean is below ids "
        f"max/mean in {claims.below} of {len(claims.heavy)} cases with ids max/mean >= {IMBALANCED:g}, and "
        f"the ranks owning the most ids measured slower in {claims.slower} of them; DMP ranks received the "
        f"layout's ids: {all(row['received_equals_layout'] for row in training)}"
    )
