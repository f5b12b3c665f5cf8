"""Where each row of a row-wise sharded torchrec table lives, per routing (`TableLayout`), and a table's
rows moved from one layout to another (`convert_rows`).

torchrec stores a table of `R` rows in contiguous blocks of `block = ceil(R / W)` rows, and its input
distribution sends id `i` to rank `i // block` as local row `i % block`: the `continuous` routing.
embnb's sharders keep that machinery (the FBGEMM table-batched kernels, the one all-to-all) and choose
the routing by renumbering ids first: id `i` becomes the storage slot `owner(i) * block + local(i)`, so
torchrec's blocks put it on `owner(i)`; `local(i)` is i's position among its owner's ids, so storage
stays dense. `roundrobin` is owner `id % W`, local `id // W`; `feistel_roundrobin` the same on `p(id)`,
a keyed bijection of `[0, N)` (`embnb.rowwise.hashing.feistel_permutation`): dense and balanced (rank
row counts differ by at most one) however the ids are numbered, but like any hash it does not spread
one hot id. Both round-robin routings store `W * ceil(N / W)` rows (at most `W - 1` padding rows that no
id reaches; torchrec's blocks of `ceil(N / W)` would leave the last ranks short), in an order that
depends on W; continuous rows do not (torchrec reshards them itself). The table of owners and local rows:
docs/sharders.md.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import torch

from embnb._checks import check_int, check_int_tensor
from embnb.cuda import loader
from embnb.rowwise.hashing import feistel_half_bits, feistel_permutation, feistel_round_keys
from embnb.rowwise.routing import parse_mode

__all__ = ["Routing", "TableLayout", "convert_rows"]


class Routing(str, enum.Enum):
    """Row-wise routing of a torchrec table; the value is what a checkpoint records."""

    CONTINUOUS = "continuous"
    ROUNDROBIN = "roundrobin"
    FEISTEL_ROUNDROBIN = "feistel_roundrobin"

    def __str__(self) -> str:
        return self.value

    @classmethod
    def parse(cls, value: Routing | str) -> Routing:
        """The Routing for `value`; raise naming the valid values."""
        return parse_mode(cls, "routing", value)


@dataclass(frozen=True)
class TableLayout:
    """One table's row-wise layout: N ids, W ranks, a routing (and a hash seed).

    `storage_rows` is what torchrec's sharded table holds (N for
    continuous, `W * block_size` for the round-robin routings); `slots(ids)` maps ids to storage rows;
    rank r holds slots `[r * block_size, (r + 1) * block_size)`.
    """

    num_embeddings: int
    world_size: int
    routing: Routing = Routing.CONTINUOUS
    seed: int = 0

    def __post_init__(self) -> None:
        check_int("num_embeddings", self.num_embeddings, low=1)
        check_int("world_size", self.world_size, low=1)
        check_int("seed", self.seed, low=0)
        object.__setattr__(self, "routing", Routing.parse(self.routing))

    @property
    def block_size(self) -> int:
        """Rows per rank in torchrec's blocks: ceil(N / W)."""
        return -(-self.num_embeddings // self.world_size)

    @property
    def storage_rows(self) -> int:
        if self.routing is Routing.CONTINUOUS:
            return self.num_embeddings
        return self.world_size * self.block_size

    def rows_per_rank(self) -> list[int]:
        """Storage rows on each rank, as torchrec's row-wise shards hold them."""
        b, rows = self.block_size, self.storage_rows
        return [min(b, max(0, rows - r * b)) for r in range(self.world_size)]

    def slots(self, ids: torch.Tensor, native: bool | None = None) -> torch.Tensor:
        """Storage row of each id (int64); raise on an id outside [0, N).

        `native` (feistel_roundrobin): None runs torch.ops.embnb.feistel_slots
        where the native library is built (`make setup`, `python -m embnb.cuda
        build`; nothing compiles here, inside a training step) and, for CUDA
        ids, holds its CUDA kernels; else the torch version; True needs it;
        False runs the torch version. Both give the same slots."""
        ids = check_int_tensor("ids", ids).to(torch.int64)
        if ids.numel():
            low, high = torch.stack(torch.aminmax(ids)).tolist()  # one read back from a GPU, not two
            if low < 0 or high >= self.num_embeddings:
                bad = low if low < 0 else high
                raise ValueError(
                    f"id {bad} is outside [0, {self.num_embeddings}) (the table's num_embeddings)"
                )
        if self.routing is Routing.CONTINUOUS:
            return ids
        if self.routing is Routing.FEISTEL_ROUNDROBIN:
            on_host = ids.device.type == "cpu"
            if loader.use(native, build=False) and (native or on_host or loader.load(False).cuda):
                keys = feistel_round_keys(self.seed)
                n, w = self.num_embeddings, self.world_size
                return torch.ops.embnb.feistel_slots(ids, n, w, feistel_half_bits(n), keys)
            ids = feistel_permutation(ids, self.num_embeddings, self.seed)
        return (ids % self.world_size) * self.block_size + ids // self.world_size

    def owner(self, ids: torch.Tensor) -> torch.Tensor:
        """Rank that holds each id's row."""
        return self.slots(ids) // self.block_size

    @property
    def key_suffix(self) -> str:
        """What this table's state dict keys end with: "" under continuous (torchrec's own keys, whose
        rows torchrec reshards), else the layout the rows are stored in, e.g. `@roundrobin(world_size=2)`
        or `@feistel_roundrobin(world_size=2,seed=0)`. A loader of another layout asks for another key,
        so DCP's load planning fails before any tensor is written."""
        if self.routing is Routing.CONTINUOUS:
            return ""
        seed = f",seed={self.seed}" if self.routing is Routing.FEISTEL_ROUNDROBIN else ""
        return f"@{self.routing.value}(world_size={self.world_size}{seed})"


def convert_rows(rows: torch.Tensor, source: TableLayout, target: TableLayout) -> torch.Tensor:
    """A table's storage rows saved under `source`, laid out for `target`.

    `rows` holds `source.storage_rows` rows in storage order (what
    torchrec's row-wise shards hold, concatenated by rank). Every id's row
    moves to `target.slots(id)`; padding rows of the result are zero.
    Pure: neither input is modified.
    """
    if source.num_embeddings != target.num_embeddings:
        raise ValueError(
            f"source has num_embeddings={source.num_embeddings}, target {target.num_embeddings}: "
            f"a layout conversion keeps the table's ids"
        )
    if not isinstance(rows, torch.Tensor) or rows.dim() < 1 or rows.shape[0] != source.storage_rows:
        shape = tuple(rows.shape) if isinstance(rows, torch.Tensor) else type(rows).__name__
        raise ValueError(f"rows must have source.storage_rows={source.storage_rows} rows, got {shape}")
    ids = torch.arange(source.num_embeddings)
    out = rows.new_zeros((target.storage_rows, *rows.shape[1:]))
    out[target.slots(ids)] = rows[source.slots(ids)]
    return out
