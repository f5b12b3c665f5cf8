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

import sys

# jsonschema (under nbformat, which the harness and the notebook tooling read
# notebooks with) imports rfc3987_syntax where it is installed (jupyter-events
# asks for jsonschema[format-nongpl]), and that module builds three Earley
# parsers on import: 2-6 s on the 2-core machine, in every process that reads
# a notebook. Nothing here validates IRIs, so it is marked absent; jsonschema
# then leaves the "iri" formats unchecked.
sys.modules.setdefault("rfc3987_syntax", None)
