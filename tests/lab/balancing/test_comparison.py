"""embnb.balancing.lengths and embnb.lab.balancing.comparison: the two length distributions and
notebook 04's summaries of the balancer comparison, against counts made by hand."""

import math

import pandas as pd
import pytest
import torch

from embnb.balancing.lengths import LengthDistribution
from embnb.lab.balancing import comparison


def test_lognormal_lengths_have_the_median_and_spread_asked_for():
    def lognormal_lengths(num_samples, median, sigma, max_length, seed=0):
        return LengthDistribution("lognormal", median=median, sigma=sigma).draw(num_samples, max_length, seed)

    lengths = lognormal_lengths(20_000, median=128, sigma=1.0, max_length=100_000, seed=1)
    assert lengths.dtype == torch.int64 and lengths.min() >= 1
    assert abs(lengths.median().item() - 128) <= 4
    # log L has standard deviation sigma: the 84th percentile sits e times above the median
    upper = torch.quantile(lengths.double(), 0.8413).item()
    assert upper / 128 == pytest.approx(math.e, rel=0.05)
    assert torch.equal(lengths, lognormal_lengths(20_000, 128, 1.0, 100_000, seed=1))
    assert lognormal_lengths(1000, median=500, sigma=3.0, max_length=600).max() == 600


def test_length_distribution_draws_either_kind_and_names_bad_values():
    zipf = LengthDistribution("zipf", alpha=1.5).draw(4096, max_length=8192)
    lognormal = LengthDistribution("lognormal", median=64).draw(4096, max_length=8192)
    assert zipf.median().item() <= 3 and 50 <= lognormal.median().item() <= 80
    with pytest.raises(ValueError, match="kind 'pareto' is not one of 'zipf', 'lognormal'"):
        LengthDistribution("pareto")
    with pytest.raises(ValueError, match="median"):
        LengthDistribution("lognormal", median=0.5)


def test_percent_keeps_two_significant_digits():
    shares = (0.25676, 0.0088452, 6.4e-5, 0.0, 1.49127)
    assert [comparison.percent(x) for x in shares] == ["26%", "0.88%", "0.0064%", "0%", "149%"]


def _row(dist, seed, method, max_load, gap=0.0, longest=False):
    return {
        "distribution": dist,
        "workload": "tokens",
        "num_samples": 8,
        "num_parts": 2,
        "seed": seed,
        "method": method,
        "max_load": max_load,
        "gap_to_lower_bound": gap,
        "largest_item_sets_bound": longest,
    }


def test_kk_swap_vs_lpt_counts_each_batch_by_its_largest_part():
    table = pd.DataFrame(
        [
            _row("zipf", 0, "kk_swap", 10.0),
            _row("zipf", 0, "greedy_lpt", 10.0),
            _row("zipf", 1, "kk_swap", 9.0),
            _row("zipf", 1, "greedy_lpt", 11.0),
            _row("lognormal", 0, "kk_swap", 12.0),
            _row("lognormal", 0, "greedy_lpt", 11.0),
        ]
    )
    counts = comparison.kk_swap_vs_lpt(table)
    assert list(counts.index) == [("zipf", "tokens"), ("lognormal", "tokens")]  # the table's order
    assert counts.loc[("zipf", "tokens")].to_dict() == {"kk_swap": 1, "equal": 1, "greedy_lpt": 0}
    assert counts.loc[("lognormal", "tokens")].to_dict() == {"kk_swap": 0, "equal": 0, "greedy_lpt": 1}


def test_worst_gaps_take_the_worst_batch_and_the_share_where_the_longest_sample_sets_the_bound():
    table = pd.DataFrame(
        [
            _row("zipf", 0, "kk_swap", 0, gap=0.01, longest=True),
            _row("zipf", 1, "kk_swap", 0, gap=0.03),
            _row("zipf", 0, "karmarkar_karp", 0, gap=0.2),
            _row("zipf", 1, "karmarkar_karp", 0, gap=0.1),
        ]
    )
    worst = comparison.worst_gaps(table).loc[("zipf", "tokens")]
    assert worst.to_dict() == {"karmarkar_karp": 0.2, "kk_swap": 0.03, "longest_sets_bound": 0.5}


def test_comparison_table_has_a_row_per_distribution_batch_workload_and_method():
    specs = {"zipf": LengthDistribution("zipf"), "lognormal": LengthDistribution("lognormal", median=32)}
    table = comparison.comparison_table(specs, [256], [8], seeds=[0, 1], max_length=1024, flops_dims=(8, 16))
    assert len(table) == 2 * 2 * 2 * 4  # distributions x seeds x workloads x methods
    assert table["num_samples"].eq(256).all() and table["max_over_mean"].ge(1).all()
    with pytest.raises(ValueError, match="distributions is empty"):
        comparison.comparison_table({}, [256], [8])


def test_crossover_by_width_is_6d_at_f_4d_and_counts_the_samples_past_it():
    table = comparison.crossover_by_width([32, 128], {"a": torch.tensor([1, 200, 800, 900])})
    # 4dL^2 = L(8d^2 + 4df) at f = 4d: L = 6d, worked by hand
    assert table["crossover_length"].tolist() == [192, 768]
    assert table["longer, a"].tolist() == [0.75, 0.5]
