"""The notebook layer: each notebook's experiments, studies, tables, figures
and widgets, one subpackage per technique (`embnb.lab.rowwise`,
`embnb.lab.columnwise`, `embnb.lab.balancing`).

The notebooks, the bench (`python -m embnb.bench`) and the tests import it;
the library (`embnb.rowwise`, `embnb.columnwise`, `embnb.balancing`, ...)
never does (tests/test_library_api.py checks every import). It may need
pandas, matplotlib and ipywidgets (`pip install embnb[notebooks]`).
"""
