"""embnb.lab.widgets.Explorer: the one widget pattern, driven headlessly."""

import ipywidgets as widgets
import pytest

from embnb.lab import plotting
from embnb.lab.widgets import BUSY_LABEL, Explorer


class Bars(Explorer):
    """A minimal explorer: `num_ranks` bars of height `height`."""

    def __init__(self, button=None):
        super().__init__(
            {
                "num_ranks": widgets.IntSlider(value=4, min=1, max=64, description="num_ranks"),
                "height": widgets.FloatText(value=1.0, description="height"),
            },
            button=button,
        )

    def draw(self, num_ranks, height):
        if height <= 0:
            raise ValueError(f"height must be > 0, got {height}")
        return plotting.rank_bars({"x": [height] * num_ranks}, title=f"{num_ranks} ranks")


def test_every_change_redraws_with_the_new_setting():
    explorer = Bars()
    assert explorer.figure._suptitle.get_text() == "4 ranks"
    explorer.controls["num_ranks"].value = 9
    assert explorer.figure._suptitle.get_text() == "9 ranks"
    assert len(explorer.figure.axes[0].patches) == 9
    assert explorer.draws == 2 and explorer.error is None


def test_a_bad_value_shows_its_error_instead_of_raising():
    explorer = Bars()
    explorer.controls["height"].value = -1.0  # would raise inside draw
    assert explorer.error == "ValueError: height must be > 0, got -1.0"
    assert "height must be &gt; 0" in explorer.status.value
    explorer.controls["height"].value = 2.0  # a good value clears it
    assert explorer.error is None and explorer.status.value == ""


def test_with_a_button_a_change_only_marks_the_figure_stale_until_clicked():
    explorer = Bars(button="draw")
    assert explorer.draws == 1
    explorer.controls["num_ranks"].value = 7
    assert explorer.draws == 1 and explorer.button.description == "draw (settings changed)"
    explorer.click()
    assert explorer.draws == 2 and explorer.figure._suptitle.get_text() == "7 ranks"
    assert explorer.button.description == "draw" and not explorer.button.disabled


def test_the_button_is_busy_while_drawing_and_ignores_clicks():
    seen = []

    class Slow(Bars):
        def draw(self, num_ranks, height):
            seen.append((self.button.disabled, self.button.description))
            self.button.click()  # a click while busy must not start a second draw
            return super().draw(num_ranks, height)

    explorer = Slow(button="plan")
    before = explorer.draws
    explorer.click()
    assert seen[-1] == (True, BUSY_LABEL)
    assert explorer.draws == before + 1


def test_base_class_needs_a_draw():
    with pytest.raises(NotImplementedError):
        Explorer({"n": widgets.IntSlider()}).draw(n=1)


def test_a_draw_with_steps_moves_the_progress_bar_and_a_failed_one_hides_it():
    shown = []

    class Steps(Bars):
        def draw(self, num_ranks, height):
            for step in range(3):
                self.progress_step(step, 3, f"part {step}")
                shown.append((self.progress.value, self.progress.max, self.progress.description))
                assert self.progress.layout.visibility == "visible"
            return super().draw(num_ranks, height)

    explorer = Steps(button="draw")
    assert shown == [(0, 3, "part 0"), (1, 3, "part 1"), (2, 3, "part 2")]
    assert explorer.progress.layout.visibility == "hidden"
    explorer.controls["height"].value = -1.0
    explorer.click()  # fails after its steps: the error shows, the bar goes
    assert explorer.error.startswith("ValueError") and explorer.progress.layout.visibility == "hidden"
    assert Bars().progress is None  # no button, no bar: progress_step is a no-op
    Bars().progress_step(1, 2, "ignored")
