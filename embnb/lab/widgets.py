"""The one widget pattern of the notebooks: ipywidgets' own `interactive_output`, or for slow work
its manual form (`interactive` with `manual=True`: a button runs the function), around a package
function that draws.

A technique's explorer subclasses `Explorer`, names its controls and implements `draw(**values) ->
Figure` with the package functions the static figures use, so what a reader sees while dragging a
slider is what the tests check (`explorer.controls["world_size"].value = 16` redraws; `explorer.figure`,
`explorer.error`). `draw`'s ValueError or TypeError is shown as text, never raised out of a callback.
Behind a button (`button=` a label) a change marks the figure stale, the button is disabled while
`draw` runs, and `progress_step(done, total, what)` moves a bar beside it.
"""

from __future__ import annotations

import html
from collections.abc import Mapping
from typing import Any

import ipywidgets as widgets
from IPython.display import display
from matplotlib.figure import Figure

__all__ = ["Explorer", "world_size_slider"]

LABEL_STYLE = {"description_width": "initial"}  # labels are never cut
BUSY_LABEL = "working…"
STALE_SUFFIX = " (settings changed)"


class Explorer:
    """Controls (`controls`, by name) plus `output`, redrawn by `draw`.

    Args:
        controls: the ipywidgets controls, by the name `draw` takes them as.
        button: a label for a button that runs `draw`; None redraws on
            every change of a control.
        draw_now: draw once at construction (without a button, always).
    """

    def __init__(
        self, controls: Mapping[str, widgets.ValueWidget], button: str | None = None, draw_now: bool = True
    ):
        self.controls = dict(controls)
        for control in self.controls.values():
            control.style = LABEL_STYLE
        self.status = widgets.HTML()
        self.figure: Figure | None = None
        self.error: str | None = None
        self.busy = False
        self.draws = 0  # how many times draw ran, for tests and the busy state
        self.progress_steps: list[tuple[int, int, str]] = []  # this draw's steps, as shown
        self.button_label = button
        row = widgets.HBox(list(self.controls.values()), layout=widgets.Layout(flex_flow="row wrap"))
        if button is None:
            self.button = self.progress = None
            self.output = widgets.interactive_output(self._show, self.controls)  # draws once now
            self.widget = widgets.VBox([row, self.status, self.output])
            return
        self._interactive = widgets.interactive(
            self._show, {"manual": True, "manual_name": button}, **self.controls
        )
        self.output, self.button = self._interactive.out, self._interactive.manual_button
        self.button.button_style = "primary"
        self.progress = widgets.IntProgress(style=LABEL_STYLE)
        self._hide_progress()
        for control in self.controls.values():
            control.observe(self._mark_stale, names="value")
        self.widget = widgets.VBox(
            [row, widgets.HBox([self.button, self.progress, self.status]), self.output]
        )
        if draw_now:
            self.redraw()
        else:
            self.status.value = f"click <b>{html.escape(button)}</b> to draw"

    def draw(self, **values: Any) -> Figure:
        """Return the figure for the controls' `values`; subclasses implement it."""
        raise NotImplementedError

    def progress_step(self, done: int, total: int, what: str) -> None:
        """From `draw`, before each step: `done` of `total` steps are
        finished and `what` runs now (a no-op without a button)."""
        self.progress_steps.append((done, total, what))
        if self.progress is not None:
            self.progress.description = what  # before the value: observers see both new
            self.progress.max, self.progress.value = total, done
            self.progress.layout.visibility = "visible"

    def _hide_progress(self) -> None:
        self.progress.value, self.progress.description = 0, ""
        self.progress.layout.visibility = "hidden"

    def values(self) -> dict[str, Any]:
        return {name: control.value for name, control in self.controls.items()}

    def _show(self, **values: Any) -> None:
        """ipywidgets' callback, run inside `output` (cleared before it): the figure, or the error
        text of a bad value in `status`."""
        if self.busy:  # a click while drawing is ignored, not queued
            return
        self.busy, self.progress_steps = True, []
        if self.button is not None:
            self.button.description, self.button.icon = BUSY_LABEL, "spinner"
        try:
            figure = self.draw(**values)
        except (ValueError, TypeError) as error:
            self.error = f"{type(error).__name__}: {error}"
            self.status.value = f'<span style="color:#c44e52">{html.escape(self.error)}</span>'
            self.output.clear_output()  # the caller's clear waits for new output: none comes
            return
        finally:
            self.busy = False
            self.draws += 1
            if self.button is not None:
                self.button.description, self.button.icon = self.button_label, ""
                self._hide_progress()
        self.error, self.figure = None, figure
        self.status.value = ""
        display(figure)

    def _mark_stale(self, change: dict) -> None:
        if not self.busy:
            self.button.description = self.button_label + STALE_SUFFIX

    def redraw(self) -> Figure | None:
        """Run `draw` for the current values (as a change or a click does) and show the figure, or
        the error text of a bad value. Returns the figure, or None on an error."""
        if self.button is None:
            self.output.clear_output(wait=True)
            with self.output:
                self._show(**self.values())
        else:
            self._interactive.update()
        return None if self.error else self.figure

    def click(self) -> Figure | None:
        """Press the button (what a test or a script does)."""
        if self.button is None:
            return self.redraw()
        self.button.click()
        return self.figure

    def _repr_mimebundle_(self, **kwargs):
        return self.widget._repr_mimebundle_(**kwargs)


def world_size_slider(value: int, max_world_size: int, description: str = "world_size") -> widgets.IntSlider:
    """The ranks control every explorer shares: 1 to max(max_world_size, value),
    redrawing when released (not at every step of a drag)."""
    return widgets.IntSlider(
        value=value, min=1, max=max(max_world_size, value), description=description, continuous_update=False
    )
