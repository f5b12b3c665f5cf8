"""The proposer's shortcuts against the slow way they stand for: dropping
dominated options changes no knapsack state, and screening a whole run of plans
at once gives each plan's own `fits` and `lower_bound` verdicts."""

import dataclasses
import itertools
import logging

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from embnb import planner
from embnb.cuda import loader
from embnb.lab.planner.models import enumerate_options, fused_table_gb, make_model
from embnb.planner.knapsack import FrontierSearch, Knapsack, knapsack_axes, without_dominated
from embnb.planner.layout import LayoutOption
from embnb.planner.space import PerOption, PerShard, SearchSpace, ShardValues, by_table, gathered
from embnb.planner.topology import reserved_topology

logging.getLogger("torchrec").setLevel(logging.ERROR)


@st.composite
def knapsack_instances(draw):
    """Small integer perfs and weights (so ties happen), some options missing."""
    num_tables = draw(st.integers(1, 6))
    num_options = draw(st.integers(1, 5))
    num_axes = draw(st.integers(1, 2))
    values = st.integers(0, 6)
    perfs = np.array(
        draw(st.lists(values, min_size=num_tables * num_options, max_size=num_tables * num_options))
    )
    perfs = perfs.reshape(num_tables, num_options).astype(float)
    missing = np.array(draw(st.lists(st.booleans(), min_size=perfs.size, max_size=perfs.size)))
    perfs[missing.reshape(perfs.shape)] = np.inf
    weights = np.array(draw(st.lists(values, min_size=perfs.size * num_axes, max_size=perfs.size * num_axes)))
    weights = weights.reshape(num_tables, num_options, num_axes).astype(float)
    capacity = np.array([draw(st.integers(1, 6 * num_tables)) for _ in range(num_axes)], dtype=float)
    bins = tuple(draw(st.integers(1, 12)) for _ in range(num_axes))
    return perfs, weights, capacity, bins


@settings(max_examples=300, deadline=None)
@given(knapsack_instances())
def test_dropping_dominated_options_keeps_every_knapsack_state(instance):
    perfs, weights, capacity, bins = instance
    pruned = without_dominated(perfs, weights)

    # By the definition, option by option: dropped iff another option of the
    # table weighs no more on any axis and has less perf.
    for t, a in itertools.product(*map(range, perfs.shape)):
        beaten = any(
            np.isfinite(perfs[t, b]) and perfs[t, b] < perfs[t, a] and all(weights[t, b] <= weights[t, a])
            for b in range(perfs.shape[1])
        )
        assert np.isinf(pruned[t, a]) == (beaten or np.isinf(perfs[t, a]))
        if not beaten:
            assert pruned[t, a] == perfs[t, a]

    runs = []
    for table_perfs in (perfs, pruned):
        knapsack = Knapsack(capacity, bins)
        for t in range(len(perfs)):
            knapsack.add_table(t, weights[t], table_perfs[t])
        runs.append(knapsack)
    full, fast = runs
    assert np.array_equal(full.frontier(len(perfs)), fast.frontier(len(perfs)))
    assert np.array_equal(full.perf, fast.perf) and np.array_equal(full.mem, fast.mem)
    for step_full, step_fast in zip(full.trace, fast.trace, strict=True):
        assert all(np.array_equal(x, y) for x, y in zip(step_full, step_fast))


@settings(max_examples=300, deadline=None)
@given(knapsack_instances())
def test_native_knapsack_step_keeps_the_numpy_states(instance):
    perfs, weights, capacity, bins = instance
    assert loader.available(), f"the native knapsack step did not build: {loader.failure()}"
    weights, capacity, bins = weights[..., :1], capacity[:1], bins[:1]  # the native step is one-axis
    numpy_run = Knapsack(capacity, bins, native=False)
    for t in range(len(perfs)):
        numpy_run.add_table(t, weights[t], perfs[t])
    step_by_step = Knapsack(capacity, bins, native=True)  # knapsack_step, a call per table
    for t in range(len(perfs)):
        step_by_step.add_table(t, weights[t], perfs[t])
    in_one_call = Knapsack(capacity, bins, native=True)  # knapsack_run
    in_one_call.add_tables(weights, perfs)
    assert not numpy_run._native and step_by_step._native
    for native_run in (step_by_step, in_one_call):
        assert np.array_equal(numpy_run.frontier(len(perfs)), native_run.frontier(len(perfs)))
        for name in ("cells", "perf", "mem", "least"):
            assert np.array_equal(getattr(numpy_run, name), getattr(native_run, name)), name
    for step_numpy, step_native in zip(numpy_run.trace, step_by_step.trace, strict=True):
        assert all(np.array_equal(x, y) for x, y in zip(step_numpy, step_native))
    if len(perfs):
        with pytest.raises(RuntimeError, match="added in one native run"):
            in_one_call.add_table(0, weights[0], perfs[0])


