"""Balanced data-parallel training with the balancer hidden behind compute.

`BalancedShuffle` moves every sample of the global batch to the rank that
Karmarkar-Karp (`embnb.balancing.partition.balance`) assigns it to:

1. `start(kjt, dense, workloads)`: one all-gather of every rank's per-sample
   workloads (with the dense per-sample features and labels riding along),
   then KK, in a one-worker background thread when `overlap` is on;
2. the caller runs the current step's forward and backward meanwhile;
3. `finish()`: wait for the parts, all-gather the KJTs in two collectives
   (`embnb.balancing.kjt_gather.allgather_kjt`) and keep this rank's samples.

Every rank computes the same parts from the same gathered workloads, so no
broadcast is needed. The native KK releases the GIL, so the thread does not
stall the training loop's Python; the pure-Python KK does (compare both).

`train(rank, world_size, config)` runs a small sequence model (embeddings,
one attention block, a regression head) for a few steps in one of three
modes, "none" (no balancing), "sync" (balance before each step) and
"overlap", recording a `Timeline`: per rank and step, the spans load,
gather_workloads, kk (in the thread), wait_kk, exchange, forward, backward.
`hidden_fraction` says how much of the KK time the main thread never waited
for. `train_modes` runs several configs in one launch:

    launch(train_modes, 4, [{"mode": "none"}, {"mode": "overlap"}])

On a GPU (nccl) the model runs on the GPU while KK runs on a CPU thread.
"""

from __future__ import annotations

import contextlib
import statistics
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from embnb.balancing import partition as balancer
from embnb.balancing.kjt_gather import allgather_kjt, compare_gathers, select_samples

__all__ = [
    "DEFAULT_CONFIG",
    "MODES",
    "Timeline",
    "AttentionBlock",
    "SequenceModel",
    "make_local_batch",
    "sample_workloads",
    "BalancedShuffle",
    "hidden_fraction",
    "train",
    "train_modes",
    "gather_and_train",
    "summarize",
]

MODES = ("none", "sync", "overlap")
SEQUENCE_KEYS = ["item_id", "category_id"]

DEFAULT_CONFIG: dict[str, Any] = {
    "mode": "overlap",  # none | sync | overlap
    "kk_backend": "auto",  # native | python | auto (embnb.balancing.partition.balance)
    "method": "kk_swap",  # a name of embnb.balancing.partition.METHODS
    "workload": "flops",  # flops (attention_block_flops) | length
    "steps": 6,  # training steps
    "batch_size": 32,  # samples per rank per step
    "zipf_alpha": 1.5,  # sequence-length skew
    "max_length": 1024,  # longest sequence
    "num_items": 1000,  # item vocabulary
    "num_categories": 50,  # category vocabulary
    "embedding_dim": 32,  # model width d
    "ffn_dim": 128,  # feed-forward width f
    "num_heads": 2,  # attention heads
    "lr": 0.01,  # SGD learning rate
    "seed": 0,  # data and initial weights
    "fail_rank": None,  # tests: this rank raises at fail_step ...
    "fail_step": None,
    "fail_in_kk": False,  # ... inside its KK thread instead
}


class Timeline:
    """Spans (phase, step, start, end) in perf_counter seconds; threads may
    add spans concurrently (list.append is atomic). `step` is the batch a
    span works on, `iteration` the training-loop iteration it ran in: when
    overlapped, batch s+1 is loaded and balanced during iteration s."""

    def __init__(self) -> None:
        self.spans: list[dict[str, Any]] = []
        self.warmup = False  # spans added while True are marked "warmup"
        self.iteration = -1  # set by the training loop

    def add(self, phase: str, step: int, start: float, end: float, **extra: Any) -> None:
        self.spans.append(
            {
                "phase": phase,
                "step": step,
                "start": start,
                "end": end,
                "warmup": self.warmup,
                "iteration": self.iteration,
                **extra,
            }
        )

    @contextlib.contextmanager
    def span(self, phase: str, step: int, sync_device: torch.device | None = None) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            if sync_device is not None and sync_device.type == "cuda":
                torch.cuda.synchronize(sync_device)  # GPU work belongs to this span
            self.add(phase, step, start, time.perf_counter())


