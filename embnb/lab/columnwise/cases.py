"""Column-wise cases on real ranks: an EmbeddingCollection, a placement per
table and a batch per rank, run through embnb's lookup and torchrec's
ShardedEmbeddingCollection next to the unsharded EmbeddingCollection.

    runs = run_cw_cases([CWCase(2, 12, (TableSpec("t0", 32, ("f0",)),), {"t0": [0, 1, 0]})])
    runs[0].reference_matches(), runs[0].torchrec_matches()
    runs[0].traffic("torchrec")  # what each rank sent through all_to_all_single

Each torchrec run also steps once with torchrec's own permute switched off
(`torchrec_unpermuted`: its `_features_to_permute_indices` emptied for that
forward, then restored), so the bug the permute fixes is shown in torchrec.
`run_torchrec_size_per_rank` runs torchrec's `column_wise(size_per_rank=...)`
(uneven widths) as torchrec takes it, and reports what each rank got.

A `CWCase` checks itself with the placement maths when it is built; what
only torchrec cannot take (uneven or unaligned widths) is refused by
`run_cw_cases` in the parent, before any rank starts.
"""

from __future__ import annotations

import traceback
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from embnb._checks import check_choice, check_int
from embnb._torchrec_private import (
    features_to_permute_indices,
    local_embedding_dim,
    set_features_to_permute_indices,
)
from embnb.columnwise.lookup import cw_sequence_lookup, local_shards
from embnb.columnwise.placement import check_shard_ranks, check_widths, concat_in_rank_order, equal_widths
from embnb.columnwise.torchrec_adapter import (
    check_torchrec_placements,
    compute_kernel_for,
    shard_cw,
    torchrec_permute_indices,
)
from embnb.dist import launch_each, rank_device
from embnb.lab.columnwise.traffic import recorded_all_to_all

if TYPE_CHECKING:
    from torchrec import EmbeddingCollection, KeyedJaggedTensor
    from torchrec.distributed.embedding import ShardedEmbeddingCollection

__all__ = [
    "PATHS",
    "TableSpec",
    "CWCase",
    "CWRun",
    "make_embedding_collection",
    "make_batches",
    "to_kjt",
    "unsharded_outputs",
    "reference_cw_forward",
    "RankOutputs",
    "run_case_on_rank",
    "run_cw_cases",
    "TorchrecOutcome",
    "run_torchrec_size_per_rank",
]


PATHS = ("reference", "torchrec")  # embnb's CW lookup, torchrec's ShardedEmbeddingCollection


@dataclass(frozen=True)
class TableSpec:
    """One table of an EmbeddingCollection: rows and the features it serves."""

    name: str
    num_embeddings: int
    feature_names: tuple[str, ...]


