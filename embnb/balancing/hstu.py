"""An HSTU-like block, the model the balancer is measured on at recsys-examples' shape (width 1024,
8 layers, 4 heads of 256, where it reports 1.53x). Per layer of width d, on a jagged batch (each
sample's tokens packed one after another):

    U, V, Q, K = split(SiLU(X_n @ W_uvqk))       width d -> 4d, X_n = LayerNorm(X)
    A          = causal attention(Q, K, V)        heads of `head_dim` (256; one head of d when d < 256)
    X          = X + (LayerNorm(A) * U) @ W_o     d -> d
    X          = X + FFN(LayerNorm(X))            d -> ffn_multiple * d -> d (GELU); 0: none

It is not HSTU (Zhai et al., 2024): the attention is softmax attention where HSTU's is pointwise
SiLU(Q K^T) / n (the same two matmuls' FLOPs), and the feed-forward is added. Attention runs
"jagged" (CUDA: flash attention's variable-length kernel on the packed tokens) or "bucketed" (any
device: padded length buckets), the same function of the same weights (`attention_kind`,
`HSTUBlock.attention`); docs/balancing.md gives both designs and their sources.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention.varlen import varlen_attn

from embnb._checks import check_choice, check_int
from embnb.balancing.workloads import lengths_tensor

__all__ = [
    "HEAD_DIM",
    "ATTENTION",
    "head_layout",
    "hstu_flops",
    "attention_kind",
    "Buckets",
    "bucket_by_length",
    "Jagged",
    "jagged_by_length",
    "HSTUBlock",
    "HSTUModel",
]

HEAD_DIM = 256  # recsys-examples' heads: 4 of 256 at width 1024
ATTENTION = ("bucketed", "jagged", "auto")


def head_layout(width: int, head_dim: int = HEAD_DIM) -> tuple[int, int]:
    """(heads, head size) for `width`: heads of `head_dim`, or one head of `width` below it."""
    check_int("width", width, low=1)
    size = min(head_dim, width)
    if width % size:
        raise ValueError(f"width must be at most {head_dim} or a multiple of it, got {width}")
    return width // size, size


def hstu_flops(
    lengths: Any, width: int, num_layers: int = 1, ffn_multiple: int = 4, causal: bool = True
) -> torch.Tensor:
    """Forward FLOPs of `num_layers` `HSTUBlock`s on each sample of L tokens (float64), a multiply-add
    counted as 2 FLOPs (as torch.utils.flop_counter does), per layer of width d, f = ffn_multiple:

        U, V, Q, K projection    2*L*d*4d        =  8*L*d^2
        output projection        2*L*d*d         =  2*L*d^2
        feed-forward             2*2*L*d*(f*d)   =  4*f*L*d^2
        scores Q K^T, A V        2 * 2*L*L*d     =  4*L^2*d    (every head together)
        -----------------------------------------------------
        total = L*d^2*(10 + 4*f) + c*L^2*d,  c = 4, or 2 with `causal`

    `causal=True` counts the half of the score matrix a causal fused kernel computes (the work the
    balancer should weigh); `causal=False` the full matrix, as torch's FLOP counter counts attention.
    Norms, SiLU, softmax and the gating are O(L*d) and left out. At f = 4 the quadratic term passes the
    linear one at L = 13*d (causal): for width 1024 beyond the 4096 tokens of the longest sample, so
    there most of a sample's FLOPs are linear in its length; at width 64, from 832 tokens on.
    """
    check_int("width", width, low=1)
    check_int("num_layers", num_layers, low=1)
    check_int("ffn_multiple", ffn_multiple, low=0)
    length = lengths_tensor(lengths)
    d = float(width)
    quadratic = 2.0 if causal else 4.0
    return num_layers * (length * d * d * (10 + 4 * ffn_multiple) + quadratic * length * length * d)


def attention_kind(attention: str, device: torch.device | str) -> str:
    """The attention run for option `attention` on `device`, "bucketed" or "jagged" (module
    docstring): "auto" is "jagged" on CUDA, else "bucketed". Raises ValueError on an `attention`
    outside ATTENTION, or "jagged" on a device other than CUDA."""
    check_choice("attention", attention, ATTENTION)
    on_cuda = torch.device(device).type == "cuda"
    if attention == "jagged" and not on_cuda:
        raise ValueError(
            f"attention='jagged' needs a CUDA device (flash attention's variable-length kernel); on "
            f"{device} use 'bucketed' or 'auto'"
        )
    if attention == "auto":
        return "jagged" if on_cuda else "bucketed"
    return attention


def _check_lengths(lengths: Sequence[int]) -> list[int]:
    """`lengths` as a list, each at least 1 (no kernel takes an empty sample); not empty."""
    lengths = [check_int(f"lengths[{i}]", n, low=1) for i, n in enumerate(lengths)]
    if not lengths:
        raise ValueError("lengths is empty: a batch needs at least one sample")
    return lengths


@dataclass(frozen=True)
class Jagged:
    """The packed tokens' samples for the jagged attention: `offsets` ([samples + 1], int32, as
    `varlen_attn` takes them) where each starts, and the longest sample's length."""

    offsets: torch.Tensor
    longest: int

    def to(self, device: torch.device | str) -> Jagged:
        return Jagged(self.offsets.to(device), self.longest)


def jagged_by_length(lengths: Sequence[int]) -> Jagged:
    """The `Jagged` batch of samples of `lengths` tokens, packed in that order."""
    lengths = _check_lengths(lengths)
    return Jagged(torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int32), max(lengths))


