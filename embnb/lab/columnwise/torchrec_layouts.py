"""The column-wise layouts torchrec itself makes and takes, read from the installed torchrec: what its
planner proposes for a table, and the lines of its source (found by their text, so they name the version
that runs) where an EmbeddingCollection meets uneven shard widths and where the pooled output is permuted.

    planner_cw_layout(512, 1000, 2)      # PlannerLayout(ranks=[0, 1, 0, 1], widths=[128] * 4)
    [place.where for place in source_places(UNEVEN_EC_STEPS)]   # "torchrec/...py:LINE (function)"
"""

from __future__ import annotations

import importlib
import inspect
import logging
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from embnb._checks import check_int

_EC, _PLAN = "torchrec.distributed.embedding", "torchrec.distributed.sharding_plan"
_CW = "torchrec.distributed.sharding.cw_sharding"
# (module, function, text on the line): each step where torchrec's EC meets uneven CW widths, in order
UNEVEN_EC_STEPS = [
    ("torchrec.modules.embedding_modules", "EmbeddingCollection.__init__", "required to have same embedding"),
    (_PLAN, "_get_block_size_for_cw_shard", "_find_base_dim(MIN_CW_DIM, columns)"),
    (_PLAN, "column_wise", "for rank, cur_size in enumerate(size_per_rank):"),
    (_EC, "ShardedEmbeddingCollection.__init__", "CW partition must be same for all CW sharded parameters"),
    (_EC, "ShardedEmbeddingCollection.compute_and_output_dist", "odist(embs.view(-1, embedding_dim)"),
    ("torchrec.distributed.comm_ops", "All2All_Seq_Req.forward", "input_splits = [i * D for i in a2ai"),
]
POOLED_PERMUTE_STEPS = [  # where torchrec permutes the pooled (EmbeddingBagCollection) CW output
    (_CW, "BaseCwEmbeddingSharding._init_combined_embeddings", "embedding_order.extend("),
    (_CW, "CwPooledEmbeddingSharding.create_output_dist", "PermutePooledEmbeddingsSplit("),
]


def torchrec_version() -> str:
    """The installed torchrec's version: what the notebook's torchrec claims are about."""
    from importlib.metadata import version

    return version("torchrec")


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


def planner_cw_layout(embedding_dim: int, num_embeddings: int, world_size: int) -> PlannerLayout:
    """The shards torchrec's EmbeddingShardingPlanner makes of one EmbeddingCollection table when it may
    only shard it column-wise (fused kernel), on `world_size` CPU devices of one host."""
    from torchrec import EmbeddingCollection, EmbeddingConfig
    from torchrec.distributed.embedding import EmbeddingCollectionSharder
    from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology

    for name, value in (
        ("embedding_dim", embedding_dim),
        ("num_embeddings", num_embeddings),
        ("world_size", world_size),
    ):
        check_int(name, value, low=1)
    config = EmbeddingConfig(num_embeddings, embedding_dim, "t0", feature_names=["f0"])
    ec = EmbeddingCollection(tables=[config], device=torch.device("meta"))
    constraints = {"t0": ParameterConstraints(sharding_types=["column_wise"], compute_kernels=["fused"])}
    # The planner warns about a hand-built Topology and its storage reservation, and logs its stats table.
    logger = logging.getLogger("torchrec")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            topology = Topology(world_size=world_size, compute_device="cpu")
            planner = EmbeddingShardingPlanner(topology=topology, constraints=constraints)
            plan = planner.plan(ec, [EmbeddingCollectionSharder()])
    finally:
        logger.setLevel(level)
    shards = sorted(plan.plan[""]["t0"].sharding_spec.shards, key=lambda s: s.shard_offsets[1])
    return PlannerLayout(
        embedding_dim, [s.placement.rank() for s in shards], [s.shard_sizes[1] for s in shards]
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
    relative = "torchrec/" + (inspect.getsourcefile(obj) or "").rsplit("/torchrec/", 1)[-1]
    line = next((first + i for i, source in enumerate(lines) if text in source), 0)
    return SourcePlace(relative if line else "", line, function, text)


def source_places(steps: Sequence[tuple[str, str, str]]) -> list[SourcePlace]:
    return [source_place(*step) for step in steps]


def mixed_dims_error(dims: tuple[int, int] = (4, 8)) -> str:
    """The error torchrec's EmbeddingCollection raises for two tables of `dims` columns."""
    from torchrec import EmbeddingCollection, EmbeddingConfig

    tables = [EmbeddingConfig(4, d, f"t{i}", feature_names=[f"f{i}"]) for i, d in enumerate(dims)]
    try:
        EmbeddingCollection(tables=tables, device=torch.device("meta"))
    except ValueError as error:
        return f"ValueError: {error}"
    return f"no error: tables of {list(dims)} columns were accepted"
