"""The README's Python code blocks, as the tests run them."""

import pathlib
import re

README = pathlib.Path(__file__).resolve().parent.parent / "README.md"
PLANNER_EXAMPLE = "DynamicProgrammingProposer()"  # the block tests/test_wheel.py runs


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def planner_example() -> str:
    (block,) = [b for b in python_blocks() if PLANNER_EXAMPLE in b]
    return block
