"""The notebook layer: each notebook's experiments, studies, tables, figures
and widgets, one subpackage per technique (`embnb.lab.rowwise`,
`embnb.lab.columnwise`, `embnb.lab.planner`, `embnb.lab.balancing`), and what
they share: `plotting` (palette, rank ticks, rank bars), `widgets` (the
`Explorer` pattern), `source` (`show_source`) and `logs` (`quiet_torch_fx`).

The notebooks, the bench (`python -m embnb.bench`) and the tests import it;
the library (`embnb.rowwise`, `embnb.columnwise`, `embnb.balancing`, ...)
never does (tests/test_library_api.py checks every import). It may need
pandas, matplotlib and ipywidgets (`pip install embnb[notebooks]`).
"""
