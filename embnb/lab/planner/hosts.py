"""How many hosts a topology has, as torchrec counts them: a Topology puts
`local_world_size` devices on each host (all of them on one host when it is
not given), and its host-level sharding types and partitioner follow that.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from torchrec.distributed.planner.types import Topology

__all__ = ["hosts_of", "HostLayout"]


def hosts_of(topology: Topology) -> int:
    """The hosts of a torchrec Topology: world_size // local_world_size."""
    return topology.world_size // topology.local_world_size


def _span(values: Sequence[int]) -> str:
    return f"{values[0]}" if len(values) == 1 else f"{values[0]} to {values[-1]}"


@dataclass(frozen=True)
class HostLayout:
    """The devices and hosts of one topology of the notebook, or of a family
    of topologies (random instances): the distinct counts, sorted."""

    name: str  # what was planned on it
    devices: tuple[int, ...]  # world sizes
    hosts: tuple[int, ...]  # world_size // local_world_size

    @classmethod
    def of(cls, name: str, topologies: Iterable[Topology]) -> HostLayout:
        topologies = list(topologies)
        return cls.counted(name, [t.world_size for t in topologies], [hosts_of(t) for t in topologies])

    @classmethod
    def counted(cls, name: str, devices: Iterable[int], hosts: Iterable[int]) -> HostLayout:
        """From counts already taken (a study's `world_size` and `hosts` columns)."""
        devices, hosts = sorted({int(d) for d in devices}), sorted({int(h) for h in hosts})
        if not devices or not hosts:
            raise ValueError(f"{name}: no topology to count hosts of")
        return cls(name, tuple(devices), tuple(hosts))

    def __str__(self) -> str:
        plural = "s" if self.hosts != (1,) else ""
        each = " each" if len(self.devices) > 1 else ""
        return f"{self.name}: {_span(self.devices)} devices on {_span(self.hosts)} host{plural}{each}"

    def as_dict(self) -> dict[str, list[int]]:
        return {"devices": list(self.devices), "hosts": list(self.hosts)}
