"""Column-wise cases on real ranks: an EmbeddingCollection, a CW placement per table and a batch per rank,
run through embnb's lookup and torchrec's ShardedEmbeddingCollection (also with torchrec's permute switched
off for one forward) next to the unsharded EmbeddingCollection, with what each rank sent recorded.

    runs = run_cw_cases([CWCase(2, 12, (TableSpec("t0", 32, ("f0",)),), {"t0": [0, 1, 0]})])
    runs[0].matches("torchrec"), runs[0].traffic("reference")
"""

from __future__ import annotations

import contextlib
import traceback
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from embnb import _torchrec_private as private
from embnb._checks import check_choice, check_int
from embnb.columnwise import placement as cw
from embnb.columnwise import torchrec_adapter as adapter
from embnb.columnwise.lookup import cw_sequence_lookup, local_shards
from embnb.dist import launch_each, rank_device

if TYPE_CHECKING:
    from torchrec import EmbeddingCollection, KeyedJaggedTensor

PATHS = ("reference", "torchrec")  # embnb's CW lookup, torchrec's ShardedEmbeddingCollection
UNPERMUTED = ("torchrec_unpermuted",)  # torchrec's module with its permute switched off
Outputs = dict[str, tuple[torch.Tensor, torch.Tensor]]  # output name -> (lengths, values), on the CPU
Batch = dict[str, tuple[torch.Tensor, torch.Tensor]]  # feature -> (lengths, ids)


@dataclass
class Traffic:
    """What one rank sent through all_to_all_single (its inputs, all destinations, itself included)."""

    int_elements: int = 0  # ids, lengths, split counts
    float_elements: int = 0  # embedding rows' values
    int_bytes: int = 0
    float_bytes: int = 0
    calls: int = 0  # all_to_all_single calls: each a collective with its own latency

    def add(self, sent: torch.Tensor) -> None:
        self.calls += 1
        kind = "float" if sent.is_floating_point() else "int"
        setattr(self, f"{kind}_elements", getattr(self, f"{kind}_elements") + sent.numel())
        setattr(self, f"{kind}_bytes", getattr(self, f"{kind}_bytes") + sent.numel() * sent.element_size())


@contextlib.contextmanager
def recorded_all_to_all() -> Iterator[Traffic]:
    """Record every `torch.distributed.all_to_all_single` input while inside (torchrec's all-to-alls and
    embnb's `exchange` both call it); the original function is back on exit, whatever happens."""
    sent, original = Traffic(), dist.all_to_all_single

    def recording(output, input, *args, **kwargs):
        sent.add(input)
        return original(output, input, *args, **kwargs)

    dist.all_to_all_single = recording
    try:
        yield sent
    finally:
        dist.all_to_all_single = original


@dataclass(frozen=True)
class TableSpec:
    """One table of an EmbeddingCollection: rows and the features it serves."""

    name: str
    num_embeddings: int
    feature_names: tuple[str, ...]