@pytest.mark.parametrize("budget", [10**9, 24 * 800, 24 * 800 - 1, 24 * 300, 24])
def test_bins_are_coarsened_past_the_table_bins_budget(space, monkeypatch, budget):
    """A run's time grows with tables x bins: past the budget the bins are halved until under it."""
    from embnb.planner import knapsack

    monkeypatch.setattr(knapsack, "MAX_TABLE_BINS", budget)
    axes, _, bins, _ = knapsack_axes(space, 100, 10)
    assert len(axes) == 1 and len(space.options) == 24 and space.world_size == 8
    expected = {10**9: 800, 24 * 800: 800, 24 * 800 - 1: 400, 24 * 300: 200, 24: 1}[budget]  # 100 per device
    assert bins == (expected,)


def test_native_knapsack_step_on_a_bench_sized_table(space):
    """The same states on real options, where float sums and bin edges are not whole numbers."""
    axes, capacity, bins, weights = knapsack_axes(space, 100, 10)
    runs = []
    for native in (False, True):
        knapsack = Knapsack(capacity[:1], bins[:1], native=native)
        knapsack.add_tables(weights[..., :1], space.perf)
        runs.append(knapsack)
    assert len(runs[0].cells) > 10
    assert np.array_equal(runs[0].frontier(len(space.perf)), runs[1].frontier(len(space.perf)))
    assert np.array_equal(runs[0].perf, runs[1].perf) and np.array_equal(runs[0].mem, runs[1].mem)


def test_native_knapsack_step_names_bad_input():
    assert loader.available(), loader.failure()
    one = torch.zeros(1, dtype=torch.float64)
    with pytest.raises(RuntimeError, match="memory must be a 1-D float64 CPU tensor"):
        torch.ops.embnb.knapsack_step(one.float(), one, one, one, 1.0, 1.0, 1)
    with pytest.raises(RuntimeError, match=r"weights \[1, 1\] and perfs \[1, 2\] differ"):
        torch.ops.embnb.knapsack_run(one[None], torch.zeros(1, 2, dtype=torch.float64), 1.0, 1.0, 1)
    with pytest.raises(RuntimeError, match="2 state memories but 1 state perfs"):
        torch.ops.embnb.knapsack_step(torch.zeros(2, dtype=torch.float64), one, one, one, 1.0, 1.0, 1)
    with pytest.raises(RuntimeError, match=r"num_bins must be in \[1, 2\*\*31\)"):
        torch.ops.embnb.knapsack_step(one, one, one, one, 1.0, 1.0, 0)
    falling = torch.tensor([2.0, 1.0], dtype=torch.float64)
    with pytest.raises(RuntimeError, match="the states' memory must rise.*state 1 has 1 after 2"):
        torch.ops.embnb.knapsack_step(falling, -falling, one, one, 4.0, 1.0, 4)
    longs = torch.zeros(3, dtype=torch.long)
    with pytest.raises(RuntimeError, match=r"workspace must be a contiguous 1-D int32 CPU .*\[3\] Long"):
        torch.ops.embnb.knapsack_run(one[None], one[None], 1.0, 1.0, 1, longs)
    wide = torch.zeros(1, 3, dtype=torch.float64)  # 3 options x 2**31 bins: past 32 bits of trace
    with pytest.raises(RuntimeError, match=r"num_bins x options per table .* 2\*\*32.*2147483647 x 3"):
        torch.ops.embnb.knapsack_run(wide, wide, 1.0, 1.0, 2**31 - 1)


@pytest.fixture(scope="module")
def space():
    model = make_model(24, seed=3)
    topology = planner.make_topology(8, "cuda", hbm_cap_gb=fused_table_gb(model.tables) / 8 * 0.5)
    enumerated = enumerate_options(model.tables, topology, 512, model.constraints)
    return SearchSpace(by_table(enumerated.options), reserved_topology(topology, enumerated, 512))


