"""The column-wise layouts torchrec itself makes and takes, read from the
installed torchrec: what its planner proposes for a table, and where in its
source an EmbeddingCollection meets uneven shard widths.

    planner_cw_layout(512, 1000, 2)      # PlannerLayout(ranks=[0, 1, 0, 1], widths=[128] * 4)
    torchrec_min_cw_dim()                # 128 on torchrec 1.8.0
    [place.where for place in uneven_ec_places()]   # "torchrec/...py:LINE (function)"

The source places are found by text in the installed torchrec, so they name
the lines of the version that runs (a place whose text moved away says so).
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import logging
import warnings
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from embnb._checks import check_int

__all__ = [
    "torchrec_min_cw_dim",
    "PlannerLayout",
    "planner_cw_layout",
    "SourcePlace",
    "source_place",
    "mixed_dims_error",
    "uneven_ec_places",
]


def torchrec_min_cw_dim() -> int:
    """torchrec's planner constant MIN_CW_DIM: the narrowest column-wise shard it proposes."""
    from torchrec.distributed.planner.constants import MIN_CW_DIM

    return MIN_CW_DIM


@dataclass(frozen=True)
class PlannerLayout:
    """One table's column-wise shards as torchrec's planner placed them, in column order."""

    embedding_dim: int
    ranks: list[int]  # rank of each shard
    widths: list[int]  # columns of each shard


@contextlib.contextmanager
def _quiet_planner() -> Iterator[None]:
    # The planner warns about a hand-built Topology and its default storage
    # reservation, and logs its stats table: none of it concerns a layout.
    logger = logging.getLogger("torchrec")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logger.setLevel(level)


def planner_cw_layout(embedding_dim: int, num_embeddings: int, world_size: int) -> PlannerLayout:
    """The shards torchrec's own EmbeddingShardingPlanner makes of one
    EmbeddingCollection table when it may only shard it column-wise (fused
    kernel), on `world_size` CPU devices of one host."""
    from torchrec import EmbeddingCollection, EmbeddingConfig
    from torchrec.distributed.embedding import EmbeddingCollectionSharder
    from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology

    check_int("embedding_dim", embedding_dim, low=1)
    check_int("num_embeddings", num_embeddings, low=1)
    check_int("world_size", world_size, low=1)
    config = EmbeddingConfig(
        name="t0", embedding_dim=embedding_dim, num_embeddings=num_embeddings, feature_names=["f0"]
    )
    ec = EmbeddingCollection(tables=[config], device=torch.device("meta"))
    constraints = {"t0": ParameterConstraints(sharding_types=["column_wise"], compute_kernels=["fused"])}
    with _quiet_planner():
        planner = EmbeddingShardingPlanner(
            topology=Topology(world_size=world_size, compute_device="cpu"), constraints=constraints
        )
        plan = planner.plan(ec, [EmbeddingCollectionSharder()])
    shards = sorted(plan.plan[""]["t0"].sharding_spec.shards, key=lambda s: s.shard_offsets[1])
    return PlannerLayout(
        embedding_dim,
        [shard.placement.rank() for shard in shards],
        [shard.shard_sizes[1] for shard in shards],
    )


@dataclass(frozen=True)
class SourcePlace:
    """A line of the installed torchrec, found by its text."""

    path: str  # "torchrec/distributed/embedding.py", or "" when the text was not found
    line: int  # 1-based, 0 when not found
    function: str  # qualified name of the function holding it
    text: str  # the text searched for

    @property
    def where(self) -> str:
        if not self.path:
            return f"{self.function}: {self.text!r} not found in this torchrec"
        return f"{self.path}:{self.line} ({self.function})"


def source_place(module: str, function: str, text: str) -> SourcePlace:
    """Where `text` first appears in `module`.`function` of the installed torchrec."""
    obj = importlib.import_module(module)
    for part in function.split("."):
        obj = getattr(obj, part)
    lines, first = inspect.getsourcelines(obj)
    path = inspect.getsourcefile(obj) or ""
    relative = "torchrec/" + path.rsplit("/torchrec/", 1)[-1]
    for offset, source in enumerate(lines):
        if text in source:
            return SourcePlace(relative, first + offset, function, text)
    return SourcePlace("", 0, function, text)


def mixed_dims_error(dims: tuple[int, int] = (4, 8)) -> str:
    """The error torchrec's EmbeddingCollection raises for two tables of `dims` columns."""
    from torchrec import EmbeddingCollection, EmbeddingConfig

    tables = [
        EmbeddingConfig(name=f"t{i}", embedding_dim=d, num_embeddings=4, feature_names=[f"f{i}"])
        for i, d in enumerate(dims)
    ]
    try:
        EmbeddingCollection(tables=tables, device=torch.device("meta"))
    except ValueError as error:
        return f"ValueError: {error}"
    return f"no error: tables of {list(dims)} columns were accepted"


# (what the step does with uneven widths, module, function, text on the line)
_UNEVEN_EC_STEPS = [
    (
        "EmbeddingCollection: one embedding_dim for all tables (ValueError otherwise)",
        "torchrec.modules.embedding_modules",
        "EmbeddingCollection.__init__",
        "required to have same embedding dimension",
    ),
    (
        "planner: CW block = first multiple of 4 from MIN_CW_DIM up that divides D, else D; equal widths",
        "torchrec.distributed.sharding_plan",
        "_get_block_size_for_cw_shard",
        "_find_base_dim(MIN_CW_DIM, columns)",
    ),
    (
        "column_wise(size_per_rank=...): uneven widths, shard i on rank i; the module is not checked",
        "torchrec.distributed.sharding_plan",
        "column_wise",
        "for rank, cur_size in enumerate(size_per_rank):",
    ),
    (
        "ShardedEmbeddingCollection: one local width for every rank, the first CW shard's "
        "(a comment, no check)",
        "torchrec.distributed.embedding",
        "ShardedEmbeddingCollection.__init__",
        "CW partition must be same for all CW sharded parameters",
    ),
    (
        "forward: each rank's lookup output viewed as rows of that width",
        "torchrec.distributed.embedding",
        "ShardedEmbeddingCollection.compute_and_output_dist",
        "odist(embs.view(-1, embedding_dim)",
    ),
    (
        "sequence all-to-all: 'Does not support mixed dimensions'; splits = ids x that width",
        "torchrec.distributed.comm_ops",
        "All2All_Seq_Req.forward",
        "input_splits = [i * D for i in a2ai.output_splits]",
    ),
]


def uneven_ec_places() -> list[tuple[str, SourcePlace]]:
    """What each step of torchrec does with uneven CW widths in an
    EmbeddingCollection, and the line of the installed torchrec that does it."""
    return [(what, source_place(module, fn, text)) for what, module, fn, text in _UNEVEN_EC_STEPS]
