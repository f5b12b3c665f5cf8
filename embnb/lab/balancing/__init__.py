"""Notebook 04's layer over `embnb.balancing`, and its appendix 04a's: the page imports this
package alone (`import embnb.lab.balancing as lab`) and finds here what it uses.

`reference` (the KK the page shows), `comparison` (the balancers over many batches),
`experiment` (KK traced and timed, the real runs on ranks), `job` (the user's training loop),
`measured`, `cost_fit` and `memory_cap` (the step rank by rank, whether time follows work, the
memory caps), `gpu_runs` (the committed GPU runs), `plots`; the explorer is `widgets`.
"""

from embnb.dist import device_plan, launch, resolve_device, start_rank_server
from embnb.lab.balancing import comparison, cost_fit, experiment, gpu_runs, job, measured, memory_cap, plots
from embnb.lab.balancing.reference import kk_equal_count, page_core_agrees
from embnb.lab.logs import quiet_torch_fx
from embnb.lab.source import show_source

__all__ = [
    "comparison", "cost_fit", "experiment", "gpu_runs", "job", "measured", "memory_cap", "plots",
    "kk_equal_count", "page_core_agrees", "device_plan", "launch", "resolve_device", "start_rank_server",
    "quiet_torch_fx", "show_source",
]  # fmt: skip
