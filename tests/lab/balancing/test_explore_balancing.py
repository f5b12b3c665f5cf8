"""BalanceExplorer (notebook 04's widget), driven headlessly."""

import pytest

from embnb.balancing import partition
from embnb.data import zipf_lengths
from embnb.lab.balancing.explore import BalanceExplorer


def test_every_control_redraws_with_its_setting():
    explorer = BalanceExplorer(alpha=1.5, num_parts=8, num_samples=256, max_length=512)
    controls = explorer.controls
    assert [ax.get_title().split("\n")[0] for ax in explorer.figure.axes] == list(partition.METHODS)
    assert all(len(ax.patches) == 8 for ax in explorer.figure.axes)
    controls["num_parts"].value = 4
    assert all(len(ax.patches) == 4 for ax in explorer.figure.axes)
    controls["num_samples"].value = 128
    controls["alpha"].value = 2.0
    # The bars hold every token of the batch the controls ask for, whatever the method.
    tokens = int(zipf_lengths(128, 2.0, 512, 0).sum())
    for ax in explorer.figure.axes:
        assert sum(p.get_height() for p in ax.patches) == pytest.approx(tokens)
    assert explorer.draws == 4 and explorer.error is None


def test_a_bad_value_shows_its_error_instead_of_raising():
    explorer = BalanceExplorer(num_samples=64, max_length=128)
    before = explorer.figure
    explorer.max_length = 0  # a batch the sampler refuses
    explorer.controls["num_parts"].value = 3
    assert explorer.error == "ValueError: max_length must be an int >= 1, got 0"
    assert "max_length must be an int" in explorer.status.value
    assert explorer.figure is before