@dataclass
class CWCase:
    """An EmbeddingCollection, a CW placement per table and a batch per rank; checked when built."""

    world_size: int
    embedding_dim: int
    tables: tuple[TableSpec, ...]
    placements: dict[str, list[int]]  # table -> rank of each shard, in column order
    widths: dict[str, list[int]] = field(default_factory=dict)  # uneven widths (embnb's path); else equal
    paths: tuple[str, ...] = PATHS  # what runs: "reference" (embnb's lookup) and/or "torchrec"
    batch_size: int = 4
    max_length: int = 3
    seed: int = 0

    def __post_init__(self) -> None:
        names = [t.name for t in self.tables]
        if not names or len(set(names)) != len(names):
            raise ValueError(f"tables must be non-empty with unique names, got {names}")
        check_int("batch_size", self.batch_size, low=1)
        check_int("max_length", self.max_length, low=0)
        if sorted(self.placements) != sorted(names):
            raise ValueError(f"placements name tables {sorted(self.placements)}; tables are {names}")
        if set(self.widths) - set(names):
            raise ValueError(f"widths name unknown tables {sorted(set(self.widths) - set(names))}")
        for table in self.tables:
            check_int(f"{table.name}.num_embeddings", table.num_embeddings, low=1)
            if not table.feature_names:
                raise ValueError(f"table {table.name!r} has no feature_names")
            cw.check_shard_ranks(self.placements[table.name], self.world_size)
            self.shard_widths(table.name)  # raises on widths that do not fit
        if not self.paths or set(self.paths) - set(PATHS):
            raise ValueError(f"paths {self.paths!r}: each must be 'reference' or 'torchrec'")

    def torchrec_problem(self) -> str | None:
        """Why torchrec's ShardedEmbeddingCollection cannot run this case (uneven, unaligned or mixed
        shard widths: embnb's check), or None."""
        try:
            adapter.check_torchrec_placements(
                self.embedding_dim, self.placements, self.world_size, self.widths
            )
        except ValueError as exc:
            return str(exc)
        return None

    def shard_widths(self, table: str) -> list[int]:
        num_shards = len(self.placements[table])
        if table in self.widths:
            return cw.check_widths(self.widths[table], self.embedding_dim, num_shards)
        return cw.equal_widths(self.embedding_dim, num_shards)

    def feature_names(self) -> list[str]:
        """Every feature once, in the order tables name them (the KJT's keys)."""
        return list(dict.fromkeys(f for t in self.tables for f in t.feature_names))

    def output_tables(self) -> dict[str, str]:
        """EmbeddingCollection's output names -> table: the feature, or feature@table when several tables
        read the feature."""
        readers = [f for t in self.tables for f in t.feature_names]
        return {
            (f if readers.count(f) == 1 else f"{f}@{t.name}"): t.name
            for t in self.tables
            for f in t.feature_names
        }


def make_embedding_collection(case: CWCase, device: torch.device | str = "cpu") -> EmbeddingCollection:
    """The unsharded EmbeddingCollection of `case`, its weights drawn from `case.seed` (same everywhere)."""
    from torchrec import EmbeddingCollection, EmbeddingConfig

    configs = [
        EmbeddingConfig(t.num_embeddings, case.embedding_dim, t.name, feature_names=list(t.feature_names))
        for t in case.tables
    ]
    ec = EmbeddingCollection(tables=configs, device=torch.device("cpu"))
    generator = torch.Generator().manual_seed(case.seed)
    with torch.no_grad():
        for table in case.tables:
            weight = ec.embeddings[table.name].weight
            weight.copy_(torch.randn(weight.shape, generator=generator))
    return ec.to(device)


def make_batches(case: CWCase) -> list[Batch]:
    """One batch per rank: per feature `batch_size` sequences of 0 to `max_length` ids, valid in every table
    that reads the feature."""
    features = case.feature_names()
    rows = {f: min(t.num_embeddings for t in case.tables if f in t.feature_names) for f in features}
    batches = []
    for rank in range(case.world_size):
        generator = torch.Generator().manual_seed(case.seed * 1000 + rank + 1)
        batch = {}
        for feature in features:
            lengths = torch.randint(0, case.max_length + 1, (case.batch_size,), generator=generator)
            ids = torch.randint(0, rows[feature], (int(lengths.sum()),), generator=generator)
            batch[feature] = (lengths, ids)
        batches.append(batch)
    return batches


def to_kjt(batch: Batch, device: torch.device | str = "cpu") -> KeyedJaggedTensor:
    from torchrec import KeyedJaggedTensor

    keys = list(batch)
    return KeyedJaggedTensor.from_lengths_sync(
        keys=keys,
        values=torch.cat([batch[k][1] for k in keys]).to(device),
        lengths=torch.cat([batch[k][0] for k in keys]).to(device),
    )


def _plain(outputs) -> Outputs:  # JaggedTensors -> CPU tensors, so results pickle anywhere
    return {name: (jt.lengths().cpu(), jt.values().detach().cpu()) for name, jt in outputs.items()}


def unsharded_outputs(case: CWCase) -> list[Outputs]:
    """What the unsharded EmbeddingCollection returns for each rank's batch."""
    ec = make_embedding_collection(case)
    with torch.no_grad():
        return [_plain(ec(to_kjt(batch))) for batch in make_batches(case)]


@dataclass
class RankOutputs:
    """What one rank returned for a case; a path the case did not run is None."""

    reference: Outputs | None = None  # embnb's CW lookup
    rank_ordered: dict[str, list[torch.Tensor]] | None = None  # its shard outputs, in arrival order
    torchrec: Outputs | None = None  # ShardedEmbeddingCollection
    torchrec_unpermuted: Outputs | None = None  # the same, its permute switched off
    torchrec_permute: dict[str, list[int]] | None = None  # the permute indices torchrec computed
    compute_kernel: str | None = None  # torchrec's kernel
    traffic: dict[str, dict[str, int]] = field(default_factory=dict)  # path -> asdict(Traffic)


