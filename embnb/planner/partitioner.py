"""torchrec's GreedyPerfPartitioner, placing device-partitioned shards without emptying its heap.

torchrec's `_device_partition` pops devices off its min-heap until one has room for the shard, each
comparison a Python `__lt__` that sums two `Perf`s (a fifth of planning 5,000 tables on 1,024
devices). `HeapSearchPartitioner` picks the same device by walking the heap best-first from its root
without moving anything, so plans are the same (docs/planner.md, "The partitioner";
tests/planner/test_replica.py places its random plans with both, shard by shard).
"""

from __future__ import annotations

import heapq

from torchrec.distributed.planner.partitioners import GreedyPerfPartitioner, OrderedDeviceHardware
from torchrec.distributed.planner.types import PlannerError, PlannerErrorType, ShardingOption

__all__ = ["HeapSearchPartitioner"]


def _key(ordered: OrderedDeviceHardware) -> tuple:
    """What OrderedDeviceHardware.__lt__ compares, as one tuple (compared in C)."""
    device = ordered.device
    return (device.perf.total, device.rank % ordered.local_world_size, device.rank)


class HeapSearchPartitioner(GreedyPerfPartitioner):
    """torchrec's GreedyPerfPartitioner (the same arguments and plans); its device partition finds
    each shard's device by a best-first walk of the heap instead of popping it."""

    @classmethod
    def _device_partition(
        cls,
        sharding_option: ShardingOption,
        minheap_devices: list[OrderedDeviceHardware],
        bulk_heapify_threshold: float = 0.25,  # torchrec's; nothing is popped here
    ) -> None:
        for shard in sharding_option.shards:
            position = _least_with_room(minheap_devices, shard.storage)
            if position is None:
                largest = max(ordered.device.storage for ordered in minheap_devices)
                raise PlannerError(
                    error_type=PlannerErrorType.PARTITION,
                    message=(
                        f"Device partition failed. Couldn't find a rank for shard {shard} of table "
                        f"{sharding_option.name}, largest device storage: {largest}"
                    ),
                )
            device = minheap_devices[position].device
            shard.rank = device.rank
            device.storage -= shard.storage
            device.perf += shard.perf
            _sift_down(minheap_devices, position)


def _least_with_room(heap: list[OrderedDeviceHardware], storage) -> int | None:
    """The heap position of the least device (by `_key`) that `storage` fits in; None if none.
    A heap's children are never less than their parent, so visiting positions in key order from
    the root only ever needs the children of positions already visited."""
    if not heap:
        return None
    frontier = [(_key(heap[0]), 0)]
    while frontier:
        _, position = heapq.heappop(frontier)
        if storage.fits_in(heap[position].device.storage):
            return position
        for child in (2 * position + 1, 2 * position + 2):
            if child < len(heap):
                heapq.heappush(frontier, (_key(heap[child]), child))
    return None


def _sift_down(heap: list[OrderedDeviceHardware], position: int) -> None:
    """Restore the heap after the device at `position` grew (its perf only increases)."""
    item, key, size = heap[position], _key(heap[position]), len(heap)
    while True:
        child = 2 * position + 1
        if child >= size:
            break
        child_key = _key(heap[child])
        if child + 1 < size:
            right_key = _key(heap[child + 1])
            if right_key < child_key:
                child, child_key = child + 1, right_key
        if not child_key < key:
            break
        heap[position] = heap[child]
        position = child
    heap[position] = item
