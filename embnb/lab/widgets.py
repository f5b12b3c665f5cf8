"""The one widget pattern of the notebooks: controls plus an output that a package function redraws.

A technique's explorer subclasses `Explorer`, names its controls and implements `draw(**values) ->
Figure` with the package functions the static figures use, so what a reader sees while dragging a
slider is what the tests check (`explorer.controls["world_size"].value = 16` redraws; `explorer.figure`,
`explorer.error`). `draw`'s ValueError or TypeError is shown as text, never raised out of a callback.
Slow work sits behind a button (`button=` a label): a change then marks the figure stale, a click
disables the button while `draw` runs, and `progress_step(done, total, what)` moves a bar beside it.
"""

from __future__ import annotations

import html
from collections.abc import Mapping
from typing import Any

import ipywidgets as widgets
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
            control.observe(self._on_change, names="value")
        self.output = widgets.Output()
        self.status = widgets.HTML()
        self.figure: Figure | None = None
        self.error: str | None = None
        self.busy = False
        self.draws = 0  # how many times draw ran, for tests and the busy state
        self.button_label = button
        self.button = None if button is None else widgets.Button(description=button, button_style="primary")
        self.progress = None if button is None else widgets.IntProgress(style=LABEL_STYLE)
        self.progress_steps: list[tuple[int, int, str]] = []  # this draw's steps, as shown
        if self.button is not None:
            self.button.on_click(self._on_click)
            self._hide_progress()
        row = widgets.HBox(list(self.controls.values()), layout=widgets.Layout(flex_flow="row wrap"))
        under = self.status if button is None else widgets.HBox([self.button, self.progress, self.status])
        self.widget = widgets.VBox([row, under, self.output])
        if self.button is None or draw_now:
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

    def redraw(self) -> Figure | None:
        """Run `draw` for the current values and show the figure, or the
        error text of a bad value. Returns the figure, or None on an error."""
        self.busy = True
        self.progress_steps = []
        try:
            figure = self.draw(**self.values())
        except (ValueError, TypeError) as error:
            self.error = f"{type(error).__name__}: {error}"
            self.status.value = f'<span style="color:#c44e52">{html.escape(self.error)}</span>'
            self.output.clear_output()
            return None
        finally:
            self.busy = False
            self.draws += 1
            if self.progress is not None:
                self._hide_progress()
        self.error, self.figure = None, figure
        self.status.value = ""
        self.output.clear_output(wait=True)
        with self.output:
            from IPython.display import display

            display(figure)
        return figure

    def _on_change(self, change: dict) -> None:
        if self.button is None:
            self.redraw()
        elif not self.busy:
            self.button.description = self.button_label + STALE_SUFFIX

    def _on_click(self, button: widgets.Button) -> None:
        if self.busy:  # a click while drawing is ignored, not queued
            return
        button.disabled, button.description, button.icon = True, BUSY_LABEL, "spinner"
        try:
            self.redraw()
        finally:
            button.disabled, button.description, button.icon = False, self.button_label, ""

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
