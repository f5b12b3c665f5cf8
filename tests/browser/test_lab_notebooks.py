"""Every notebook in a real JupyterLab in headless chromium: Run All Cells
with small parameters and interactive=True, then use the explorer's
controls as a reader would (click, drag, type) and check that its figure is
redrawn each time, that no output shows an error or a widget's text
fallback, and that the browser console logs no error."""

from __future__ import annotations

import re

import papermill
import pytest

from embnb import harness
from tests.browser.conftest import shutdown_kernels

SMALL = {  # the smallest runs that still touch every section
    "01_modulo_aliasing": {
        "num_keys": 20_000,
        "world_sizes": [4],
        "zipf_seeds": 4,
        "train_steps": 1,
        "train_num_embeddings": 256,
    },
    "02_cw_permute_indices": {},
    "03_dp_planner": {
        "num_tables": 6,
        "world_size": 2,
        "quality_instances": 1,
        "pitfall_instances": 4,
        "timeout_s": 10,
    },
    "04_balancer_overlap": {
        "world_size": 2,
        "batch_size": 4,
        "max_length": 32,
        "steps": 3,
        "repeats": 2,
        "embedding_dim": 8,
        "ffn_dim": 16,
        "sample_counts": [256],
        "part_counts": [4],
        "seeds": [0],
        "job_steps": 2,
    },
}
RUN_ALL_TIMEOUT_MS = 420_000  # ranks on a 2-core machine: tens of seconds per notebook
REDRAW_TIMEOUT_MS = 120_000
FIGURE = ".widget-output img"  # the explorer's figure (the only image inside a widget)
# What a widget shows instead of itself when its frontend is missing or broken.
FALLBACKS = (
    "HBox(children",
    "VBox(children",
    "Error displaying widget",
    "Loading widgets",
    "Model not found",
)
ALL_CELLS_RAN = """() => {
    const prompts = [...document.querySelectorAll('.jp-CodeCell .jp-InputPrompt')];
    return prompts.length > 0 && prompts.every(p => /\\[\\d+\\]/.test(p.textContent));
}"""
# The explorer's own error text (embnb.widgets.Explorer: a bad value's message, in red).
EXPLORER_ERROR = '.widget-html [style*="c44e52"]'
FIGURE_CHANGED = """([selector, before, error]) => {
    const img = document.querySelector(selector);
    return document.querySelector(error) !== null || (img !== null && img.src !== before);
}"""


@pytest.fixture
def page(browser, lab, request, tmp_path):
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    page.console_errors = []
    page.on("console", lambda message: message.type == "error" and page.console_errors.append(message.text))
    page.on("pageerror", lambda error: page.console_errors.append(str(error)))
    yield page
    explorer = page.locator(".widget-output").last.locator("xpath=..")  # controls, status, figure
    if explorer.count():  # what a reader saw last, to look at by eye
        explorer.scroll_into_view_if_needed()
        explorer.screenshot(path=str(tmp_path / "explorer.png"))
    if getattr(request.node, "failed_call", False):  # keep what the browser showed
        page.screenshot(path=str(tmp_path / "page.png"), full_page=True)
        (tmp_path / "page.html").write_text(page.content())
        print(f"browser evidence: {tmp_path}/page.png and page.html")
    context.close()
    left = shutdown_kernels(lab.url)  # the next notebook gets the cores
    assert not left, f"kernels still running after their test: {left}"


def open_and_run(page, lab, name: str) -> None:
    """Write `name` with small parameters into the lab, open it, Run All Cells
    and wait until every code cell has run."""
    params = {**SMALL[name], "device": "cpu", "interactive": True, "results_path": f"{name}.json"}
    papermill.execute_notebook(
        str(harness.NOTEBOOKS_DIR / f"{name}.ipynb"),
        str(lab.root / f"{name}.ipynb"),
        parameters=params,
        prepare_only=True,
        kernel_name="python3",
        progress_bar=False,
    )
    page.goto(f"{lab.url}/lab/tree/{name}.ipynb?reset")  # only this notebook: no restored tabs
    page.locator(".jp-NotebookPanel .jp-CodeCell").first.wait_for(timeout=60_000)
    page.locator("#jp-main-statusbar").get_by_text("Idle").wait_for(timeout=60_000)
    page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^Run$")).click()
    page.locator(".lm-Menu-itemLabel", has_text=re.compile(r"^Run All Cells$")).click()
    page.wait_for_function(ALL_CELLS_RAN, timeout=RUN_ALL_TIMEOUT_MS)
    if name != "03_dp_planner":  # 03's explorer plans only when its button is clicked
        page.locator(FIGURE).first.wait_for(timeout=REDRAW_TIMEOUT_MS)
    assert_clean(page, name)


