"""create_planner proposes no option its sharders refuse, and its no-plan error names the tables.

The options refused are those DistributedModelParallel (torchrec, FBGEMM, embnb's routed
sharders) refuses when it builds or first runs the sharded module (embnb/planner/refusals.py
names the sources). Each expectation is computed here: by the rule written out plainly (a fused
shard's columns a multiple of 4; torchrec's row-wise blocks of ceil(N / W) rows), and once by
building DistributedModelParallel from create_planner's plan on 4 real gloo ranks and stepping it.
"""

import math
import re

import pytest
import torch
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, EmbeddingCollection, EmbeddingConfig
from torchrec.distributed.embedding import EmbeddingCollectionSharder
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.planner.proposers import UniformProposer
from torchrec.distributed.planner.types import ParameterConstraints, PlannerError, PlannerErrorType

from embnb import planner
from embnb._torchrec_private import planner_enumerator
from embnb.dist import launch_each
from embnb.planner.factory import Fallback
from embnb.rowwise import RoutedEmbeddingBagCollectionSharder
from tests.planner import refusal_ranks

BATCH = 8
META = torch.device("meta")


def ebc(*tables):
    configs = [
        EmbeddingBagConfig(name=n, feature_names=[f"f_{n}"], num_embeddings=rows, embedding_dim=dim)
        for n, rows, dim in tables
    ]
    return EmbeddingBagCollection(tables=configs, device=META)


def ec(*tables):
    configs = [
        EmbeddingConfig(name=n, feature_names=[f"f_{n}"], num_embeddings=rows, embedding_dim=dim)
        for n, rows, dim in tables
    ]
    return EmbeddingCollection(tables=configs, device=META)


def topology(device, world_size=2):
    if device == "cpu":
        return planner.make_topology(world_size, "cpu")
    return planner.make_topology(world_size, "cuda", hbm_cap_gb=1)


def plan_of(module, sharders, device, world_size=2, **kwargs):
    """create_planner's plan, as {table: (sharding type, compute kernel, [[rows, columns], ...])}."""
    the_planner = planner.create_planner(topology(device, world_size), BATCH, progress=False, **kwargs)
    plan = the_planner.plan(module, sharders).plan[""]
    planned = {
        name: (p.sharding_type, p.compute_kernel, [s.shard_sizes for s in p.sharding_spec.shards])
        if p.sharding_spec is not None
        else (p.sharding_type, p.compute_kernel, None)
        for name, p in plan.items()
    }
    return planned, the_planner


def fused_columns_are_multiples_of_4(planned) -> bool:
    """FBGEMM's rule, plainly: every shard under a kernel other than `dense` has 4k columns."""
    return all(
        kernel == "dense" or all(columns % 4 == 0 for _, columns in shards)
        for _, kernel, shards in planned.values()
    )


def enumerated(the_planner, table):
    """The (sharding type, compute kernel) pairs the enumerator offered for `table`."""
    options = planner_enumerator(the_planner).last_stored_search_space
    return {(o.sharding_type, o.compute_kernel) for o in options if o.name == table}


def torchrec_row_blocks(rows, world_size):
    """torchrec's row-wise shards: blocks of ceil(rows / W) rows, the last ranks short or empty."""
    block = math.ceil(rows / world_size)
    return [min(block, max(0, rows - rank * block)) for rank in range(world_size)]


# --- four columns ------------------------------------------------------------------------


@pytest.mark.parametrize("device", ["cpu", "cuda"])
@pytest.mark.parametrize("sharder", ["torchrec", "routed"])
def test_tables_narrower_than_four_columns_get_no_fused_option(device, sharder):
    # a wide-and-deep "wide" table (1 column), a 2-column one, and a 4k-column one
    module = ebc(("wide", 1000, 1), ("narrow", 1000, 2), ("deep", 1000, 8))
    sharders = [
        RoutedEmbeddingBagCollectionSharder() if sharder == "routed" else EmbeddingBagCollectionSharder()
    ]
    planned, the_planner = plan_of(module, sharders, device)
    assert fused_columns_are_multiples_of_4(planned), planned
    # torchrec offers only `dense` for data-parallel, and only data-parallel is left
    assert planned["wide"][:2] == planned["narrow"][:2] == ("data_parallel", "dense")
    # The enumerator still offers the fused options (its options stay torchrec's); the proposer drops them.
    for table in ("wide", "narrow"):
        fused = {pair for pair in enumerated(the_planner, table) if pair[1] != "dense"}
        assert fused and set(the_planner.dp_proposer.refused[table]) == {f"{t}/{k}" for t, k in fused}
        assert all("need a multiple of 4" in why for why in the_planner.dp_proposer.refused[table].values())
    assert "deep" not in the_planner.dp_proposer.refused


