"""Column-wise cases on real ranks: one EmbeddingCollection table ("t0", feature "f0") cut into column
shards on a placement, a batch per rank, run through embnb's lookup and torchrec's
ShardedEmbeddingCollection (also with its permute switched off for one forward) next to the unsharded
EmbeddingCollection, with what each rank sent recorded; torchrec's pooled path and its uneven
`column_wise(size_per_rank=...)` on ranks too.

    (run,) = run_cw_cases([CWCase(2, 12, [0, 1, 0])])
    run.matches("torchrec"), run.traffic("reference")
"""

from __future__ import annotations

import contextlib
import dataclasses
import traceback
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
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

TABLE, FEATURE = "t0", "f0"
PATHS = ("reference", "torchrec")  # embnb's CW lookup, torchrec's ShardedEmbeddingCollection
Output = tuple[torch.Tensor, torch.Tensor]  # (lengths, values) of one rank's lookup, on the CPU


@contextlib.contextmanager
def recorded_all_to_all() -> Iterator[dict[str, int]]:
    """Record every `torch.distributed.all_to_all_single` input while inside (torchrec's all-to-alls and
    embnb's `exchange` both call it): `calls` (each a collective with its own latency), and elements
    and bytes of integers (ids, lengths, split counts) and of floats (rows' values), all destinations
    (itself included). The original function is back on exit, whatever happens."""
    sent = dict.fromkeys(("calls", "int_elements", "float_elements", "int_bytes", "float_bytes"), 0)
    original = dist.all_to_all_single

    def recording(output, input, *args, **kwargs):
        kind = "float" if input.is_floating_point() else "int"
        sent["calls"] += 1
        sent[f"{kind}_elements"] += input.numel()
        sent[f"{kind}_bytes"] += input.numel() * input.element_size()
        return original(output, input, *args, **kwargs)

    dist.all_to_all_single = recording
    try:
        yield sent
    finally:
        dist.all_to_all_single = original


@dataclass(frozen=True)
class CWCase:
    """One table cut column-wise on `shard_ranks`, and a batch per rank; checked when built."""

    world_size: int
    embedding_dim: int
    shard_ranks: Sequence[int]  # rank of each shard, in column order
    widths: Sequence[int] | None = None  # uneven widths (embnb's path only); None: the equal split
    num_embeddings: int = 32
    paths: tuple[str, ...] = PATHS  # what runs: "reference" (embnb's lookup) and/or "torchrec"
    batch_size: int = 4  # sequences per rank
    max_length: int = 3  # ids per sequence, at most (uniform from 0)
    seed: int = 0

    def __post_init__(self) -> None:
        check_int("num_embeddings", self.num_embeddings, low=1)
        check_int("batch_size", self.batch_size, low=1)
        check_int("max_length", self.max_length, low=0)
        cw.check_shard_ranks(self.shard_ranks, self.world_size)
        self.shard_widths()  # raises on widths that do not fit
        if not self.paths or set(self.paths) - set(PATHS):
            raise ValueError(f"paths {self.paths!r}: each must be 'reference' or 'torchrec'")

    def shard_widths(self) -> list[int]:
        if self.widths is not None:
            return cw.check_widths(self.widths, self.embedding_dim, len(self.shard_ranks))
        return cw.equal_widths(self.embedding_dim, len(self.shard_ranks))

    def torchrec_problem(self) -> str | None:
        """Why torchrec's ShardedEmbeddingCollection cannot take this case (uneven or unaligned shard
        widths: embnb's check), or None."""
        widths = {TABLE: list(self.widths)} if self.widths is not None else None
        placements = {TABLE: list(self.shard_ranks)}
        try:
            adapter.check_torchrec_placements(self.embedding_dim, placements, self.world_size, widths)
        except ValueError as exc:
            return str(exc)
        return None


def make_embedding_collection(case: CWCase, device: torch.device | str = "cpu") -> EmbeddingCollection:
    """The unsharded EmbeddingCollection of `case`, its weights drawn from `case.seed` (same everywhere)."""
    from torchrec import EmbeddingCollection, EmbeddingConfig

    config = EmbeddingConfig(case.num_embeddings, case.embedding_dim, TABLE, feature_names=[FEATURE])
    ec = EmbeddingCollection(tables=[config], device=torch.device("cpu"))
    with torch.no_grad():
        weight = ec.embeddings[TABLE].weight
        weight.copy_(torch.randn(weight.shape, generator=torch.Generator().manual_seed(case.seed)))
    return ec.to(device)