@dataclass
class CWCase:
    """An EmbeddingCollection, a CW placement per table and a batch per rank.

    `widths[table]` gives uneven shard widths (embnb's path only); tables
    missing from it get torchrec's equal split. `paths` picks what runs:
    "reference" (embnb's own lookup) and/or "torchrec".
    """

    world_size: int
    embedding_dim: int
    tables: tuple[TableSpec, ...]
    placements: dict[str, list[int]]
    widths: dict[str, list[int]] = field(default_factory=dict)
    paths: tuple[str, ...] = ("reference", "torchrec")
    batch_size: int = 4
    max_length: int = 3
    seed: int = 0

    def __post_init__(self) -> None:
        names = [t.name for t in self.tables]
        if not names or len(set(names)) != len(names):
            raise ValueError(f"tables must be non-empty with unique names, got {names}")
        check_int("batch_size", self.batch_size, low=1)
        check_int("max_length", self.max_length, low=0)
        for t in self.tables:
            check_int(f"{t.name}.num_embeddings", t.num_embeddings, low=1)
        if sorted(self.placements) != sorted(names):
            raise ValueError(f"placements name tables {sorted(self.placements)}; tables are {names}")
        unknown = sorted(set(self.widths) - set(names))
        if unknown:
            raise ValueError(f"widths name unknown tables {unknown}; tables are {names}")
        for table in self.tables:
            if not table.feature_names:
                raise ValueError(f"table {table.name!r} has no feature_names")
            check_shard_ranks(self.placements[table.name], self.world_size)
            self.shard_widths(table.name)  # raises on widths that do not fit
        bad_paths = [p for p in self.paths if p not in PATHS]
        if bad_paths or not self.paths:
            raise ValueError(f"paths {self.paths!r}: each must be 'reference' or 'torchrec'")

    def check_torchrec(self) -> None:
        """Raise a ValueError if torchrec's ShardedEmbeddingCollection cannot
        run this case (uneven, unaligned or mixed shard widths); `run_cw_cases`
        calls it in the parent, before any rank starts."""
        check_torchrec_placements(self.embedding_dim, self.placements, self.world_size, self.widths)

    def torchrec_problem(self) -> str | None:
        """Why torchrec cannot run this case (`check_torchrec`'s message), or None."""
        try:
            self.check_torchrec()
        except ValueError as exc:
            return str(exc)
        return None

    def shard_widths(self, table: str) -> list[int]:
        ranks = self.placements[table]
        if table in self.widths:
            return check_widths(self.widths[table], self.embedding_dim, len(ranks))
        return equal_widths(self.embedding_dim, len(ranks))

    def feature_names(self) -> list[str]:
        """Every feature once, in the order tables name them (the KJT's keys)."""
        return list(dict.fromkeys(f for t in self.tables for f in t.feature_names))

    def output_tables(self) -> dict[str, str]:
        """EmbeddingCollection's output names -> table: the feature's name, or
        feature@table when several tables read the feature."""
        readers = [f for t in self.tables for f in t.feature_names]
        return {
            (f if readers.count(f) == 1 else f"{f}@{t.name}"): t.name
            for t in self.tables
            for f in t.feature_names
        }


def make_embedding_collection(case: CWCase, device: torch.device | str = "cpu") -> EmbeddingCollection:
    """The unsharded torchrec EmbeddingCollection of `case`, its weights drawn
    from `case.seed` (the same on every rank and in the parent)."""
    from torchrec import EmbeddingCollection, EmbeddingConfig

    configs = [
        EmbeddingConfig(
            name=t.name,
            embedding_dim=case.embedding_dim,
            num_embeddings=t.num_embeddings,
            feature_names=list(t.feature_names),
        )
        for t in case.tables
    ]
    ec = EmbeddingCollection(tables=configs, device=torch.device("cpu"))
    generator = torch.Generator().manual_seed(case.seed)
    with torch.no_grad():
        for table in case.tables:
            weight = ec.embeddings[table.name].weight
            weight.copy_(torch.randn(weight.shape, generator=generator))
    return ec.to(device)


Batch = dict[str, tuple[torch.Tensor, torch.Tensor]]  # feature -> (lengths, ids)


def make_batches(case: CWCase) -> list[Batch]:
    """One batch per rank: for each feature `batch_size` sequences of 0 to
    `max_length` ids, valid in every table that reads the feature."""
    rows = {
        f: min(t.num_embeddings for t in case.tables if f in t.feature_names) for f in case.feature_names()
    }
    batches = []
    for rank in range(case.world_size):
        generator = torch.Generator().manual_seed(case.seed * 1000 + rank + 1)
        batch = {}
        for feature in case.feature_names():
            lengths = torch.randint(0, case.max_length + 1, (case.batch_size,), generator=generator)
            ids = torch.randint(0, rows[feature], (int(lengths.sum()),), generator=generator)
            batch[feature] = (lengths, ids)
        batches.append(batch)
    return batches


def to_kjt(batch: Batch, device: torch.device | str = "cpu") -> KeyedJaggedTensor:
    """A KeyedJaggedTensor of a batch, keys in the batch's order."""
    from torchrec import KeyedJaggedTensor

    keys = list(batch)
    return KeyedJaggedTensor.from_lengths_sync(
        keys=keys,
        values=torch.cat([batch[k][1] for k in keys]).to(device),
        lengths=torch.cat([batch[k][0] for k in keys]).to(device),
    )