def test_an_embedding_collection_of_two_columns_has_no_option_on_cpu_and_the_error_says_why():
    # FBGEMM's fused kernels need 4k columns, and its CPU dense kernel pools every bag (an
    # EmbeddingCollection's data-parallel option would return a row per bag, not per id)
    with pytest.raises(PlannerError) as raised:
        plan_of(ec(("t2", 1000, 2)), [EmbeddingCollectionSharder()], "cpu")
    assert raised.value.error_type == PlannerErrorType.STRICT_CONSTRAINTS
    message = str(raised.value)
    assert message.startswith(
        "Unable to find a plan for this model: table 't2' has no option its sharders accept ("
    )
    assert re.search(r"data_parallel/dense: an EmbeddingCollection's dense kernel on CPU", message)
    assert re.search(
        r"table_wise/fused, [a-z_/, ]*: a shard of 2 columns under compute kernel 'fused'", message
    )
    # on a GPU the dense kernel looks up id by id: data-parallel is left
    planned, _ = plan_of(ec(("t2", 1000, 2)), [EmbeddingCollectionSharder()], "cuda")
    assert planned["t2"][:2] == ("data_parallel", "dense")
    # 4k columns on CPU: a fused option, not the dense kernel
    planned, the_planner = plan_of(ec(("t8", 1000, 8)), [EmbeddingCollectionSharder()], "cpu")
    assert planned["t8"][1] == "fused" and list(the_planner.dp_proposer.refused["t8"]) == [
        "data_parallel/dense"
    ]


# --- row-wise ranks with no rows, on CPU -----------------------------------------------------


class RowWiseOnCpu(EmbeddingBagCollectionSharder):
    """torchrec's sharder with row_wise offered on CPU too (torchrec 1.8 offers it for CUDA only)."""

    def sharding_types(self, compute_device_type):
        return [*super().sharding_types(compute_device_type), "row_wise"]


@pytest.mark.parametrize(
    "sharder, device, refused",
    [
        (RoutedEmbeddingBagCollectionSharder(), "cpu", True),  # continuous: torchrec's blocks
        (RoutedEmbeddingBagCollectionSharder(others="roundrobin"), "cpu", False),  # W blocks of 2
        (RoutedEmbeddingBagCollectionSharder(), "cuda", False),  # FBGEMM's CUDA kernels take an empty rank
        (RowWiseOnCpu(), "cpu", True),
    ],
    ids=["routed continuous", "routed roundrobin", "routed cuda", "torchrec row_wise on cpu"],
)
def test_a_row_wise_rank_with_no_rows_is_refused_where_fbgemms_cpu_kernels_refuse_it(
    sharder, device, refused
):
    rows, world_size = 5, 4
    assert torchrec_row_blocks(rows, world_size) == [2, 2, 1, 0]  # rank 3 holds none of "small"
    planned, the_planner = plan_of(ebc(("small", rows, 8), ("big", 1000, 8)), [sharder], device, world_size)
    assert ("row_wise", "fused") in enumerated(the_planner, "small")
    reasons = the_planner.dp_proposer.refused.get("small", {})
    assert ("row_wise/fused" in reasons) == refused
    if refused:
        assert planned["small"][0] != "row_wise"
        assert re.search(r"leave rank 3 with no rows", reasons["row_wise/fused"])
    assert "big" not in the_planner.dp_proposer.refused  # 250 rows a rank


def test_create_planners_plans_build_and_step_under_dmp_on_four_gloo_ranks():
    # The two cases in one model, planned inside the group: a 1-column table and a
    # 5-row table at W = 4 under the routed sharder. A refused option fails DMP on every rank.
    tables = [("wide", 100, 1), ("small", 5, 8), ("big", 1000, 8)]
    (per_rank,) = launch_each([(refusal_ranks.plan_and_run, (tables,))], 4, device="cpu", timeout_s=120)
    plans = [result["plan"] for result in per_rank]
    assert all(plan == plans[0] for plan in plans)  # every rank planned the same
    assert fused_columns_are_multiples_of_4(plans[0])
    kind, _, shards = plans[0]["small"]
    assert kind != "row_wise" or 0 not in [rows for rows, _ in shards]
    dims = sum(dim for _, _, dim in tables)
    assert all(r["shape"] == (refusal_ranks.BATCH, dims) and r["finite"] for r in per_rank)


