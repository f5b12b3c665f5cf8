"""Notebook 04's layer over `embnb.balancing`, and its appendix 04a's: the page imports this
package alone (`import embnb.lab.balancing as lab`) and finds here what it uses.

`reference` (the KK the page shows), `comparison` (the balancers over many batches),
`experiment` (KK traced and timed, the real runs on ranks), `job` (the user's training loop),
`measured`, `cost_fit` and `memory_cap` (the step rank by rank, whether time follows work, the
memory caps), `gpu_runs` (the committed GPU runs), `plots`; the explorer is `widgets`.
"""

from embnb.lab.exports import lazy_exports

_HOMES = {
    **dict.fromkeys(["comparison", "cost_fit", "experiment", "gpu_runs", "job", "measured", "memory_cap",
                     "plots", "widgets"], []),  # modules of their own: lab.measured.fitted
    "reference": ["kk_equal_count", "page_core_agrees"],
    "embnb.dist": ["device_plan", "launch", "resolve_device", "start_rank_server"],
    "embnb.lab.logs": ["quiet_torch_fx"],
    "embnb.lab.source": ["show_source"],
}  # fmt: skip
__all__, __getattr__, __dir__ = lazy_exports(__name__, _HOMES)
