"""What a CW lookup sends: every `all_to_all_single` a rank calls during one
forward, measured from the collective's input tensors, and the byte count
that follows from what each path puts on the wire.

    with recorded_all_to_all() as sent:
        sharded(features).wait()
    sent.int_bytes, sent.float_bytes, sent.calls

torchrec (its KJT and embedding all-to-alls) and embnb (`embnb.collectives.exchange`)
both call `torch.distributed.all_to_all_single`, so one recorder sees both
paths. Integer inputs are ids, lengths and split counts; floating inputs are
embedding rows.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import asdict, dataclass

import torch
import torch.distributed as dist

from embnb._checks import check_int

__all__ = ["Traffic", "recorded_all_to_all", "WireBytes", "wire_bytes"]


@dataclass
class Traffic:
    """What one rank sent through all_to_all_single (its inputs, all destinations, itself included)."""

    calls: int = 0
    int_elements: int = 0  # ids, lengths, split counts
    float_elements: int = 0  # embedding rows' values
    int_bytes: int = 0
    float_bytes: int = 0

    @property
    def bytes(self) -> int:
        return self.int_bytes + self.float_bytes

    def add(self, sent: torch.Tensor) -> None:
        self.calls += 1
        size = sent.numel() * sent.element_size()
        if sent.is_floating_point():
            self.float_elements += sent.numel()
            self.float_bytes += size
        else:
            self.int_elements += sent.numel()
            self.int_bytes += size

    def as_dict(self) -> dict[str, int]:
        return {**asdict(self), "bytes": self.bytes}


@contextlib.contextmanager
def recorded_all_to_all() -> Iterator[Traffic]:
    """Record every `torch.distributed.all_to_all_single` input while inside;
    the original function is back on exit, whatever happens."""
    sent = Traffic()
    original = dist.all_to_all_single

    def recording(output, input, *args, **kwargs):
        sent.add(input)
        return original(output, input, *args, **kwargs)

    dist.all_to_all_single = recording
    try:
        yield sent
    finally:
        dist.all_to_all_single = original


@dataclass(frozen=True)
class WireBytes:
    """Bytes all ranks send in one forward of one CW table, by what they are."""

    torchrec_ids: int  # every id once per shard (KJTAllToAll treats a shard as a table)
    torchrec_lengths: int  # every sequence's length once per shard
    torchrec_splits: int  # per rank and destination: lengths, values and stride counts
    embnb_ids: int  # every id once per owner rank
    embnb_counts: int  # per rank and destination: one id count
    rows: int  # every looked-up id's full row, either path

    @property
    def torchrec(self) -> int:
        return self.torchrec_ids + self.torchrec_lengths + self.torchrec_splits + self.rows

    @property
    def embnb(self) -> int:
        return self.embnb_ids + self.embnb_counts + self.rows


def wire_bytes(
    shards: int,
    owner_ranks: int,
    embedding_dim: int,
    ids: int,
    sequences: int,
    world_size: int,
    int_bytes: int = 8,
    value_bytes: int = 4,
) -> WireBytes:
    """What each path puts on the wire for `ids` looked up in `sequences`
    (all ranks together) in a table of `embedding_dim` columns cut into
    `shards` shards on `owner_ranks` of `world_size` ranks; ids, lengths and
    counts `int_bytes` wide (int64), row values `value_bytes` (fp32).

    Per looked-up id that is `shards * int_bytes` of ids for torchrec,
    `owner_ranks * int_bytes` for embnb, and `embedding_dim * value_bytes`
    of row values back for both.
    """
    for name, value in (("shards", shards), ("owner_ranks", owner_ranks), ("world_size", world_size)):
        check_int(name, value, low=1)
    if owner_ranks > min(shards, world_size):
        raise ValueError(f"owner_ranks {owner_ranks} > min(shards {shards}, world_size {world_size})")
    pairs = world_size * world_size  # (sender, destination)
    return WireBytes(
        torchrec_ids=shards * ids * int_bytes,
        torchrec_lengths=shards * sequences * int_bytes,
        torchrec_splits=3 * pairs * int_bytes,
        embnb_ids=owner_ranks * ids * int_bytes,
        embnb_counts=pairs * int_bytes,
        rows=ids * embedding_dim * value_bytes,
    )