def hidden_fraction(spans: list[dict[str, Any]]) -> float:
    """Share of KK time the main thread did not wait for.

    For each step, the exposed part of KK is the overlap of its "kk" span
    with the main thread's "wait_kk" span; a KK run in the main thread
    (sync mode, no wait span) is fully exposed. Warm-up spans (the first
    batch of an overlapped run, with no step to hide behind) are left out.
    Returns 1 - exposed / total over all KK spans, or NaN when there is none.
    """
    waits = {s["step"]: s for s in spans if s["phase"] == "wait_kk"}
    total = exposed = 0.0
    for kk in (s for s in spans if s["phase"] == "kk" and not s.get("warmup")):
        duration = kk["end"] - kk["start"]
        total += duration
        wait = waits.get(kk["step"])
        if kk.get("thread") == "main" or wait is None:
            exposed += duration
        else:
            exposed += max(0.0, min(kk["end"], wait["end"]) - max(kk["start"], wait["start"]))
    return 1.0 - exposed / total if total > 0 else float("nan")


# --- the model ----------------------------------------------------------------


class AttentionBlock(nn.Module):
    """One transformer block over each sample's own tokens (no padding):
    its forward FLOPs are `balancer.attention_block_flops` per sample."""

    def __init__(self, embedding_dim: int, ffn_dim: int, num_heads: int) -> None:
        super().__init__()
        if embedding_dim % num_heads:
            raise ValueError(f"embedding_dim={embedding_dim} is not a multiple of num_heads={num_heads}")
        self.num_heads = num_heads
        self.qkv = nn.Linear(embedding_dim, 3 * embedding_dim)
        self.out = nn.Linear(embedding_dim, embedding_dim)
        self.ffn_in = nn.Linear(embedding_dim, ffn_dim)
        self.ffn_out = nn.Linear(ffn_dim, embedding_dim)

    def forward(self, tokens: torch.Tensor, lengths: list[int]) -> torch.Tensor:
        """tokens: (sum(lengths), d), samples one after another."""
        q, k, v = self.qkv(tokens).chunk(3, dim=-1)
        heads = self.num_heads
        attended = []
        for sq, sk, sv in zip(q.split(lengths), k.split(lengths), v.split(lengths)):
            if sq.shape[0] == 0:
                attended.append(sq)
                continue
            # (L, d) -> (heads, L, d / heads): attention within the sample only
            shape = (sq.shape[0], heads, -1)
            a = F.scaled_dot_product_attention(*(t.reshape(shape).transpose(0, 1) for t in (sq, sk, sv)))
            attended.append(a.transpose(0, 1).reshape(sq.shape))
        x = tokens + self.out(torch.cat(attended))
        return x + self.ffn_out(F.relu(self.ffn_in(x)))


class SequenceModel(nn.Module):
    """Item and category embeddings of a history, one attention block, mean
    pooling, a linear head: one prediction per sample."""

    def __init__(
        self, num_items: int, num_categories: int, embedding_dim: int, ffn_dim: int, num_heads: int
    ) -> None:
        super().__init__()
        self.item = nn.Embedding(num_items, embedding_dim)
        self.category = nn.Embedding(num_categories, embedding_dim)
        self.block = AttentionBlock(embedding_dim, ffn_dim, num_heads)
        self.head = nn.Linear(embedding_dim, 1)

    def forward(self, kjt: KeyedJaggedTensor) -> torch.Tensor:
        items, categories = kjt["item_id"], kjt["category_id"]
        lengths = items.lengths()
        tokens = self.item(items.values()) + self.category(categories.values())
        hidden = self.block(tokens, lengths.tolist())
        sample = torch.repeat_interleave(torch.arange(lengths.numel(), device=lengths.device), lengths)
        pooled = torch.zeros(lengths.numel(), hidden.shape[1], device=hidden.device, dtype=hidden.dtype)
        pooled.index_add_(0, sample, hidden)
        pooled = pooled / lengths.clamp(min=1).unsqueeze(1).to(hidden.dtype)
        return self.head(pooled).squeeze(1)