# --- a routed table needs row-wise ---------------------------------------------------------------


def test_a_table_with_a_routing_gets_row_wise_and_a_narrow_one_has_no_option():
    sharder = RoutedEmbeddingBagCollectionSharder({"t": "roundrobin"})
    planned, the_planner = plan_of(ebc(("t", 1000, 8), ("u", 1000, 8)), [sharder], "cpu")
    assert planned["t"][0] == "row_wise"
    others = {f"{t}/{k}" for t, k in enumerated(the_planner, "t") if t != "row_wise"}
    assert set(the_planner.dp_proposer.refused["t"]) == others and others
    assert all(
        why == f"table 't' has routing 'roundrobin' but the plan shards it {kind.split('/')[0]!r}; "
        "a routing needs sharding type 'row_wise'"
        for kind, why in the_planner.dp_proposer.refused["t"].items()
    )
    # a name qualified by the collection's path in the model, as the routed sharder reads it
    model = torch.nn.Module()
    model.sparse = ebc(("t", 1000, 8), ("u", 1000, 8))
    sharder = RoutedEmbeddingBagCollectionSharder({"sparse.t": "roundrobin"})
    the_planner = planner.create_planner(topology("cpu"), BATCH, progress=False)
    plan = the_planner.plan(model, [sharder]).plan["sparse"]
    assert plan["t"].sharding_type == "row_wise" and set(the_planner.dp_proposer.refused) == {"sparse.t"}
    # two columns and a routing: row-wise is fused (4k columns), the others are not row-wise
    with pytest.raises(
        PlannerError, match=r"^Unable to find a plan for this model: table 'n' has no option"
    ) as raised:
        plan_of(
            ebc(("n", 1000, 2)), [RoutedEmbeddingBagCollectionSharder({"n": "feistel_roundrobin"})], "cpu"
        )
    assert "row_wise/fused: a shard of 2 columns under compute kernel 'fused'" in str(raised.value)
    assert "a routing needs sharding type 'row_wise'" in str(raised.value)


def test_the_fallback_proposes_from_the_options_the_sharders_accept():
    module = ebc(("wide", 1000, 1), ("deep", 1000, 8))
    sharders = [EmbeddingBagCollectionSharder()]
    cpu = topology("cpu")
    options = planner.DistinctShardEnumerator(cpu, BATCH).enumerate(module, sharders)
    ours, uniform = planner.DynamicProgrammingProposer(), UniformProposer()
    ours.expect_sharders(sharders, cpu)
    ours.load(options)
    fallback = Fallback(ours, uniform)
    fallback.load(options)
    proposals = []
    while (proposal := fallback.propose()) is not None:  # the DP placed nothing yet: the fallback runs
        proposals.append(proposal)
        fallback.feedback(partitionable=False)
    assert proposals and all(
        option.compute_kernel == "dense"
        for proposal in proposals
        for option in proposal
        if option.name == "wide"
    )


# --- no plan: the error names the tables -------------------------------------------------------


def test_the_no_plan_error_names_each_table_that_fits_nowhere_and_what_it_needs():
    # the case: 50 M x 64 (fp32: 11.9 GiB) held table-wise, on devices of 4 GiB HBM
    rows, dim = 50_000_000, 64
    needs = f"{rows * dim * 4 / 2**30:.3g} GiB"  # the rows alone; its buffers add under 0.1%
    only = {"sharding_types": ["table_wise"], "compute_kernels": ["fused"]}
    devices = planner.make_topology(2, "cuda", hbm_cap_gb=4)
    for huge in (["huge"], ["huge", "huger"]):
        module = ebc(*[(name, rows, dim) for name in huge], ("small", 1000, 8))
        the_planner = planner.create_planner(
            devices, BATCH, progress=False, constraints={n: ParameterConstraints(**only) for n in huge}
        )
        with pytest.raises(PlannerError) as raised:
            the_planner.plan(module, [EmbeddingBagCollectionSharder()])
        assert raised.value.error_type == PlannerErrorType.INSUFFICIENT_STORAGE
        message = str(raised.value)
        assert "8589934592" not in message and "Last planner error" not in message
        each = [
            f"table {name!r} fits on no device: its smallest option (table_wise, fused) needs {needs} HBM "
            "and 0 GiB DDR for one shard"
            for name in huge
        ]
        assert message == (
            "Unable to find a plan for this model: "
            + "; ".join(each)
            + ", the largest device offers 3.4 GiB HBM and 128 GiB DDR after the storage reservation; "
            + f"add devices or memory, or shrink the table{'s' if len(huge) > 1 else ''}"
        )
