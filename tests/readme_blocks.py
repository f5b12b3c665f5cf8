"""The Python code blocks of the README and docs/, as the tests run them."""

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
PLANNER_EXAMPLE = "DynamicProgrammingProposer()"  # the block tests/test_wheel.py runs (docs/planner.md)


def python_blocks(pages: list[pathlib.Path] | None = None) -> list[str]:
    """The ```python blocks of `pages` (default: the README, then docs/*.md)."""
    pages = [README, *sorted((ROOT / "docs").glob("*.md"))] if pages is None else pages
    return [
        block for page in pages for block in re.findall(r"```python\n(.*?)```", page.read_text(), flags=re.S)
    ]


def planner_example() -> str:
    (block,) = [b for b in python_blocks() if PLANNER_EXAMPLE in b]
    return block