def assert_clean(page, name: str) -> None:
    stderr = page.locator('.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]')
    texts = [stderr.nth(i).inner_text() for i in range(stderr.count())]
    assert not texts, f"{name}: outputs on stderr (errors, warnings):\n" + "\n---\n".join(texts)[:4000]
    outputs = "\n".join(page.locator(".jp-OutputArea-output").all_inner_texts())
    fallbacks = [f for f in FALLBACKS if f in outputs]
    assert not fallbacks, f"{name}: a widget rendered as text: {fallbacks}"
    shown = page.locator(EXPLORER_ERROR).all_inner_texts()
    assert not shown, f"{name}: the explorer shows an error: {shown}"
    assert not page.console_errors, f"{name}: browser console errors: {page.console_errors}"


def figure_src(page) -> str | None:
    figure = page.locator(FIGURE)
    return figure.first.get_attribute("src") if figure.count() else None


def wait_redrawn(page, before: str | None, what: str) -> str:
    try:
        page.wait_for_function(
            FIGURE_CHANGED, arg=[FIGURE, before, EXPLORER_ERROR], timeout=REDRAW_TIMEOUT_MS
        )
    except Exception as error:
        raise AssertionError(f"the figure was not redrawn after {what}") from error
    shown = page.locator(EXPLORER_ERROR).all_inner_texts()
    assert not shown, f"the explorer shows an error after {what}: {shown}"
    return figure_src(page)


def control(page, label: str):
    """The widget whose description is `label` (its whole box)."""
    name = page.locator("label.widget-label", has_text=re.compile(f"^{re.escape(label)}$"))
    return name.locator("xpath=..")


def drag_slider(page, label: str, pixels: int) -> None:
    handle = control(page, label).locator(".noUi-handle")
    handle.scroll_into_view_if_needed()  # the mouse only reaches what is on screen
    box = handle.bounding_box()
    x, y = box["x"] + box["width"] / 2, box["y"] + box["height"] / 2
    page.mouse.move(x, y)
    page.mouse.down()
    page.mouse.move(x + pixels, y, steps=8)
    page.mouse.up()


def test_01_every_dist_type_and_the_world_size_redraw(page, lab):
    open_and_run(page, lab, "01_modulo_aliasing")
    src = figure_src(page)
    toggles = control(page, "dist_type").locator("button")
    names = toggles.all_inner_texts()
    assert len(names) >= 3, names
    for i, name in enumerate(names):
        if "mod-active" in (toggles.nth(i).get_attribute("class") or ""):
            continue
        toggles.nth(i).click()
        src = wait_redrawn(page, src, f"clicking dist_type {name!r}")
    active = [toggles.nth(i).get_attribute("class") or "" for i in range(len(names))]
    toggles.nth(next(i for i, c in enumerate(active) if "mod-active" not in c)).click()  # back once more
    src = wait_redrawn(page, src, "clicking a dist_type again")
    drag_slider(page, "world_size", 60)
    wait_redrawn(page, src, "dragging the world_size slider")
    assert_clean(page, "01_modulo_aliasing")


def test_02_typed_shard_ranks_redraw(page, lab):
    open_and_run(page, lab, "02_cw_permute_indices")
    src = figure_src(page)
    box = control(page, "shard_ranks").locator("input")
    box.fill("1, 0, 0, 1")
    box.press("Enter")
    wait_redrawn(page, src, "typing shard_ranks 1, 0, 0, 1")
    assert_clean(page, "02_cw_permute_indices")


def test_03_plan_button_draws_then_replans_at_another_world_size(page, lab):
    open_and_run(page, lab, "03_dp_planner")
    assert figure_src(page) is None  # nothing is planned before the button is clicked
    plan = page.locator("button", has_text=re.compile(r"^plan"))
    plan.click()
    src = wait_redrawn(page, None, "clicking plan")
    drag_slider(page, "world size", 60)
    assert "settings changed" in plan.inner_text()
    plan.click()
    wait_redrawn(page, src, "dragging world size and clicking plan")
    try:  # ipywidgets enables the button again just after the figure is shown: wait, do not race it
        page.wait_for_function(
            "b => b.textContent.trim() === 'plan' && !b.disabled", arg=plan.element_handle(), timeout=10_000
        )
    except Exception as error:
        raise AssertionError(
            f"the plan button reads {plan.inner_text()!r}, enabled: {plan.is_enabled()}"
        ) from error
    assert_clean(page, "03_dp_planner")


def test_04_dragging_the_ranks_slider_redraws(page, lab):
    open_and_run(page, lab, "04_balancer_overlap")
    src = figure_src(page)
    drag_slider(page, "ranks", 60)
    wait_redrawn(page, src, "dragging the ranks slider")
    assert_clean(page, "04_balancer_overlap")
