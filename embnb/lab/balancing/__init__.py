"""Notebook 04's layer over `embnb.balancing`, and its appendix 04a's: a page imports this package
alone (`import embnb.lab.balancing as lab`) and finds here what it uses.

`core` (what the page's KK is checked against), `comparison` (the balancers over many batches),
`experiment` (the runs on real ranks), `job` (the user's training loop), `measured`, `cost_fit` and
`memory_cap` (the step rank by rank, whether time follows work, the memory caps), `gpu_runs` (the
committed GPU runs), `figures`; the explorer is `explore`.
"""

from embnb.lab.exports import lazy_exports

_HOMES = {
    **dict.fromkeys(["comparison", "cost_fit", "experiment", "figures", "gpu_runs", "job", "measured",
                     "memory_cap"], []),  # modules of their own: lab.measured.fitted
    "core": ["page_core_agrees", "trace_table"],
    "explore": ["BalanceExplorer"],
    "embnb.dist": ["device_plan", "launch", "resolve_device", "start_rank_server"],
    "embnb.lab.logs": ["quiet_torch_fx"],
    "embnb.lab.source": ["show_source"],
}  # fmt: skip
__all__, __getattr__, __dir__ = lazy_exports(__name__, _HOMES)