def make_batches(case: CWCase) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(lengths, ids) per rank: `batch_size` sequences of 0 to `max_length` ids."""
    batches = []
    for rank in range(case.world_size):
        generator = torch.Generator().manual_seed(case.seed * 1000 + rank + 1)
        lengths = torch.randint(0, case.max_length + 1, (case.batch_size,), generator=generator)
        ids = torch.randint(0, case.num_embeddings, (int(lengths.sum()),), generator=generator)
        batches.append((lengths, ids))
    return batches


def to_kjt(lengths: torch.Tensor, ids: torch.Tensor, device: torch.device | str = "cpu") -> KeyedJaggedTensor:
    from torchrec import KeyedJaggedTensor

    return KeyedJaggedTensor.from_lengths_sync([FEATURE], ids.to(device), lengths=lengths.to(device))


def _plain(outputs) -> Output:  # JaggedTensors -> CPU tensors, so results pickle anywhere
    return outputs[FEATURE].lengths().cpu(), outputs[FEATURE].values().detach().cpu()


def unsharded_outputs(case: CWCase) -> list[Output]:
    """What the unsharded EmbeddingCollection returns for each rank's batch."""
    ec = make_embedding_collection(case)
    with torch.no_grad():
        return [_plain(ec(to_kjt(*batch))) for batch in make_batches(case)]


@dataclass
class RankOutputs:
    """What one rank returned for a case; a path the case did not run is None."""

    reference: Output | None = None  # embnb's CW lookup
    rank_ordered: list[torch.Tensor] | None = None  # its shard outputs, in arrival order
    torchrec: Output | None = None  # ShardedEmbeddingCollection
    torchrec_unpermuted: Output | None = None  # the same, its permute switched off
    torchrec_permute: list[int] | None = None  # the permute indices torchrec computed
    compute_kernels: list[str] | None = None  # of the kernel modules torchrec built here (none: no shard)
    traffic: dict[str, dict[str, int]] = field(default_factory=dict)  # path -> recorded_all_to_all's


def _forward(case: CWCase, ec, kjt, group, result: RankOutputs) -> None:
    """embnb's CW forward (each rank keeps only its own column shards of `ec`'s weights), then
    torchrec's sharded module: one step, a warm step recorded, then one with its permute (a private
    field) emptied for that call and restored: the outputs in rank order, as before torchrec stitched."""
    if "reference" in case.paths:
        weight = ec.embeddings[TABLE].weight.detach()
        ranks, widths = list(case.shard_ranks), case.shard_widths()
        shards = local_shards(weight, ranks, widths, dist.get_rank(group))
        with recorded_all_to_all() as sent:
            rows, arrived = cw_sequence_lookup(kjt.values(), shards, ranks, widths, group, weight.dtype)
        result.reference, result.rank_ordered = (kjt.lengths().cpu(), rows.cpu()), [s.cpu() for s in arrived]
        result.traffic["reference"] = sent
    if "torchrec" in case.paths:
        sharded = adapter.shard_cw(ec, {TABLE: list(case.shard_ranks)}, group)
        result.torchrec = _plain(sharded(kjt).wait())
        with recorded_all_to_all() as sent:
            sharded(kjt).wait()
        result.traffic["torchrec"] = sent
        saved = private.features_to_permute_indices(sharded)
        private.set_features_to_permute_indices(sharded, {})
        try:
            result.torchrec_unpermuted = _plain(sharded(kjt).wait())
        finally:
            private.set_features_to_permute_indices(sharded, saved)
        result.torchrec_permute = adapter.torchrec_permute_indices(sharded)[FEATURE]
        result.compute_kernels = adapter.compute_kernels(sharded)


