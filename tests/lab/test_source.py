"""embnb.lab.source.show_source: what the notebooks show is the package's code."""

import inspect

import pytest

from embnb.lab.balancing.job import balanced_job
from embnb.lab.rowwise import core as reference
from embnb.lab.source import show_source


def test_shows_each_function_whole_in_order():
    code = show_source(reference.jump_bucket, reference.page_core_agrees)
    text = code.data
    assert text.index("def jump_bucket") < text.index("def page_core_agrees")
    for fn in (reference.jump_bucket, reference.page_core_agrees):
        assert inspect.getsource(fn).strip() in text
    assert "2862933555777941757" in text
    assert "<div" in code._repr_html_() and "balanced_job" in show_source(balanced_job)._repr_html_()


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="at least one function"):
        show_source()
    with pytest.raises(TypeError, match="show_source takes functions, got str"):
        show_source("jump_bucket")
