"""The public names of embnb.columnwise: every layer's, importable from the package."""

import importlib

import embnb.columnwise as cw

LAYERS = ["placement", "lookup", "torchrec_adapter", "traffic", "cases", "experiment", "plots", "widgets"]


def test_every_public_name_is_importable_from_the_package():
    for layer in LAYERS:
        module = importlib.import_module(f"embnb.columnwise.{layer}")
        for name in module.__all__:
            assert getattr(cw, name) is getattr(module, name), (layer, name)
    assert len(cw.__all__) == len(set(cw.__all__))


def test_the_placement_maths_needs_no_torchrec():
    import subprocess
    import sys

    code = "import sys, embnb.columnwise.placement; print(any(m.startswith('torchrec') for m in sys.modules))"
    assert (
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "False"
    )