def run_case_on_rank(rank: int, world_size: int, case: CWCase) -> RankOutputs | None:
    """Per-rank function for `launch_each`: `case` on ranks 0..case.world_size-1 (a subgroup when the launch
    has more ranks, so one launch serves many world sizes); None on the other ranks."""
    # new_group is collective over the whole world, members or not.
    whole = case.world_size == world_size
    group, result = dist.group.WORLD if whole else dist.new_group(list(range(case.world_size))), None
    if rank < case.world_size:
        device, result = rank_device(group), RankOutputs()
        with torch.no_grad():
            ec, kjt = make_embedding_collection(case, device), to_kjt(*make_batches(case)[rank], device)
            _forward(case, ec, kjt, group, result)
    dist.barrier()  # ranks outside the case wait here, not inside the next case's collectives
    return result


@dataclass
class CWRun:
    """A case's outputs on every rank (index = rank), next to the unsharded EmbeddingCollection's."""

    case: CWCase
    expected: list[Output]
    ranks: list[RankOutputs]

    def output(self, rank: int, path: str) -> Output | None:
        """Rank `rank`'s (lengths, values) by `path`: "reference", "torchrec", "torchrec_unpermuted", or
        "naive" (embnb's slices concatenated in rank order); None where the path did not run."""
        got = self.ranks[rank]
        if check_choice("path", path, (*PATHS, "torchrec_unpermuted", "naive")) != "naive":
            return getattr(got, path)
        arrived = got.rank_ordered
        return None if arrived is None else (got.reference[0], cw.concat_in_rank_order(arrived))

    def matches(self, path: str) -> bool:
        """`path` (as in `output`) equals the unsharded EC on every rank, exactly, lengths too."""
        outputs = [self.output(r, path) for r in range(len(self.ranks))]
        return all(
            got is not None and all(torch.equal(g, w) for g, w in zip(got, want))
            for got, want in zip(outputs, self.expected)
        )

    def traffic(self, path: str) -> list[dict[str, int]]:
        """What each rank sent through all_to_all_single in one forward of `path`."""
        return [rank.traffic[check_choice("path", path, PATHS)] for rank in self.ranks]

    def abs_errors(self, path: str) -> torch.Tensor:
        """|output - unsharded|: a row per looked-up id of every rank in rank order, a column per embedding
        column (`path` as in `output`)."""
        return torch.cat([(self.output(r, path)[1] - want[1]).abs() for r, want in enumerate(self.expected)])

    def max_abs_error(self, path: str) -> float:
        errors = self.abs_errors(path)
        return float(errors.max()) if errors.numel() else 0.0


def run_cw_cases(
    cases: Sequence[CWCase], device: str = "auto", timeout_s: float = 300.0, then: Sequence[tuple] = ()
) -> list:
    """Run `cases` on real ranks in one `launch_each` (gloo on CPU, nccl with a GPU per rank), each paired
    with the unsharded EC's outputs (a `CWRun`); a case torchrec cannot take is refused before any rank
    starts. `then`: more (fn, args) calls in the same launch, after the cases; their results follow."""
    if not cases:
        raise ValueError("cases is empty: nothing to run")
    for case in cases:  # a case torchrec cannot take would fail on some ranks only
        problem = case.torchrec_problem() if "torchrec" in case.paths else None
        if problem:
            raise ValueError(problem)
    calls = [(run_case_on_rank, (case,)) for case in cases] + list(then)
    per_call = launch_each(calls, max(c.world_size for c in cases), device=device, timeout_s=timeout_s)
    runs = [CWRun(c, unsharded_outputs(c), ranks[: c.world_size]) for c, ranks in zip(cases, per_call)]
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


def torchrec_column_wise(module: torch.nn.Module, generator) -> torch.nn.Module:
    """`module`'s table sharded over the world's CPU ranks by torchrec's own `generator` (a
    `column_wise(...)` of torchrec's, unchecked by embnb), holding `module`'s weights: an
    EmbeddingBagCollection through torchrec's pooled sharder, an EmbeddingCollection through its
    sequence one. Collective: every rank calls it."""
    from torchrec import EmbeddingBagCollection
    from torchrec.distributed.embedding import EmbeddingCollectionSharder
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.sharding_plan import construct_module_sharding_plan
    from torchrec.distributed.types import ShardingEnv

    pooled = isinstance(module, EmbeddingBagCollection)
    sharder = EmbeddingBagCollectionSharder() if pooled else EmbeddingCollectionSharder()
    world = {"local_size": dist.get_world_size(), "world_size": dist.get_world_size()}  # one host
    plan = construct_module_sharding_plan(
        module, {TABLE: generator}, sharder=sharder, device_type="cpu", **world
    )
    env = ShardingEnv.from_process_group(dist.group.WORLD)
    sharded = sharder.shard(module, plan, env=env, device=torch.device("cpu"))
    sharded.load_state_dict(module.state_dict())
    return sharded


