"""Technique 4 (notebook 04): Karmarkar-Karp batch balancing hidden behind compute: the balancers
(`partition`), what to balance (`workloads`), the KJT exchanges (`kjt_gather`, `kjt_alltoall`),
`BalancedShuffle` (`shuffle`) and its training run (`training`). Notebook 04's experiments, figures
and widgets live in `embnb.lab.balancing`.
"""

from embnb.balancing.kjt_alltoall import alltoall_kjt
from embnb.balancing.kjt_gather import allgather_kjt
from embnb.balancing.partition import METHODS, balance, karmarkar_karp, kk_swap
from embnb.balancing.shuffle import BalancedShuffle
from embnb.balancing.training import TrainConfig, train
from embnb.balancing.workloads import attention_block_flops, imbalance

__all__ = [
    "METHODS",
    "balance",
    "karmarkar_karp",
    "kk_swap",
    "allgather_kjt",
    "alltoall_kjt",
    "BalancedShuffle",
    "TrainConfig",
    "train",
    "attention_block_flops",
    "imbalance",
]
