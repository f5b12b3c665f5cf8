"""embnb.lab.source.show_source: what the notebooks show is the package's code."""

import inspect

import pytest

from embnb.lab.balancing.job import balanced_job
from embnb.lab.rowwise import core as reference
from embnb.lab.source import show_source


def test_shows_each_function_whole_in_order():
    code = show_source(reference.fmix64, reference.jump_bucket)
    text = code.data
    assert text.index("def fmix64") < text.index("def jump_bucket")
    for fn in (reference.fmix64, reference.jump_bucket):
        assert inspect.getsource(fn).strip() in text
    assert "0xFF51AFD7ED558CCD" in text
    assert "<div" in code._repr_html_() and "balanced_job" in show_source(balanced_job)._repr_html_()


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="at least one function"):
        show_source()
    with pytest.raises(TypeError, match="show_source takes functions, got str"):
        show_source("jump_bucket")
