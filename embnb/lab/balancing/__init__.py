"""Notebook 04's layer over `embnb.balancing`, and appendix 04a's: `import embnb.lab.balancing as lab`
(`_HOMES`: each name loads only its module; `lab.measured`, `lab.figures`, ... the modules themselves).
"""

from embnb.lab.exports import lazy_exports

_HOMES = {
    **dict.fromkeys(["comparison", "experiment", "figures", "job", "measured"], []),  # modules
    "core": ["page_core_agrees", "trace_table"],
    "explore": ["BalanceExplorer"],
    "embnb.dist": ["device_plan", "launch", "resolve_device", "start_rank_server"],
    "embnb.lab.logs": ["quiet_torch_fx"],
    "embnb.lab.source": ["show_source"],
}
__all__, __getattr__, __dir__ = lazy_exports(__name__, _HOMES)