def _reference_forward(case: CWCase, ec, features, group, result: RankOutputs) -> None:
    """embnb's CW forward: each rank keeps only its own column shards of `ec`'s weights."""
    rank = dist.get_rank(group)
    result.reference, result.rank_ordered = {}, {}
    for name, table in case.output_tables().items():
        weight = ec.embeddings[table].weight.detach()
        ranks, widths = case.placements[table], case.shard_widths(table)
        jt = features[name.split("@")[0]]
        rows, shards = cw_sequence_lookup(
            jt.values(), local_shards(weight, ranks, widths, rank), ranks, widths, group, weight.dtype
        )
        result.reference[name] = (jt.lengths().cpu(), rows.cpu())
        result.rank_ordered[name] = [s.cpu() for s in shards]


def _torchrec_forward(case: CWCase, ec, features, group, result: RankOutputs) -> None:
    """torchrec's sharded module: one step, a warm step recorded, then one with its permute (a private
    field) emptied for that call and restored: the outputs in rank order, as before torchrec stitched them."""
    sharded = adapter.shard_cw(ec, case.placements, group)
    result.torchrec = _plain(sharded(features).wait())
    with recorded_all_to_all() as sent:
        sharded(features).wait()
    result.traffic["torchrec"] = asdict(sent)
    saved = private.features_to_permute_indices(sharded)
    private.set_features_to_permute_indices(sharded, {})
    try:
        result.torchrec_unpermuted = _plain(sharded(features).wait())
    finally:
        private.set_features_to_permute_indices(sharded, saved)
    result.torchrec_permute = adapter.torchrec_permute_indices(sharded)
    result.compute_kernel = adapter.compute_kernel_for(rank_device(group).type)


def run_case_on_rank(rank: int, world_size: int, case: CWCase) -> RankOutputs | None:
    """Per-rank function for `launch_each`: `case` on ranks 0..case.world_size-1 (a subgroup when the launch
    has more ranks, so one launch serves many world sizes); None on the other ranks."""
    # new_group is collective over the whole world, members or not.
    group = (
        dist.group.WORLD if case.world_size == world_size else dist.new_group(list(range(case.world_size)))
    )
    result = None
    if rank < case.world_size:
        device = rank_device(group)
        ec = make_embedding_collection(case, device)
        features = to_kjt(make_batches(case)[rank], device)
        result = RankOutputs()
        with torch.no_grad():
            if "reference" in case.paths:
                with recorded_all_to_all() as sent:
                    _reference_forward(case, ec, features, group, result)
                result.traffic["reference"] = asdict(sent)
            if "torchrec" in case.paths:
                _torchrec_forward(case, ec, features, group, result)
    dist.barrier()  # ranks outside the case wait here, not inside the next case's collectives
    return result


@dataclass
class CWRun:
    """A case's outputs on every rank (index = rank), next to the unsharded EmbeddingCollection's."""

    case: CWCase
    expected: list[Outputs]
    ranks: list[RankOutputs]

    def _output(self, rank: RankOutputs, path: str, name: str) -> torch.Tensor:
        if check_choice("path", path, PATHS + UNPERMUTED + ("naive",)) == "naive":
            return cw.concat_in_rank_order(rank.rank_ordered[name])
        return getattr(rank, path)[name][1]

    def matches(self, path: str) -> bool:
        """`path` ("reference", "torchrec", "torchrec_unpermuted" or "naive": rank-order concatenation)
        equals the unsharded EC on every rank, exactly (lengths too where the path returns them)."""
        for want, rank in zip(self.expected, self.ranks):
            got = want if path == "naive" else getattr(rank, check_choice("path", path, PATHS + UNPERMUTED))
            if got is None or sorted(got) != sorted(want):
                return False
            for name, (lengths, values) in want.items():
                if not torch.equal(got[name][0], lengths) or not torch.equal(
                    self._output(rank, path, name), values
                ):
                    return False
        return True

    def traffic(self, path: str) -> list[dict[str, int]]:
        """What each rank sent through all_to_all_single in one forward of `path`."""
        return [rank.traffic[check_choice("path", path, PATHS)] for rank in self.ranks]

    def abs_errors(self, path: str, name: str) -> torch.Tensor:
        """|output - unsharded| of output `name`: a row per looked-up id of every rank in rank order, a column
        per embedding column (`path` as in `matches`)."""
        return torch.cat(
            [
                (self._output(rank, path, name) - want[name][1]).abs()
                for want, rank in zip(self.expected, self.ranks)
            ]
        )

    def max_abs_error(self, path: str) -> float:
        errors = [self.abs_errors(path, name) for name in self.expected[0]] if self.expected else []
        return max([float(e.max()) for e in errors if e.numel()], default=0.0)