def _plain(outputs: Mapping[str, Any]) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    # JaggedTensor -> (lengths, values) on CPU, so results pickle anywhere.
    return {name: (jt.lengths().cpu(), jt.values().detach().cpu()) for name, jt in outputs.items()}


def unsharded_outputs(case: CWCase) -> list[dict[str, tuple[torch.Tensor, torch.Tensor]]]:
    """What the unsharded EmbeddingCollection returns for each rank's batch."""
    ec = make_embedding_collection(case)
    with torch.no_grad():
        return [_plain(ec(to_kjt(batch))) for batch in make_batches(case)]


def reference_cw_forward(
    case: CWCase,
    ec: EmbeddingCollection,
    features: KeyedJaggedTensor,
    group: dist.ProcessGroup | None = None,
) -> tuple[dict[str, tuple[torch.Tensor, torch.Tensor]], dict[str, list[torch.Tensor]]]:
    """embnb's CW forward of `case` for this rank's KeyedJaggedTensor: per
    output name (as EmbeddingCollection names them), (lengths, rows) and the
    rank-ordered shard outputs. Each rank keeps only its own column shards
    of `ec`'s weights. Collective over `group`.
    """
    rank = dist.get_rank(group)
    local = {
        t.name: local_shards(
            ec.embeddings[t.name].weight.detach(), case.placements[t.name], case.shard_widths(t.name), rank
        )
        for t in case.tables
    }
    outputs, rank_ordered = {}, {}
    for name, table in case.output_tables().items():
        jt = features[name.split("@")[0]]
        rows, shards = cw_sequence_lookup(
            jt.values(),
            local[table],
            case.placements[table],
            case.shard_widths(table),
            group,
            ec.embeddings[table].weight.dtype,
        )
        outputs[name] = (jt.lengths().cpu(), rows.cpu())
        rank_ordered[name] = [s.cpu() for s in shards]
    return outputs, rank_ordered


@dataclass
class RankOutputs:
    """What one rank returned for a case. Outputs map an output name (as
    EmbeddingCollection names them) to (lengths, values), on the CPU; a path
    the case did not run is None."""

    device: str  # where the rank computed: "cpu" or "cuda"
    reference: dict[str, tuple[torch.Tensor, torch.Tensor]] | None = None  # embnb's CW lookup
    rank_ordered: dict[str, list[torch.Tensor]] | None = None  # its shard outputs, in arrival order
    torchrec: dict[str, tuple[torch.Tensor, torch.Tensor]] | None = None  # ShardedEmbeddingCollection
    torchrec_unpermuted: dict[str, tuple[torch.Tensor, torch.Tensor]] | None = None  # its permute off
    torchrec_permute: dict[str, list[int]] | None = None  # the permute indices torchrec computed
    compute_kernel: str | None = None  # torchrec's kernel
    traffic: dict[str, dict[str, int]] = field(default_factory=dict)  # path -> Traffic.as_dict()


def _without_permute(sharded: ShardedEmbeddingCollection, features: KeyedJaggedTensor) -> dict:
    """One forward of torchrec's module with its CW permute switched off (a
    private field, emptied for this call and restored): the outputs in rank
    order, as before torchrec stitched them."""
    saved = features_to_permute_indices(sharded)
    set_features_to_permute_indices(sharded, {})
    try:
        return _plain(sharded(features).wait())
    finally:
        set_features_to_permute_indices(sharded, saved)


def run_case_on_rank(rank: int, world_size: int, case: CWCase) -> RankOutputs | None:
    """Per-rank function for `embnb.dist.launch_each`: run `case` on ranks
    0..case.world_size-1 (a subgroup when the launch has more ranks, so one
    launch serves many world sizes). None on ranks outside the case."""
    # new_group is collective over the whole world, members or not.
    group = (
        dist.group.WORLD if case.world_size == world_size else dist.new_group(list(range(case.world_size)))
    )
    result = None
    if rank < case.world_size:
        device = rank_device(group)
        ec = make_embedding_collection(case, device)
        features = to_kjt(make_batches(case)[rank], device)
        result = RankOutputs(device.type)
        with torch.no_grad():
            if "reference" in case.paths:
                with recorded_all_to_all() as sent:
                    result.reference, result.rank_ordered = reference_cw_forward(case, ec, features, group)
                result.traffic["reference"] = sent.as_dict()
            if "torchrec" in case.paths:
                sharded = shard_cw(ec, case.placements, group)
                result.torchrec = _plain(sharded(features).wait())
                with recorded_all_to_all() as sent:  # a second, warm step
                    sharded(features).wait()
                result.traffic["torchrec"] = sent.as_dict()
                result.torchrec_unpermuted = _without_permute(sharded, features)
                result.torchrec_permute = torchrec_permute_indices(sharded)
                result.compute_kernel = compute_kernel_for(device.type)
    dist.barrier()  # ranks outside the case wait here, not inside the next case's collectives
    return result


