"""The code blocks of the README and docs/ run as a reader would paste them
(docs/planner.md's DynamicProgrammingProposer example runs in
tests/test_wheel.py, from the installed wheel)."""

import os
import pathlib
import re
import subprocess
import sys
import textwrap

import pytest
from readme_blocks import PLANNER_EXAMPLE, README, python_blocks

BLOCKS = [b for b in python_blocks() if PLANNER_EXAMPLE not in b]
BIN = pathlib.Path(sys.executable).parent


def test_the_readme_has_its_examples():
    text = "\n".join(python_blocks([README]))
    for name in (
        "create_planner",
        "DistributedModelParallel",
        "collective_plan",
        "RoutedEmbeddingBagCollectionSharder",
        "bucketize",
        "owner_rank",
        "balance(",
        "BalancedShuffle",
    ):
        assert name in text, name


@pytest.mark.parametrize("block", BLOCKS, ids=[b.splitlines()[0][:40] for b in BLOCKS])
def test_a_readme_block_runs(block, tmp_path):
    script = tmp_path / "example.py"
    script.write_text(block)
    first = block.splitlines()[0]
    if first.startswith("# torchrun "):  # run as its first line says, on real ranks
        args = first[2:].split()
        command = [str(BIN / "torchrun"), "--standalone", *args[1:-1], str(script)]
    else:
        command = [sys.executable, str(script)]
    env = os.environ | {"PYTHONWARNINGS": "ignore"}
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=240, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip(), "the example printed nothing"
    if "shuffle.batches(" in block:  # the README's torchrun job
        check_the_job_balanced_every_step(done.stdout)


def check_the_job_balanced_every_step(stdout: str) -> None:
    """The README's torchrun job: every rank trained every step, and the
    shuffle left the ranks' item ids within one history of each other (KK on
    equal counts ends within the largest sample; the loader's histories are
    at most 501 ids)."""
    # not anchored to lines: torchrun interleaves the ranks' output, a line's end may come later
    steps = re.findall(r"rank (\d) step (\d): loss [\d.]+, (\d+) item ids", stdout)
    by_step: dict[str, dict[str, int]] = {}
    for rank, step, ids in steps:
        by_step.setdefault(step, {})[rank] = int(ids)
    assert sorted(by_step) == ["0", "1", "2", "3"] and all(len(r) == 2 for r in by_step.values()), stdout
    for ids in by_step.values():
        assert abs(ids["0"] - ids["1"]) <= 501, by_step
    assert re.search(r"plan rated [\d.]+ ms", stdout), stdout
    assert "'t_item': 'feistel_roundrobin'" in stdout, stdout  # the routing, read back from the module


def test_the_proposers_docstring_example_runs(tmp_path):
    from embnb.planner import DynamicProgrammingProposer

    doc = DynamicProgrammingProposer.__doc__
    example = textwrap.dedent(doc[doc.index("Example") :].split("\n", 1)[1])
    script = tmp_path / "example.py"
    script.write_text(example)
    command = [sys.executable, str(script)]
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr
    assert re.fullmatch(r"rating [\d.]+ ms\n", done.stdout), done.stdout