def run_cw_cases(
    cases: Sequence[CWCase], device: str = "auto", timeout_s: float = 300.0, then: Sequence[tuple] = ()
) -> list:
    """Run `cases` on real ranks in one `launch_each` (gloo on CPU, nccl with a GPU per rank), each paired
    with the unsharded EC's outputs (a `CWRun`); a case torchrec cannot take is refused before any rank
    starts. `then`: more (fn, args) calls in the same launch, after the cases; their results follow."""
    cases = list(cases)
    if not cases:
        raise ValueError("cases is empty: nothing to run")
    for case in cases:  # a case torchrec cannot take would fail on some ranks only
        problem = case.torchrec_problem() if "torchrec" in case.paths else None
        if problem:
            raise ValueError(problem)
    calls = [(run_case_on_rank, (case,)) for case in cases] + list(then)
    per_call = launch_each(calls, max(c.world_size for c in cases), device=device, timeout_s=timeout_s)
    runs = [
        CWRun(case, unsharded_outputs(case), ranks[: case.world_size]) for case, ranks in zip(cases, per_call)
    ]
    return runs + per_call[len(cases) :]


@dataclass(frozen=True)
class TorchrecOutcome:
    """What one rank got from torchrec's `column_wise(size_per_rank=...)`: its error, or whether its output
    equals the unsharded EC's; and the widths its sharded module worked with."""

    error: str | None  # "RuntimeError: ..." as torchrec raised it, or None
    matches: bool | None  # output equal to the unsharded EC (None after an error)
    max_abs_error: float | None
    raised_in: str | None = None  # the innermost torchrec frame of the error: "path:line"
    own_width: int | None = None  # columns of the table this rank holds, by torchrec's plan
    local_embedding_dim: int | None = None  # the width torchrec views this rank's lookups as (private field)


def _torchrec_size_per_rank_on_rank(
    rank: int, world_size: int, case: CWCase, sizes: list[int]
) -> TorchrecOutcome:
    device = rank_device()
    ec = make_embedding_collection(case, device)
    features = to_kjt(make_batches(case)[rank], device)
    own, local = (sizes[rank] if rank < len(sizes) else 0), None
    try:
        with torch.no_grad():
            sharded = adapter.shard_cw(ec, case.placements, size_per_rank=sizes)
            local = private.local_embedding_dim(sharded)
            got = _plain(sharded(features).wait())
    except Exception as error:  # torchrec's own failure is the result; the peer fails at the same step
        frame = (
            [f for f in traceback.extract_tb(error.__traceback__) if "/torchrec/" in f.filename] or [None]
        )[-1]
        where = frame and f"torchrec/{frame.filename.rsplit('/torchrec/', 1)[1]}:{frame.lineno}"
        text = f"{type(error).__name__}: {(str(error).splitlines() or [''])[0][:200]}"
        return TorchrecOutcome(text, None, None, where, own, local)
    want = unsharded_outputs(case)[rank]
    worst = max(float((got[n][1] - v).abs().max()) if v.numel() else 0.0 for n, (_, v) in want.items())
    return TorchrecOutcome(None, worst == 0.0, worst, None, own, local)


def size_per_rank_call(case: CWCase, size_per_rank: Sequence[int]) -> tuple:
    """The (fn, args) call for `launch_each` that runs torchrec's `column_wise(size_per_rank=...)` (shard i
    on rank i) on `case`'s one table as torchrec takes it (no embnb check first): each rank's
    `TorchrecOutcome`. It may break the process group: the last call of a launch."""
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
    return (_torchrec_size_per_rank_on_rank, (case, sizes))
