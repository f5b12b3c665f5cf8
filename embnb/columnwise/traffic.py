"""What a CW lookup sends: every `all_to_all_single` a rank calls during one
forward, measured from the collective's input tensors.

    with recorded_all_to_all() as sent:
        sharded(features).wait()
    sent.int_elements, sent.float_elements, sent.calls

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

__all__ = ["Traffic", "recorded_all_to_all"]


@dataclass
class Traffic:
    """What one rank sent through all_to_all_single (its inputs, all destinations, itself included)."""

    calls: int = 0
    int_elements: int = 0  # ids, lengths, split counts
    float_elements: int = 0  # embedding rows' values
    bytes: int = 0

    def add(self, sent: torch.Tensor) -> None:
        self.calls += 1
        if sent.is_floating_point():
            self.float_elements += sent.numel()
        else:
            self.int_elements += sent.numel()
        self.bytes += sent.numel() * sent.element_size()

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


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