def _torchrec_size_per_rank_on_rank(
    rank: int, world_size: int, case: CWCase, sizes: list[int]
) -> TorchrecOutcome:
    from torchrec.distributed.sharding_plan import column_wise

    ec = make_embedding_collection(case)
    own, local = (sizes[rank] if rank < len(sizes) else 0), None
    try:
        with torch.no_grad():
            sharded = torchrec_column_wise(
                ec, column_wise(size_per_rank=sizes, compute_kernel=adapter.COMPUTE_KERNEL)
            )
            local = private.local_embedding_dim(sharded)
            got = _plain(sharded(to_kjt(*make_batches(case)[rank])).wait())
    except Exception as error:  # torchrec's own failure is the result; the peer fails at the same step
        frames = [f for f in traceback.extract_tb(error.__traceback__) if "/torchrec/" in f.filename]
        where = frames and f"torchrec/{frames[-1].filename.rsplit('/torchrec/', 1)[1]}:{frames[-1].lineno}"
        text = f"{type(error).__name__}: {(str(error).splitlines() or [''])[0][:200]}"
        return TorchrecOutcome(text, None, None, where or None, own, local)
    want = unsharded_outputs(case)[rank][1]
    worst = float((got[1] - want).abs().max()) if want.numel() else 0.0
    return TorchrecOutcome(None, worst == 0.0, worst, None, own, local)


def size_per_rank_call(case: CWCase, size_per_rank: Sequence[int]) -> tuple:
    """The (fn, args) call for `launch_each` on CPU ranks that runs torchrec's
    `column_wise(size_per_rank=...)` (shard i on rank i) on `case`'s table as torchrec takes it (no embnb
    check first): each rank's `TorchrecOutcome`. It may break the process group: the last call of a launch."""
    sizes = [check_int("size_per_rank entry", s, low=1) for s in size_per_rank]
    if sum(sizes) != case.embedding_dim:
        raise ValueError(f"size_per_rank {sizes} must cover embedding_dim {case.embedding_dim}")
    if len(sizes) > case.world_size:
        raise ValueError(
            f"size_per_rank {sizes} puts shard i on rank i: needs {len(sizes)} ranks, has {case.world_size}"
        )
    on_ranks = dataclasses.replace(case, shard_ranks=list(range(len(sizes))))
    return _torchrec_size_per_rank_on_rank, (on_ranks, sizes)


def pooled_on_rank(rank: int, world_size: int, case: CWCase) -> float:
    """Per rank of a `launch_each` on CPU: torchrec's pooled column-wise path (an EmbeddingBagCollection
    with `case`'s table and weights, a bag per sequence of this rank's batch, one vector per bag) on
    `case.shard_ranks`, against the unsharded module: max |sharded - unsharded|. Its output all-to-all
    also returns shards in rank order; torchrec puts them back with FBGEMM's
    `PermutePooledEmbeddingsSplit`."""
    from torchrec import EmbeddingBagCollection, EmbeddingBagConfig
    from torchrec.distributed.sharding_plan import column_wise

    config = EmbeddingBagConfig(case.num_embeddings, case.embedding_dim, TABLE, feature_names=[FEATURE])
    ebc = EmbeddingBagCollection([config])
    kjt = to_kjt(*make_batches(case)[rank])
    with torch.no_grad():
        ebc.embedding_bags[TABLE].weight.copy_(make_embedding_collection(case).embeddings[TABLE].weight)
        expected = ebc(kjt).values()
        generator = column_wise(ranks=list(case.shard_ranks), compute_kernel=adapter.COMPUTE_KERNEL)
        return float((torchrec_column_wise(ebc, generator)(kjt).wait().values() - expected).abs().max())