@dataclass
class CWRun:
    """A case's outputs on every rank (index = rank), next to the unsharded
    EmbeddingCollection's. Each output: name -> (lengths, values)."""

    case: CWCase
    expected: list[dict[str, tuple[torch.Tensor, torch.Tensor]]]
    ranks: list[RankOutputs]

    def _matches(self, path: str) -> bool:
        for want, rank in zip(self.expected, self.ranks):
            got = getattr(rank, path)
            if got is None or sorted(got) != sorted(want):
                return False
            for name, (lengths, values) in want.items():
                if not (torch.equal(got[name][0], lengths) and torch.equal(got[name][1], values)):
                    return False
        return True

    def torchrec_unpermuted_matches(self) -> bool:
        """torchrec's module with its permute switched off equals the unsharded EC."""
        return self._matches("torchrec_unpermuted")

    def traffic(self, path: str) -> list[dict[str, int]]:
        """What each rank sent through all_to_all_single in one forward of `path`."""
        return [rank.traffic[check_choice("path", path, PATHS)] for rank in self.ranks]

    def reference_matches(self) -> bool:
        """embnb's CW lookup equals the unsharded EC on every rank, exactly."""
        return self._matches("reference")

    def torchrec_matches(self) -> bool:
        """torchrec's ShardedEmbeddingCollection equals the unsharded EC, exactly."""
        return self._matches("torchrec")

    def naive_matches(self) -> bool:
        """Concatenating shard outputs in arrival (rank) order equals the unsharded EC."""
        return all(
            torch.equal(self._output(rank, "naive", name), values)
            for want, rank in zip(self.expected, self.ranks)
            for name, (_, values) in want.items()
        )

    def _output(self, rank: RankOutputs, path: str, name: str) -> torch.Tensor:
        if path == "naive":
            return concat_in_rank_order(rank.rank_ordered[name])
        return getattr(rank, check_choice("path", path, (*PATHS, "torchrec_unpermuted", "naive")))[name][1]

    def abs_errors(self, path: str, name: str) -> torch.Tensor:
        """|output - unsharded| of output `name`, one row per looked-up id of
        every rank in rank order, one column per embedding column; `path` is
        "reference", "torchrec", "torchrec_unpermuted" (its permute off) or
        "naive" (rank-order concatenation)."""
        return torch.cat(
            [
                (self._output(rank, path, name) - want[name][1]).abs()
                for want, rank in zip(self.expected, self.ranks)
            ]
        )

    def max_abs_error(self, path: str) -> float:
        """Largest |output - unsharded| over ranks and outputs (see `abs_errors`)."""
        errors = [self.abs_errors(path, name) for name in self.expected[0]] if self.expected else []
        return max([float(e.max()) for e in errors if e.numel()], default=0.0)


def run_cw_cases(cases: Sequence[CWCase], device: str = "auto", timeout_s: float = 300.0) -> list[CWRun]:
    """Run `cases` on real ranks in one `embnb.dist.launch_each` (`device` by
    `embnb.dist.device_plan`: gloo on CPU, nccl with a GPU per rank), and pair
    each with the unsharded EC's outputs."""
    cases = list(cases)
    if not cases:
        raise ValueError("cases is empty: nothing to run")
    for case in cases:  # a case torchrec cannot take would fail on some ranks only
        if "torchrec" in case.paths:
            case.check_torchrec()
    world_size = max(c.world_size for c in cases)
    per_case = launch_each(
        [(run_case_on_rank, (case,)) for case in cases], world_size, device=device, timeout_s=timeout_s
    )
    return [
        CWRun(case, unsharded_outputs(case), ranks[: case.world_size]) for case, ranks in zip(cases, per_case)
    ]


