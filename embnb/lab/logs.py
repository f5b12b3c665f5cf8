"""torch.fx's `is_fx_tracing` logs a deprecation once per process, and every KeyedJaggedTensor calls
it (through torch.fx's `ProxyableClassMeta`): a red box in a notebook. The notebooks, the bench and the
harness quiet it themselves (`quiet_torch_fx()`); importing embnb changes no logger.
"""

from __future__ import annotations

import logging
import os

__all__ = ["FX_LOGGER", "quiet_torch_fx"]

FX_LOGGER = "torch.fx._symbolic_trace"


def quiet_torch_fx() -> None:
    """Raise torch.fx's deprecation logger to ERROR here and in every process
    started from here afterwards: ranks and kernels import torch afresh and
    read `TORCH_LOGS` (a `-name` entry sets that logger to ERROR)."""
    logging.getLogger(FX_LOGGER).setLevel(logging.ERROR)
    entries = [entry for entry in os.environ.get("TORCH_LOGS", "").split(",") if entry]
    if f"-{FX_LOGGER}" not in entries:
        os.environ["TORCH_LOGS"] = ",".join([*entries, f"-{FX_LOGGER}"])
