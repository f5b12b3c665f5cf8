"""The routed sharders on CUDA (where a GPU is lent and FBGEMM's CUDA kernels are there; the GPU kit
runs it): one nccl rank shards each case row-wise with FBGEMM's CUDA TBEs under
DistributedModelParallel; its outputs, and its tables after one fused SGD step, equal the unsharded
module's on the CPU. At W = 1 feistel_roundrobin still permutes the rows (its bijection of [0, N)),
so the routed ids and slots are exercised; the other routings are the identity there. Two ranks
cannot share one GPU under nccl, and torchrec's input dist needs nccl for CUDA tensors."""

import pytest
import torch
from sharder_ranks import parity_case

from embnb.dist import launch_each
from tests.rowwise.test_sharders import CO, FR, RR, SEED, in_id_order, routing, unsharded_step

pytestmark = pytest.mark.cuda

CASES = [  # (kind, rows per table, routings)
    ("ebc", {"a": 9, "b": 8}, {"a": RR, "b": FR}),
    ("ebc", {"a": 6, "b": 11}, {"a": FR, "b": CO}),
    ("ec", {"a": 7, "b": 9}, {"a": CO, "b": RR}),
    ("ec", {"a": 6, "b": 5}, {"a": FR}),
]


def test_one_nccl_rank_on_the_gpu_matches_the_unsharded_module():
    from embnb.steptime.kernels import fbgemm_cuda_available

    if not fbgemm_cuda_available():
        pytest.fail("FBGEMM's CUDA kernels are not here (fbgemm-gpu-cpu): the sharders cannot run on CUDA")
    results = launch_each([(parity_case, case + (SEED,)) for case in CASES], 1, device="cuda", timeout_s=300)
    for (kind, rows, routings), (result,) in zip(CASES, results):  # one rank
        outs, after = unsharded_step(kind, rows, 1)
        assert result["routings"] == {name: routing(routings, name) for name in rows}
        torch.testing.assert_close(result["out"], outs[0], rtol=1e-5, atol=1e-5)
        for name, n in rows.items():
            table = in_id_order(result["after"][name], routing(routings, name), 1, n)
            torch.testing.assert_close(table, after[name], rtol=1e-5, atol=1e-5)
