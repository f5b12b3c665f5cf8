"""Balanced data-parallel training of a small sequence model (item and category embeddings, one
attention block, mean pooling, a regression head), the balancer hidden behind compute: `train(rank,
world_size, config)` in one of the modes of `TrainConfig.mode`, recording a `Timeline` per rank and
step. On a GPU the model runs on the rank's device and KK on the CPU.

    launch_each([(train, (TrainConfig(mode="none"),)), (train, (TrainConfig(mode="overlap"),))], 2)
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from embnb._checks import check_choice, check_int, check_native, check_number
from embnb.balancing.partition import METHODS
from embnb.balancing.shuffle import EXCHANGES, BalancedShuffle
from embnb.balancing.timeline import Timeline, hidden_fraction
from embnb.balancing.workloads import attention_block_flops
from embnb.collectives import all_reduce_
from embnb.data import zipf_lengths
from embnb.dist import rank_device

__all__ = [
    "MODES",
    "TrainConfig",
    "AttentionBlock",
    "SequenceModel",
    "make_local_batch",
    "sample_workloads",
    "train",
    "timed_steps",
    "slowest_rank",
]

MODES = ("none", "sync", "overlap")
SHUFFLE_GROUPS = ("shared", "own", "caller")
WORKLOADS = ("flops", "length")
SEQUENCE_KEYS = ["item_id", "category_id"]


@dataclass(frozen=True)
class TrainConfig:
    """One training run; every rank gets the same config."""

    mode: str = "overlap"  # none | sync | overlap
    native_kk: bool | None = None  # KK natively: None where it loads, True or an error, False Python
    method: str = "kk_swap"  # a name of embnb.balancing.partition.METHODS
    workload: str = "flops"  # flops (attention_block_flops) | length
    exchange: str = "allgather"  # allgather | alltoall (embnb.balancing.shuffle.EXCHANGES)
    # overlap only: "shared" (the worker uses the loop's process group; the loop waits for
    # it before the gradient all-reduce) | "own" (a group of its own, dist.new_group, gloo
    # only; the loop waits for it after the optimizer step: the worker may overlap the all-reduce)
    # | "caller" (the loop's group, its collectives on the loop's thread, KK alone in the
    # worker: BalancedShuffle(collective_thread="caller"), recsys-examples' design)
    shuffle_group: str = "shared"
    steps: int = 6  # training steps
    batch_size: int = 32  # samples per rank per step
    zipf_alpha: float = 1.5  # sequence-length skew
    max_length: int = 1024  # longest sequence
    num_items: int = 1000  # item vocabulary
    num_categories: int = 50  # category vocabulary
    embedding_dim: int = 32  # model width d
    ffn_dim: int = 128  # feed-forward width f
    num_heads: int = 2  # attention heads
    lr: float = 0.01  # SGD learning rate
    seed: int = 0  # data and initial weights

    def __post_init__(self) -> None:
        check_choice("mode", self.mode, MODES)
        check_native("native_kk", self.native_kk)
        check_choice("method", self.method, tuple(METHODS))
        check_choice("workload", self.workload, WORKLOADS)
        check_choice("exchange", self.exchange, EXCHANGES)
        check_choice("shuffle_group", self.shuffle_group, SHUFFLE_GROUPS)
        for f in dataclasses.fields(self):
            if f.type in ("int", int):  # the sizes at least 1; the seed any int
                check_int(f.name, getattr(self, f.name), low=None if f.name == "seed" else 1)
        check_number("zipf_alpha", self.zipf_alpha, low=0, low_open=True)
        check_number("lr", self.lr, low=0, low_open=True)

    def replace(self, **changes: Any) -> TrainConfig:
        return dataclasses.replace(self, **changes)


# --- the model ----------------------------------------------------------------


class AttentionBlock(nn.Module):
    """One transformer block over each sample's own tokens (no padding):
    its forward FLOPs are `workloads.attention_block_flops` per sample."""

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


def make_local_batch(config: TrainConfig, rank: int, step: int) -> tuple[KeyedJaggedTensor, torch.Tensor]:
    """Rank `rank`'s batch of `step`, as its data loader would cut it: a KJT
    with keys item_id and category_id (Zipf sequence lengths) and a dense
    (batch_size, 1) float64 tensor of labels. The same for the same args."""
    seed = (config.seed * 1_000_003 + step) * 1009 + rank
    lengths = zipf_lengths(config.batch_size, config.zipf_alpha, config.max_length, seed)
    gen = torch.Generator().manual_seed(seed)
    num_tokens = int(lengths.sum())
    items = torch.randint(0, config.num_items, (num_tokens,), generator=gen)
    categories = torch.randint(0, config.num_categories, (num_tokens,), generator=gen)
    kjt = KeyedJaggedTensor.from_lengths_sync(
        keys=SEQUENCE_KEYS,
        values=torch.cat([items, categories]),
        lengths=torch.cat([lengths, lengths]),
    )
    labels = torch.rand(config.batch_size, 1, generator=gen, dtype=torch.float64)
    return kjt, labels


def sample_workloads(kjt: KeyedJaggedTensor, config: TrainConfig) -> torch.Tensor:
    """Per-sample cost estimate (float64): the attention block's FLOPs or the length."""
    lengths = kjt["item_id"].lengths().to(torch.float64)
    if config.workload == "length":
        return lengths
    flops = attention_block_flops(lengths.cpu(), config.embedding_dim, config.ffn_dim)
    return flops.to(lengths.device)


# --- training ----------------------------------------------------------------