def walk(space, rng, num_plans, largest):
    """Plans that change a few tables at a time (like a knapsack frontier),
    leaning to each table's smaller (or larger) options, with a few jumps."""
    valid = [np.flatnonzero(np.isfinite(row)) for row in space.perf]
    by_size = [v[np.argsort(space.mem[t, v, 0])] for t, v in enumerate(valid)]
    leaning = [v[len(v) // 2 :] if largest else v[: max(1, len(v) // 2)] for v in by_size]
    plan = np.array([rng.choice(options) for options in leaning])
    plans = []
    for _ in range(num_plans):
        plans.append(plan.copy())
        tables = range(len(plan)) if rng.random() < 0.05 else rng.choice(len(plan), rng.integers(1, 4))
        for t in tables:
            plan[t] = rng.choice(leaning[t] if rng.random() < 0.8 else valid[t])
    return np.array(plans)


def test_screen_gives_each_plans_own_checks(space):
    rng = np.random.default_rng(0)
    plans = np.concatenate([walk(space, rng, 200, largest=False), walk(space, rng, 200, largest=True)])
    left, bound, left_error, bound_error = space.screen(plans)
    search = FrontierSearch(plans, space.mem[np.arange(plans.shape[1]), plans, 0].sum(-1), space)
    exact_bounds = np.array([space.lower_bound(plan) for plan in plans])
    fits = np.array([space.fits(plan) for plan in plans])
    assert 0 < fits.sum() < len(plans)  # both verdicts occur
    assert np.allclose(bound, exact_bounds, rtol=0, atol=bound_error)
    assert ((left > left_error) <= fits).all() and ((left < -left_error) <= ~fits).all()
    # The search's verdicts are the exact ones, also at ratings on a bound (rounding decides there).
    ratings = [*np.quantile(exact_bounds, [0.1, 0.5, 0.9]), *exact_bounds[:20]]
    for i in range(len(plans)):
        assert search.fits(i) == fits[i]
        for rating in ratings:
            assert search.cannot_win(i, rating) == (exact_bounds[i] >= rating)


def test_neighbor_bounds_give_each_changed_plans_own_checks(space):
    rng = np.random.default_rng(2)
    valid = [np.flatnonzero(np.isfinite(row)) for row in space.perf]
    assert space.uniform.any() and (~space.uniform & np.isfinite(space.perf)).any()  # both kinds move
    for choice in walk(space, rng, 6, largest=False)[::2]:
        for size in (1, 2):
            tables = np.array([rng.choice(len(choice), size, replace=False) for _ in range(300)])
            moves = np.stack([tables, [[rng.choice(valid[t]) for t in row] for row in tables]], -1)
            bound, fits = space.neighbor_bounds(choice, moves)
            neighbors = [choice.copy() for _ in moves]
            for neighbor, move in zip(neighbors, moves):
                neighbor[move[:, 0]] = move[:, 1]
            exact_bounds = np.array([space.lower_bound(n) for n in neighbors])
            exact_fits = np.array([space.fits(n) for n in neighbors])
            assert np.allclose(bound, exact_bounds, rtol=1e-12, atol=0)
            assert 0 < exact_fits.sum() < len(moves) or size == 1
            assert (fits == exact_fits).all()


def test_screen_of_no_plans_and_one_plan(space):
    left, bound, *_ = space.screen(np.zeros((0, len(space.perf)), dtype=np.int64))
    assert left.shape == bound.shape == (0,)
    plan = walk(space, np.random.default_rng(1), 1, largest=False)
    left, bound, *_ = space.screen(plan)
    assert bound[0] == pytest.approx(space.lower_bound(plan[0]), rel=1e-12)
    assert (left[0] >= 0) == space.fits(plan[0])


def test_shard_values_hold_each_shards_storage_and_perf(space):
    options = [o for table in space.options for o in table]
    for option in options[::7]:
        rows = space.values.rows(option)
        for shard, storage, parts, total in zip(
            option.shards,
            space.values.storage[rows].tolist(),
            space.values.parts[rows].tolist(),
            space.values.totals[rows].tolist(),
            strict=True,
        ):
            perf = shard.perf
            assert storage == [shard.storage.hbm, shard.storage.ddr, shard.storage.ssd]
            assert parts == [
                perf.fwd_compute,
                perf.bwd_compute,
                perf.fwd_comms,
                perf.bwd_comms,
                perf.prefetch_compute,
            ]
            assert total == perf.total
        assert space.values.memory(option) == tuple(
            sum(getattr(s.storage, a) for s in option.shards) for a in ("hbm", "ddr", "ssd")
        )


@pytest.mark.parametrize("chunk", [1, 5, 64, 1 << 20])
def test_per_shard_values_index_and_sum_segments_as_the_whole_array(monkeypatch, chunk):
    """PerShard against the whole array it stands for: indexing by shard (slices, arrays, then
    columns), and sums of segments longer and shorter than the chunk gathered at once."""
    monkeypatch.setattr(PerShard, "_CHUNK", chunk)
    rng = np.random.default_rng(chunk)
    distinct = rng.integers(0, 2**40, (9, 3))
    lengths = rng.integers(1, 12, 40)
    slots = rng.integers(0, 9, int(lengths.sum()))
    whole = distinct[slots]
    per_shard = PerShard(distinct, slots)
    assert len(per_shard) == len(whole)
    assert np.array_equal(per_shard[3:17], whole[3:17]) and np.array_equal(
        per_shard[[4, 0, 4]], whole[[4, 0, 4]]
    )
    assert np.array_equal(per_shard[5:30, :2], whole[5:30, :2])
    starts = np.concatenate(([0], np.cumsum(lengths)[:-1]))
    expected = [
        [sum(int(v) for v in whole[a : a + n, axis]) for axis in range(3)] for a, n in zip(starts, lengths)
    ]
    assert per_shard.segment_sums(starts).tolist() == expected


def test_the_plan_does_not_depend_on_the_order_torchrec_enumerates_options_in():
    # torchrec's enumerator walks sharding types and kernels from sets: the
    # order of a table's options changes between processes. Reversing each
    # table's options stands for another process's order.
    from embnb.lab.planner.planning import run_planner

    model = make_model(24, seed=3)
    topology = planner.make_topology(4, "cuda", hbm_cap_gb=fused_table_gb(model.tables) / 4 * 0.4)
    enumerated = enumerate_options(model.tables, topology, 512, model.constraints)
    reversed_options = [o for group in by_table(enumerated.options) for o in group[::-1]]
    assert [id(o) for o in reversed_options] != [id(o) for o in enumerated.options]
    runs = [
        run_planner(planner.DynamicProgrammingProposer(), e, topology, 512, constraints=model.constraints)
        for e in (enumerated, dataclasses.replace(enumerated, options=reversed_options))
    ]
    chosen = [sorted((o.name, o.sharding_type, o.compute_kernel) for o in run.plan) for run in runs]
    assert runs[0].perf_rating == runs[1].perf_rating and chosen[0] == chosen[1]


@given(st.integers(0, 700), st.integers(1, 40), st.integers(1, 300))
@settings(max_examples=30, deadline=None)
def test_gathered_reduces_each_plan_as_the_whole_gather_does(num_plans, num_tables, rows_at_once):
    rng = np.random.default_rng(num_plans * 41 + num_tables)
    values = rng.random((num_tables, 9)) * 10.0 ** rng.integers(-3, 12, (num_tables, 1))
    plans = rng.integers(0, 9, (num_plans, num_tables)).astype(np.uint8)
    whole = values[np.arange(num_tables), plans]  # [plans, tables], at once
    for reduce, expected in ((np.sum, whole.sum(-1)), (np.max, whole.max(-1, initial=-np.inf))):
        assert np.array_equal(gathered(values, plans, reduce, rows_at_once), expected)  # to the bit


@given(st.integers(1, 60), st.integers(1, 6), st.integers(1, 40), st.booleans())
@settings(max_examples=40, deadline=None)
def test_a_plans_per_device_sum_reads_only_the_options_with_a_row(num_tables, width, devices, two_axes):
    rng = np.random.default_rng(num_tables * 7 + width * 3 + devices)
    rows = rng.random((1 + num_tables, devices) + ((2,) if two_axes else ()))
    rows *= 10.0 ** rng.integers(-3, 12, (1 + num_tables,) + (1,) * (rows.ndim - 1))
    rows[0] = 0.0  # row 0: the options without one (not uniform)
    index = np.where(
        rng.random((num_tables, width)) < 0.4, rng.integers(1, 1 + num_tables, (num_tables, width)), 0
    )
    per_option = PerOption(index, rows)
    choice = rng.integers(0, width, num_tables)
    whole = np.stack([rows[index[t, choice[t]]] for t in range(num_tables)])  # every table's row, zeros too
    assert np.array_equal(per_option.plan_sum(choice), whole.sum(0))  # to the bit


@pytest.mark.parametrize("threads", [1, 3])  # one worker; bins split over three
@pytest.mark.parametrize("num_options", [40, 300])  # a byte per option index, and int32 past 256
def test_native_knapsack_run_on_a_long_frontier_keeps_the_numpy_states(num_options, threads):
    """Thousands of final states, traced back in blocks of rows: the same
    frontier and states as numpy's, in the narrowest index type that holds
    the options, whichever workers (torch's threads) share the bins; a
    workspace reused by later runs changes none of them."""
    assert loader.available(), loader.failure()
    rng = np.random.default_rng(7)
    num_tables, num_bins = 40, 20_000
    weights = rng.uniform(0.0, 1.0, (num_tables, num_options, 1))
    # Heavier options are faster (as more shards are): a frontier of thousands of states.
    perfs = 3.0 - weights[..., 0] + rng.uniform(0.0, 0.3, (num_tables, num_options))
    perfs[rng.random(perfs.shape) < 0.2] = np.inf  # options a table does not allow
    capacity, bins = np.array([num_tables * 0.4]), (num_bins,)
    numpy_run = Knapsack(capacity, bins, native=False)
    for t in range(num_tables):
        numpy_run.add_table(t, weights[t], perfs[t])
    expected = numpy_run.frontier(num_tables)
    workspace = torch.empty(0, dtype=torch.int32)
    saved = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        # A run on half the tables first: the second run finds the workspace traced and too small.
        Knapsack(capacity, bins, native=True, workspace=workspace).add_tables(weights[:20], perfs[:20])
        used = workspace.numel()
        native_run = Knapsack(capacity, bins, native=True, workspace=workspace)
        native_run.add_tables(weights, perfs)
    finally:
        torch.set_num_threads(saved)
    assert 0 < used < workspace.numel()  # grown by the longer run, kept by the caller
    frontier = native_run.frontier(num_tables)
    assert len(frontier) > 1000 and frontier.dtype == (np.uint8 if num_options <= 256 else np.int32)
    assert np.array_equal(expected, frontier)
    for name in ("cells", "perf", "mem", "least"):
        assert np.array_equal(getattr(numpy_run, name), getattr(native_run, name)), name


@pytest.mark.parametrize("enumerator", ["embnb", "torchrec"])  # shards of a size share estimates, or not
def test_shard_values_read_every_shard_as_it_is(enumerator):
    """Each shard's storage and perf as the shard holds them, whether its
    Storage and Perf objects are shared with its siblings or its own, and
    where a shard shares one of the two but not the other."""
    model = make_model(12, seed=5)
    topology = planner.make_topology(
        16, "cuda", hbm_cap_gb=fused_table_gb(model.tables) / 16, local_world_size=8
    )
    options = enumerate_options(model.tables, topology, 512, model.constraints, enumerator=enumerator).options
    shared = next(o for o in options if len(o.shards) > 1 and o.shards[0].size == o.shards[1].size)
    assert (shared.shards[0].perf is shared.shards[1].perf) == (enumerator == "embnb")
    if enumerator == "embnb":  # one shard of a shared pair gets a perf of its own, slower by one
        own = dataclasses.replace(shared.shards[1].perf, fwd_compute=shared.shards[1].perf.fwd_compute + 1)
        shared.shards[1].perf = own
    values = ShardValues(options)
    shards = [shard for option in options for shard in option.shards]
    assert len(shards) > 1000
    assert values.storage[:].tolist() == [[s.storage.hbm, s.storage.ddr, s.storage.ssd] for s in shards]
    assert values.totals[:].tolist() == [s.perf.total for s in shards]
    parts = [
        [s.perf.fwd_compute, s.perf.bwd_compute, s.perf.fwd_comms, s.perf.bwd_comms, s.perf.prefetch_compute]
        for s in shards
    ]
    assert values.parts[:].tolist() == parts
    rows = values.rows(shared)
    assert values.parts[rows.start + 1, 0] == values.parts[rows.start, 0] + (enumerator == "embnb")


def test_shard_values_read_options_whose_shards_are_not_made_without_making_them():
    """embnb's enumerator makes no shard (a LayoutOption keeps its layout and its estimates per
    size): the arrays and the DP's first proposal come from those alone, and equal what the shards
    hold once they are made."""
    model = make_model(12, seed=5)
    topology = planner.make_topology(
        64, "cuda", hbm_cap_gb=fused_table_gb(model.tables) / 64, local_world_size=8
    )
    options = enumerate_options(model.tables, topology, 512, model.constraints, enumerator="embnb").options
    assert all(isinstance(o, LayoutOption) and not o.made for o in options)
    values = ShardValues(options)
    proposer = planner.DynamicProgrammingProposer()
    proposer.load(options)
    assert proposer.propose() and not any(o.made for o in options)
    shards = [shard for option in options for shard in option.shards]  # made now, from the layouts
    assert all(o.made for o in options) and len(shards) > 64 * len(model.tables)
    assert values.storage[:].tolist() == [[s.storage.hbm, s.storage.ddr, s.storage.ssd] for s in shards]
    assert values.totals[:].tolist() == [s.perf.total for s in shards]
    assert values.parts[:, :2].tolist() == [[s.perf.fwd_compute, s.perf.bwd_compute] for s in shards]