def make_local_batch(config: dict[str, Any], rank: int, step: int) -> tuple[KeyedJaggedTensor, torch.Tensor]:
    """Rank `rank`'s batch of `step`, as its data loader would cut it: a KJT
    with keys item_id and category_id (Zipf sequence lengths) and a dense
    (batch_size, 1) float64 tensor of labels. The same for the same args."""
    seed = (config["seed"] * 1_000_003 + step) * 1009 + rank
    lengths = balancer.zipf_lengths(config["batch_size"], config["zipf_alpha"], config["max_length"], seed)
    gen = torch.Generator().manual_seed(seed)
    num_tokens = int(lengths.sum())
    items = torch.randint(0, config["num_items"], (num_tokens,), generator=gen)
    categories = torch.randint(0, config["num_categories"], (num_tokens,), generator=gen)
    kjt = KeyedJaggedTensor.from_lengths_sync(
        keys=SEQUENCE_KEYS,
        values=torch.cat([items, categories]),
        lengths=torch.cat([lengths, lengths]),
    )
    labels = torch.rand(config["batch_size"], 1, generator=gen, dtype=torch.float64)
    return kjt, labels


def sample_workloads(kjt: KeyedJaggedTensor, config: dict[str, Any]) -> torch.Tensor:
    """Per-sample cost estimate (float64): the attention block's FLOPs or the length."""
    lengths = kjt["item_id"].lengths().to(torch.float64)
    if config["workload"] == "length":
        return lengths
    if config["workload"] == "flops":
        flops = balancer.attention_block_flops(lengths.cpu(), config["embedding_dim"], config["ffn_dim"])
        return flops.to(lengths.device)
    raise ValueError(f"workload {config['workload']!r} is not one of flops, length")


# --- the balanced shuffle ----------------------------------------------------


class BalancedShuffle:
    """All-gather workloads, KK (in a background thread with `overlap`),
    exchange samples. Use as a context manager so the thread is shut down.

        with BalancedShuffle(timeline, overlap=True) as shuffle:
            shuffle.start(kjt, dense, workloads, step)   # returns at once
            ...                                          # forward, backward
            kjt, dense = shuffle.finish()                # this rank's part
    """

    def __init__(
        self,
        timeline: Timeline,
        overlap: bool = True,
        method: str = "kk_swap",
        kk_backend: str = "auto",
        group: dist.ProcessGroup | None = None,
        fail_in_kk: bool = False,
    ) -> None:
        if method not in balancer.METHODS:
            raise ValueError(f"method {method!r} is not one of {', '.join(balancer.METHODS)}")
        self.timeline, self.overlap, self.method = timeline, overlap, method
        self.kk_backend, self.group, self.fail_in_kk = kk_backend, group, fail_in_kk
        self.rank, self.world_size = dist.get_rank(group), dist.get_world_size(group)
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="embnb-kk") if overlap else None
        self._pending: tuple | None = None

    def __enter__(self) -> BalancedShuffle:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=True, cancel_futures=True)

    def _partition(self, workloads: torch.Tensor, step: int, iteration: int) -> list[list[int]]:
        thread = "kk" if threading.current_thread() is not threading.main_thread() else "main"
        start = time.perf_counter()
        if self.fail_in_kk:
            raise RuntimeError(f"deliberate failure in the KK thread of rank {self.rank} at step {step}")
        parts = balancer.balance(workloads, self.world_size, self.method, self.kk_backend)
        self.timeline.add("kk", step, start, time.perf_counter(), thread=thread, iteration=iteration)
        return parts

    def start(self, kjt: KeyedJaggedTensor, dense: torch.Tensor, workloads: torch.Tensor, step: int) -> None:
        """Gather every rank's workloads (and dense rows); start KK."""
        if self._pending is not None:
            raise RuntimeError("start() called twice without finish()")
        if workloads.shape != (kjt.stride(),) or dense.shape[0] != kjt.stride():
            raise ValueError(
                f"need one workload and one dense row per sample: stride {kjt.stride()}, "
                f"workloads {tuple(workloads.shape)}, dense {tuple(dense.shape)}"
            )
        with self.timeline.span("gather_workloads", step):
            rows = torch.cat([workloads.to(torch.float64).unsqueeze(1), dense.to(torch.float64)], dim=1)
            gathered = torch.empty(self.world_size * rows.numel(), dtype=torch.float64, device=rows.device)
            dist.all_gather_single(gathered, rows.reshape(-1), group=self.group)
            gathered = gathered.view(-1, rows.shape[1])
            all_workloads = gathered[:, 0].cpu().clone()  # KK runs on the CPU
        if self.overlap:
            parts: Future | list = self._executor.submit(
                self._partition, all_workloads, step, self.timeline.iteration
            )
        else:
            parts = self._partition(all_workloads, step, self.timeline.iteration)
        self._pending = (kjt, gathered[:, 1:].to(dense.dtype), parts, step)

    def finish(self) -> tuple[KeyedJaggedTensor, torch.Tensor]:
        """Wait for KK, then exchange: this rank's KJT and dense rows."""
        if self._pending is None:
            raise RuntimeError("finish() called before start()")
        kjt, all_dense, parts, step = self._pending
        self._pending = None
        if isinstance(parts, Future):
            with self.timeline.span("wait_kk", step):
                parts = parts.result()  # re-raises an error of the KK thread
        with self.timeline.span("exchange", step, all_dense.device):
            mine = torch.tensor(parts[self.rank], dtype=torch.int64, device=all_dense.device)
            (global_kjt,) = allgather_kjt([kjt], self.group)
            local = select_samples(global_kjt, mine)
        return local, all_dense[mine]


