"""Technique 4 (notebook 04): Karmarkar-Karp batch balancing hidden behind compute.

- `partition`: the balancers (contiguous, LPT, KK, KK + swaps) and `balance`.
- `workloads`: what to balance (attention FLOPs) and how far from the bound.
- `kjt_gather`: all KeyedJaggedTensors of a batch in two collectives.
- `shuffle`: `BalancedShuffle`, KK in a background thread, then the exchange.
- `timeline`: when each phase ran; how much of KK was hidden.
- `training`: `TrainConfig`, the model and `train` on real ranks.
- `experiment`: notebook 04's runs and results; `plots`, `widgets`.
"""

from embnb.balancing.partition import METHODS, balance, karmarkar_karp, kk_swap
from embnb.balancing.shuffle import BalancedShuffle
from embnb.balancing.training import TrainConfig, train
from embnb.balancing.workloads import attention_block_flops, imbalance

__all__ = [
    "METHODS",
    "balance",
    "karmarkar_karp",
    "kk_swap",
    "BalancedShuffle",
    "TrainConfig",
    "train",
    "attention_block_flops",
    "imbalance",
]
