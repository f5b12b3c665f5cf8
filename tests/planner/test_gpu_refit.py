"""embnb.bench.gpu_refit: the fit that merges groups the ranks cannot tell apart, and the poor plans
rebuilt with each kernel whatever order torchrec's enumerator lists a table's kernels in (its
`_filter_compute_kernels` takes a set's order, which follows the process's hash seed). Oracles:
coefficients chosen here, and torchrec's own estimates of the plan as built."""

import pytest

from embnb import planner
from embnb.bench.gpu_refit import _same_estimates, fit_determined, kernel_variants
from embnb.lab.planner.candidates import estimated_per_rank, one_kind_on
from embnb.lab.planner.models import Enumerated, enumerate_options, make_model
from embnb.planner.calibration import MeasuredRank, ShardTerms
from embnb.planner.fitting import fit


def test_groups_the_ranks_cannot_tell_apart_are_fitted_as_one():
    """Every rank holds row-wise shards on fused_uvm and on fused_uvm_caching in one proportion (as the
    H200 runs' plans do): the ranks cannot tell the two kernels' coefficients apart. `fit_determined`
    fits the one with fewer shards as the other and gives it its coefficients, then recovers the
    coefficients the ranks were made from (both kernels priced alike) and the cost per call; a group
    whose terms are the kernel calls' alone cannot be merged, and the fit's error stands."""

    def shard(kernel, lookups, kind="row_wise"):
        return ShardTerms(kind, kernel, (0.0, lookups, 0.0, 0.0, 0.0, 0.0, 0.0))

    per_lookup = {"fused": 2.0, "fused_uvm_caching": 5.0}
    per_call, ranks = 0.5, []
    for fused, uvm, calls in [(1.0, 0.0, 1), (2.0, 1.0, 2), (0.5, 3.0, 2), (4.0, 2.0, 3), (1.5, 0.5, 1)]:
        shards = (shard("fused", fused), shard("fused_uvm_caching", uvm), shard("fused_uvm", uvm / 2))
        measured = (
            per_lookup["fused"] * fused + per_lookup["fused_uvm_caching"] * 1.5 * uvm + per_call * calls
        )
        ranks.append(MeasuredRank(measured, shards, kernel_calls=calls))
    with pytest.raises(ValueError, match="determine 3 of the 4 coefficients"):
        fit(ranks, "cuda", "x", terms=("lookup_size_multiplier",))
    calibration, merged = fit_determined(ranks, "cuda", "x", terms=("lookup_size_multiplier",))
    assert merged == {"row_wise/fused_uvm": "row_wise/fused_uvm_caching"}
    for kernel in ("fused", "fused_uvm_caching", "fused_uvm"):
        want = per_lookup.get(kernel, per_lookup["fused_uvm_caching"])
        assert calibration.coefficients[("row_wise", kernel)][1] == pytest.approx(want)
    assert calibration.kernel_call_ms == pytest.approx(per_call)
    for rank in ranks:  # the original ranks, each kernel priced by its own coefficients
        assert calibration.estimate(rank.shards, rank.kernel_calls) == pytest.approx(rank.lookups_ms)
    alone = [MeasuredRank(r.lookups_ms, (shard("fused", 1.0, "table_wise"),), 1) for r in ranks]
    with pytest.raises(ValueError, match="determine 1 of the 2 coefficients"):
        fit_determined(alone, "cuda", "x", terms=("lookup_size_multiplier",))


def test_a_poor_plan_is_rebuilt_with_each_kernel_on_the_same_ranks():
    """`one_kind_on` takes each table's first table-wise option, whose kernel follows torchrec's
    enumeration order. Whichever kernel a poor plan was built with, `kernel_variants` gives the
    plan once per kernel, in sorted order, each table on its rank; the variant of the plan's own
    kernel has its per-rank estimates, and a plan built with another kernel's options first is
    among the variants (its estimates found whatever the order)."""
    model = make_model(6, seed=0, max_rows=100_000)
    topology = planner.make_topology(4, "cuda", hbm_cap_gb=64)
    enumerated = enumerate_options(model.tables, topology, 256, model.constraints)
    kernels = sorted({o.compute_kernel for o in enumerated.options if o.sharding_type == "table_wise"})
    assert {"fused", "fused_uvm", "fused_uvm_caching"} <= set(kernels)
    for first in kernels:  # the enumeration as a process whose hash seed lists `first` first
        reordered = sorted(enumerated.options, key=lambda o, k=first: o.compute_kernel != k)
        plan = one_kind_on(
            Enumerated(enumerated.module, enumerated.sharders, reordered, 0.0), "table_wise", [0, 1]
        )
        assert {o.compute_kernel for o in plan} == {first}
        variants = kernel_variants(plan, enumerated)
        assert [v[0].compute_kernel for v in variants] == kernels  # each once, in sorted order
        for variant in variants:
            assert [[s.rank for s in o.shards] for o in variant] == [[s.rank for s in o.shards] for o in plan]
        (own,) = [v for v in variants if v[0].compute_kernel == first]
        ranks = [{"estimated_s": {"total": t}} for t in estimated_per_rank(plan, 4)["total"]]
        assert _same_estimates(own, ranks, 4)[0]
        others = [v for v in variants if v is not own]
        assert not any(_same_estimates(v, ranks, 4)[0] for v in others)  # the kernels are priced apart


def test_a_bad_time_limit_is_named(tmp_path, capsys):
    from embnb.bench.__main__ import main

    assert main(["gpu_refit", "--timeout-s", "0", "--out", str(tmp_path)]) == 2
    assert "--timeout-s must be > 0, got 0.0" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())