# --- training ----------------------------------------------------------------


def _device() -> torch.device:
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _check_config(config: dict[str, Any]) -> dict[str, Any]:
    unknown = sorted(set(config) - set(DEFAULT_CONFIG))
    if unknown:
        raise ValueError(f"unknown config keys {unknown}; known: {sorted(DEFAULT_CONFIG)}")
    config = {**DEFAULT_CONFIG, **config}
    if config["mode"] not in MODES:
        raise ValueError(f"mode {config['mode']!r} is not one of {', '.join(MODES)}")
    return config


def train(rank: int, world_size: int, config: dict[str, Any]) -> dict[str, Any]:
    """Train the sequence model on this rank; see DEFAULT_CONFIG.

    Returns the timeline spans, per-step wall time and FLOPs computed on
    this rank, the losses (global, all-reduced), the final weights and the
    hidden fraction of KK time. The loss is the global batch's mean squared
    error whatever the mode, so all modes follow the same trajectory.
    """
    config = _check_config(config)
    device = _device()
    torch.manual_seed(config["seed"])  # the same initial weights on every rank
    model = SequenceModel(
        config["num_items"],
        config["num_categories"],
        config["embedding_dim"],
        config["ffn_dim"],
        config["num_heads"],
    ).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=config["lr"])
    global_batch = world_size * config["batch_size"]
    timeline = Timeline()
    mode = config["mode"]
    step_seconds, step_flops, losses = [], [], []

    def load(step: int):
        with timeline.span("load", step):
            kjt, labels = make_local_batch(config, rank, step)
            kjt, labels = kjt.to(device), labels.to(device)
            return kjt, labels, sample_workloads(kjt, config)

    fail_in_kk = config["fail_in_kk"] and rank == config["fail_rank"]
    with BalancedShuffle(
        timeline,
        overlap=mode == "overlap",
        method=config["method"],
        kk_backend=config["kk_backend"],
        fail_in_kk=fail_in_kk,
    ) as shuffle:
        dist.barrier()
        if mode == "overlap":  # the first batch has no step to hide behind
            timeline.warmup = True
            shuffle.start(*load(0), step=0)
            current = shuffle.finish()
            timeline.warmup = False
        for step in range(config["steps"]):
            timeline.iteration = step
            step_start = time.perf_counter()
            if config["fail_rank"] == rank and config["fail_step"] == step and not fail_in_kk:
                raise RuntimeError(f"deliberate failure on rank {rank} at step {step}")
            if mode == "none":
                kjt, labels, _ = load(step)
            elif mode == "sync":
                shuffle.start(*load(step), step=step)
                kjt, labels = shuffle.finish()
            else:
                kjt, labels = current
                if step + 1 < config["steps"]:  # balance the next batch meanwhile
                    shuffle.start(*load(step + 1), step=step + 1)
            with timeline.span("forward", step, device):
                loss = ((model(kjt) - labels[:, 0].to(torch.float32)) ** 2).sum() / global_batch
            with timeline.span("backward", step, device):
                optimizer.zero_grad()
                loss.backward()
                grads = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
                dist.all_reduce(grads)
                offset = 0
                for p in model.parameters():
                    p.grad.copy_(grads[offset : offset + p.numel()].view_as(p))
                    offset += p.numel()
                optimizer.step()
                total_loss = loss.detach().clone()
                dist.all_reduce(total_loss)
            if mode == "overlap" and step + 1 < config["steps"]:
                current = shuffle.finish()
            step_seconds.append(time.perf_counter() - step_start)
            step_flops.append(float(sample_workloads(kjt, {**config, "workload": "flops"}).sum()))
            losses.append(float(total_loss))
    for span in timeline.spans:
        span["rank"] = rank
    return {
        "rank": rank,
        "mode": mode,
        "kk_backend": config["kk_backend"],
        "spans": timeline.spans,
        "step_seconds": step_seconds,
        "step_flops": step_flops,
        "losses": losses,
        "weights": torch.cat([p.detach().reshape(-1).cpu() for p in model.parameters()]),
        "hidden_fraction": hidden_fraction(timeline.spans),
        "kk_seconds": [
            s["end"] - s["start"] for s in timeline.spans if s["phase"] == "kk" and not s["warmup"]
        ],
        "native_kk": balancer.native_available() if config["kk_backend"] != "python" else False,
    }


