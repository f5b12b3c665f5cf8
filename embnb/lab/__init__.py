"""The notebook layer: one subpackage per technique (`embnb.lab.rowwise`, `columnwise`, `planner`,
`balancing`) and what they share (`plotting`, `widgets`, `source`, `logs`, `harness`). The notebooks,
the bench and the tests import it; the library never does (tests/test_library_api.py). It needs
pandas, seaborn and ipywidgets (`pip install embnb[notebooks]`).
"""

import sys

# jsonschema (under nbformat) imports rfc3987_syntax where it is installed, which builds three Earley
# parsers on import: 2-6 s on the 2-core machine in every process that reads a notebook. Nothing here
# validates IRIs: marked absent, jsonschema leaves the "iri" formats unchecked.
sys.modules.setdefault("rfc3987_syntax", None)