def train(rank: int, world_size: int, config: TrainConfig) -> dict[str, Any]:
    """Train the sequence model on this rank; see TrainConfig.

    Returns the timeline spans, per-step wall time and FLOPs computed on
    this rank, the losses (global, all-reduced), the final weights and the
    hidden fraction of the shuffle's time. The loss is the global batch's
    mean squared error whatever the mode, so all modes follow the same
    trajectory. Each iteration loads one batch in every mode; "sync"
    shuffles it before computing, "overlap" shuffles the next one in the
    worker meanwhile (batch 0 before the loop, nothing in the last
    iteration: `timed_steps` leaves both out of every mode's timing).
    """
    if not isinstance(config, TrainConfig):
        raise TypeError(f"config must be a TrainConfig, got {type(config).__name__}")
    device = rank_device()
    torch.manual_seed(config.seed)  # the same initial weights on every rank
    model = SequenceModel(
        config.num_items, config.num_categories, config.embedding_dim, config.ffn_dim, config.num_heads
    ).to(device)
    params = list(model.parameters())
    optimizer = torch.optim.SGD(params, lr=config.lr)
    global_batch = world_size * config.batch_size
    timeline = Timeline()
    mode = config.mode
    step_seconds, step_flops, losses = [], [], []

    def load(step: int):
        with timeline.span("load", step, device):
            kjt, labels = make_local_batch(config, rank, step)
            kjt, labels = kjt.to(device), labels.to(device)
            return kjt, labels, sample_workloads(kjt, config)

    own_group = mode == "overlap" and config.shuffle_group == "own"
    with BalancedShuffle(
        timeline,
        overlap=mode == "overlap",
        method=config.method,
        native_kk=config.native_kk,
        exchange=config.exchange,
        group=_worker_group() if own_group else None,
        step_collectives=own_group,  # shared: this loop issues none until finish()
        collective_thread="caller" if config.shuffle_group == "caller" else "worker",
    ) as shuffle:
        dist.barrier()
        if mode == "overlap":  # the first batch has no step to hide behind
            timeline.warmup = True
            shuffle.start(*load(0), step=0)
            current = shuffle.finish()
            timeline.warmup = False
        for step in range(config.steps):
            timeline.iteration = step
            step_start = time.perf_counter()
            shuffling_next = mode == "overlap" and step + 1 < config.steps
            if mode == "none":
                kjt, labels, _ = load(step)
            elif mode == "sync":
                shuffle.start(*load(step), step=step)
                kjt, labels = shuffle.finish()
            else:
                kjt, labels = current
                if shuffling_next:  # the worker shuffles the next batch meanwhile
                    shuffle.start(*load(step + 1), step=step + 1)
            with timeline.span("forward", step, device):
                loss = ((model(kjt) - labels[:, 0].to(torch.float32)) ** 2).sum() / global_batch
            with timeline.span("backward", step, device):
                optimizer.zero_grad()
                loss.backward()
                grads = torch.cat([p.grad.reshape(-1) for p in params])
            if shuffling_next and not own_group:  # the worker owns the group until finish()
                current = shuffle.finish()
            with timeline.span("all_reduce", step, device):
                all_reduce_(grads)
                total_loss = loss.detach().clone()
                all_reduce_(total_loss)
            with timeline.span("optimizer", step, device):  # on the summed gradients
                for p, grad in zip(params, grads.split([p.numel() for p in params])):
                    p.grad.copy_(grad.view_as(p))
                optimizer.step()
            if shuffling_next and own_group:  # its own group: it may run under the all-reduce too
                current = shuffle.finish()
            step_end = time.perf_counter()
            timeline.add("step", step, step_start, step_end)
            step_seconds.append(step_end - step_start)
            step_flops.append(float(sample_workloads(kjt, config.replace(workload="flops")).sum()))
            losses.append(float(total_loss))
    for span in timeline.spans:
        span["rank"] = rank
    return {k: getattr(config, k) for k in ("mode", "native_kk", "exchange", "shuffle_group")} | {
        "rank": rank,
        "spans": timeline.spans,
        "step_seconds": step_seconds,
        "step_flops": step_flops,
        "losses": losses,
        "weights": torch.cat([p.detach().reshape(-1).cpu() for p in params]),
        "hidden_fraction": hidden_fraction(timeline.spans),
    }


def _worker_group() -> dist.ProcessGroup:
    """A process group of all ranks for the shuffle worker alone (every rank calls this at the same
    point); gloo only, as docs/balancing.md says why (NCCL 2.29's "Thread Safety")."""
    if dist.get_backend() != "gloo":
        raise ValueError(
            f"shuffle_group='own' needs the gloo backend, this run uses {dist.get_backend()!r}: "
            "NCCL does not allow two threads to drive two communicators of one GPU at once; "
            "use shuffle_group='shared'"
        )
    return dist.new_group(backend="gloo")


def timed_steps(steps: int, skip_first: int = 1) -> range:
    """The steady-state iterations every mode is timed on: after `skip_first`
    warm-up iterations and before the last one. In each of them every mode
    loads one batch and (except "none") shuffles one batch: the overlapped
    run shuffles batch 0 before the loop and nothing in its last iteration.
    With fewer than 3 steps, the last iteration alone."""
    check_int("steps", steps, low=1)
    kept = range(min(skip_first, steps - 1), steps - 1)
    return kept if len(kept) else range(steps - 1, steps)


def slowest_rank(
    per_rank: list[dict[str, Any]], key: str = "step_seconds", skip_first: int = 1
) -> list[float]:
    """Per timed step (`timed_steps`), the largest of the ranks' `key` ("step_seconds" or
    "step_flops"): the ranks meet at the all-reduce, so a step lasts as long as its slowest rank."""
    kept = timed_steps(len(per_rank[0][key]), skip_first)
    return [max(r[key][s] for r in per_rank) for s in kept]
