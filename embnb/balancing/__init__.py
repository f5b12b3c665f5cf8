"""Technique 4 (notebook 04): Karmarkar-Karp batch balancing hidden behind compute.

- `partition`: the balancers (contiguous, LPT, KK, KK + swaps) and `balance`.
- `workloads`: what to balance (attention FLOPs) and how far from the bound.
- `kjt_gather`: all KeyedJaggedTensors of a batch in two collectives.
- `kjt_alltoall`: each rank's part of the batch in two all-to-alls, and the
  bytes either exchange moves.
- `shuffle`: `BalancedShuffle`: workload gather, KK and exchange, in a
  background worker under the step's compute when overlapped.
- `timeline`: when each phase ran, in which thread; how much of the
  shuffle was hidden.
- `training`: `TrainConfig`, the model and `train` on real ranks.

Notebook 04's experiments, figures and widgets live in `embnb.lab.balancing`.
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