@dataclass(frozen=True)
class TorchrecOutcome:
    """What one rank got from torchrec: its error, or whether its output
    equals the unsharded EmbeddingCollection's; and the widths its sharded
    module worked with."""

    error: str | None  # "RuntimeError: ..." as torchrec raised it, or None
    matches: bool | None  # output equal to the unsharded EC (None after an error)
    max_abs_error: float | None
    raised_in: str | None = None  # the innermost torchrec frame of the error: "path:line"
    own_width: int | None = None  # columns of the table this rank holds, by torchrec's plan
    local_embedding_dim: int | None = None  # the width torchrec views this rank's lookups as

    def describe(self) -> str:
        if self.error is not None:
            return self.error + (f" [in {self.raised_in}]" if self.raised_in else "")
        return "equals the unsharded EC" if self.matches else f"WRONG: max |error| {self.max_abs_error:.3g}"


def _innermost_torchrec_frame(error: BaseException) -> str | None:
    frames = [f for f in traceback.extract_tb(error.__traceback__) if "/torchrec/" in f.filename]
    if not frames:
        return None
    return f"torchrec/{frames[-1].filename.rsplit('/torchrec/', 1)[1]}:{frames[-1].lineno}"


def _torchrec_size_per_rank_on_rank(rank: int, world_size: int, case: CWCase, size_per_rank: list[int]):
    device = rank_device()
    ec = make_embedding_collection(case, device)
    features = to_kjt(make_batches(case)[rank], device)
    widths = None  # (columns held here, torchrec's local width), once the module is built
    try:
        with torch.no_grad():
            sharded = shard_cw(ec, case.placements, size_per_rank=size_per_rank)
            # a private field: the one width torchrec's EC gives every rank's CW lookups
            widths = (size_per_rank[rank] if rank < len(size_per_rank) else 0, local_embedding_dim(sharded))
            return None, None, widths, _plain(sharded(features).wait())
    except Exception as error:  # torchrec's own failure is the result; the peer fails at the same step
        first_line = (str(error).splitlines() or [""])[0]
        return f"{type(error).__name__}: {first_line[:200]}", _innermost_torchrec_frame(error), widths, None


def run_torchrec_size_per_rank(
    case: CWCase, size_per_rank: Sequence[int], device: str = "auto", timeout_s: float = 120.0
) -> list[TorchrecOutcome]:
    """torchrec's `column_wise(size_per_rank=...)` on `case`'s one table, run
    as torchrec takes it (no embnb check first), in a launch of its own: each
    rank's error text, or its output against the unsharded EC."""
    sizes = [check_int("size_per_rank entry", s, low=1) for s in size_per_rank]
    if len(case.tables) != 1 or sum(sizes) != case.embedding_dim:
        raise ValueError(
            f"size_per_rank {sizes} must cover embedding_dim {case.embedding_dim} of one table, "
            f"got {len(case.tables)} tables"
        )
    if len(sizes) > case.world_size:
        raise ValueError(
            f"size_per_rank {sizes} puts shard i on rank i: needs {len(sizes)} ranks, has {case.world_size}"
        )
    expected = unsharded_outputs(case)
    per_rank = launch_each(
        [(_torchrec_size_per_rank_on_rank, (case, sizes))],
        case.world_size,
        device=device,
        timeout_s=timeout_s,
    )[0]
    outcomes = []
    for want, (error, where, widths, got) in zip(expected, per_rank):
        own, local = widths or (None, None)
        if error is not None:
            outcomes.append(TorchrecOutcome(error, None, None, where, own, local))
            continue
        worst = max(float((got[n][1] - v).abs().max()) if v.numel() else 0.0 for n, (_, v) in want.items())
        outcomes.append(TorchrecOutcome(None, worst == 0.0, worst, None, own, local))
    return outcomes