def train_modes(rank: int, world_size: int, configs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`train` once per config, in one launch (spawning ranks is slow)."""
    return [train(rank, world_size, config) for config in configs]


def gather_and_train(
    rank: int, world_size: int, gather_kwargs: dict[str, Any], configs: list[dict[str, Any]]
) -> dict[str, Any]:
    """`kjt_gather.compare_gathers`, then `train_modes`: what notebook 04
    runs on its ranks, in one launch."""
    return {
        "gather": compare_gathers(rank, world_size, **gather_kwargs),
        "train": train_modes(rank, world_size, configs),
    }


def summarize(per_rank: list[dict[str, Any]], skip_first: int = 1) -> dict[str, Any]:
    """One mode's numbers across ranks: median step time (each step counted
    at its slowest rank), FLOPs max/mean per step, hidden fraction (None
    when the mode runs no KK)."""
    steps = len(per_rank[0]["step_seconds"])
    kept = range(min(skip_first, steps - 1), steps)
    slowest = [max(r["step_seconds"][s] for r in per_rank) for s in kept]
    flops_ratio = []
    for s in kept:
        flops = [r["step_flops"][s] for r in per_rank]
        flops_ratio.append(max(flops) / (sum(flops) / len(flops)))
    spans = [span for r in per_rank for span in r["spans"]]
    kk = [d for r in per_rank for d in r["kk_seconds"]]
    return {
        "mode": per_rank[0]["mode"],
        "kk_backend": per_rank[0]["kk_backend"],
        "step_seconds": statistics.median(slowest),
        "flops_max_over_mean": statistics.mean(flops_ratio),
        "hidden_fraction": _hidden_over_ranks(per_rank),
        "kk_seconds": statistics.median(kk) if kk else 0.0,
        "num_spans": len(spans),
    }


def _hidden_over_ranks(per_rank: list[dict[str, Any]]) -> float | None:
    """KK-time-weighted hidden fraction over ranks; None without KK."""
    total = hidden = 0.0
    for r in per_rank:
        kk = sum(r["kk_seconds"])
        if kk > 0:
            total += kk
            hidden += r["hidden_fraction"] * kk
    return hidden / total if total > 0 else None