@dataclass(frozen=True)
class Buckets:
    """Where each sample's tokens go in the padded batches: per bucket, `gather[b]` ([samples * longest])
    indexes the packed tokens, the pads pointing at one extra zero row (index `num_tokens`); `shapes[b]`
    is (samples, longest); `restore` maps the buckets' real rows, concatenated, back to packed order."""

    gather: list[torch.Tensor]
    keep: list[torch.Tensor]  # per bucket, the positions of its real rows among its padded rows
    shapes: list[tuple[int, int]]
    restore: torch.Tensor
    num_tokens: int

    def to(self, device: torch.device | str) -> Buckets:
        gather, keep = [g.to(device) for g in self.gather], [k.to(device) for k in self.keep]
        return Buckets(gather, keep, self.shapes, self.restore.to(device), self.num_tokens)


def bucket_by_length(lengths: Sequence[int]) -> Buckets:
    """Group samples by the power of two at or above their length; pad each group to its longest."""
    lengths = _check_lengths(lengths)
    starts = list(itertools.accumulate(lengths, initial=0))
    groups: dict[int, list[int]] = {}
    for i, n in enumerate(lengths):
        groups.setdefault(1 << (n - 1).bit_length(), []).append(i)
    gather, keep, shapes, order = [], [], [], []
    for key in sorted(groups):
        members = groups[key]
        longest = max(lengths[i] for i in members)
        position = torch.arange(longest)
        rows = [torch.where(position < lengths[i], starts[i] + position, starts[-1]) for i in members]
        index = torch.cat(rows)
        gather.append(index)
        # positions, not a mask: indexing by a mask waits for the GPU to count it, every layer
        keep.append((index < starts[-1]).nonzero().flatten())
        shapes.append((len(members), longest))
        order.append(index[index < starts[-1]])
    restore = torch.empty(starts[-1], dtype=torch.int64)
    restore[torch.cat(order)] = torch.arange(starts[-1])
    return Buckets(gather, keep, shapes, restore, starts[-1])


class HSTUBlock(nn.Module):
    """One HSTU-like layer (module docstring) on packed tokens [num_tokens, width]."""

    def __init__(self, width: int, ffn_multiple: int = 4, head_dim: int = HEAD_DIM) -> None:
        super().__init__()
        self.heads, self.head_dim = head_layout(width, head_dim)
        self.width = width
        self.norm_in = nn.LayerNorm(width)
        self.uvqk = nn.Linear(width, 4 * width)
        self.norm_attention = nn.LayerNorm(width)
        self.out = nn.Linear(width, width)
        hidden = check_int("ffn_multiple", ffn_multiple, low=0) * width
        self.ffn = (
            nn.Sequential(nn.LayerNorm(width), nn.Linear(width, hidden), nn.GELU(), nn.Linear(hidden, width))
            if hidden
            else None
        )

    def attention(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, batch: Buckets | Jagged
    ) -> torch.Tensor:
        """Causal softmax attention of each sample over its own tokens [num_tokens, width]: on the
        jagged batch itself (`Jagged`, CUDA: `torch.nn.attention.varlen.varlen_attn` with the samples'
        offsets as `cu_seq_q`/`cu_seq_k`; `window_size=(-1, 0)` is its causal mask in torch 2.11 to
        2.14, 2.10 spelled it `is_causal`; on a CPU no jagged SDPA takes a causal mask) or bucket by
        bucket (`Buckets`: each padded at the end of its samples, so under the causal mask no real
        token attends to a pad and no mask is passed)."""
        if isinstance(batch, Jagged):
            q, k, v = (t.view(-1, self.heads, self.head_dim) for t in (q, k, v))
            offsets, longest = batch.offsets, batch.longest
            attended = varlen_attn(q, k, v, offsets, offsets, longest, longest, window_size=(-1, 0))
            return attended.reshape(-1, self.width)
        pad = q.new_zeros(1, self.width)
        q, k, v = (torch.cat([t, pad]) for t in (q, k, v))
        outputs = []
        for index, keep, (samples, longest) in zip(batch.gather, batch.keep, batch.shapes):
            shape = (samples, longest, self.heads, self.head_dim)
            q_b, k_b, v_b = (t[index].view(shape).transpose(1, 2) for t in (q, k, v))
            attended = F.scaled_dot_product_attention(q_b, k_b, v_b, is_causal=True)
            outputs.append(attended.transpose(1, 2).reshape(samples * longest, self.width)[keep])
        return torch.cat(outputs)[batch.restore]

    def forward(self, x: torch.Tensor, batch: Buckets | Jagged) -> torch.Tensor:
        u, v, q, k = F.silu(self.uvqk(self.norm_in(x))).chunk(4, dim=-1)
        attended = self.attention(q, k, v, batch)
        x = x + self.out(self.norm_attention(attended) * u)
        return x + self.ffn(x) if self.ffn is not None else x


class HSTUModel(nn.Sequential):
    """`num_layers` HSTUBlocks, each called with the batch (`Buckets` or `Jagged`)."""

    def __init__(self, width: int, num_layers: int, ffn_multiple: int = 4, head_dim: int = HEAD_DIM) -> None:
        check_int("num_layers", num_layers, low=1)
        super().__init__(*(HSTUBlock(width, ffn_multiple, head_dim) for _ in range(num_layers)))

    def forward(self, x: torch.Tensor, batch: Buckets | Jagged) -> torch.Tensor:  # type: ignore[override]
        for block in self:
            x = block(x, batch)
        return x
