"""embnb.columnwise.torchrec_adapter: torchrec's plans, what its column_wise() can take.

The sharded module itself runs on real ranks in test_cw_cases.py.
"""

import pytest
from torchrec import EmbeddingConfig

from embnb.columnwise import torchrec_adapter


def test_torchrec_column_wise_helper_drops_shards_we_refuse():
    from torchrec import EmbeddingCollection
    from torchrec.distributed.sharding_plan import column_wise, construct_module_sharding_plan

    ec = EmbeddingCollection(
        tables=[EmbeddingConfig(name="t0", embedding_dim=12, num_embeddings=4, feature_names=["f0"])]
    )
    # Four shards of 3 columns: torchrec rounds the width to 4 and keeps 3 shards,
    # silently dropping rank 1's second shard.
    plan = construct_module_sharding_plan(
        ec, {"t0": column_wise(ranks=[1, 0, 0, 1])}, local_size=2, world_size=2, device_type="cpu"
    )
    assert plan["t0"].ranks == [1, 0, 0]
    with pytest.raises(
        ValueError,
        match=r"4 shards of embedding_dim 12 are 3 columns wide; "
        r"torchrec's column_wise\(\) needs a multiple of 4 \(it would make 3 shards",
    ):
        torchrec_adapter.cw_sharding_plan(ec, {"t0": [1, 0, 0, 1]}, 2, "cpu")
    # "fused": "dense" crashes ShardedEmbeddingCollection on CPU/gloo (the module's comment says how)
    assert torchrec_adapter.cw_sharding_plan(ec, {"t0": [1, 0, 1]}, 2, "cpu")["t0"].compute_kernel == "fused"
    with pytest.raises(ValueError, match="device_type 'tpu' is not one of"):
        torchrec_adapter.cw_sharding_plan(ec, {"t0": [1, 0, 1]}, 2, "tpu")


def test_torchrec_num_shards_follows_torchrecs_rounding():
    from torchrec import EmbeddingCollection
    from torchrec.distributed.sharding_plan import column_wise, construct_module_sharding_plan

    for dim, ranks in [(12, [1, 0, 0, 1]), (12, [0, 1, 0]), (20, [0, 1, 0, 1, 0]), (8, [0, 1, 0, 1])]:
        ec = EmbeddingCollection(
            tables=[EmbeddingConfig(name="t0", embedding_dim=dim, num_embeddings=4, feature_names=["f0"])]
        )
        plan = construct_module_sharding_plan(
            ec, {"t0": column_wise(ranks=ranks)}, local_size=2, world_size=2, device_type="cpu"
        )
        assert torchrec_adapter.torchrec_num_shards(dim, dim // len(ranks)) == len(plan["t0"].ranks)


def test_torchrec_on_cuda_needs_fbgemm_cuda_kernels():
    import fbgemm_gpu  # noqa: F401
    import torch

    from embnb.columnwise.torchrec_adapter import fbgemm_cuda_problem

    op = "fbgemm::block_bucketize_sparse_features"
    assert torch._C._dispatch_has_kernel_for_dispatch_key(op, "CPU")  # the op the rule reads exists
    assert fbgemm_cuda_problem(gpu_visible=False) == "no CUDA GPU is visible"
    if not torch._C._dispatch_has_kernel_for_dispatch_key(op, "CUDA"):  # the CPU wheel, as in CI
        assert (
            fbgemm_cuda_problem(gpu_visible=True) == "this fbgemm build has no CUDA kernels (fbgemm-gpu-cpu)"
        )
    else:
        assert fbgemm_cuda_problem(gpu_visible=True) is None


def test_shards_move_to_the_device_their_rank_uses():
    from torchrec import EmbeddingCollection

    ec = EmbeddingCollection(
        tables=[
            EmbeddingConfig(name=t, embedding_dim=16, num_embeddings=4, feature_names=[f"f{t}"]) for t in "ab"
        ]
    )
    placements = {"a": [0, 1, 0, 1], "b": [1, 0, 0, 1]}
    plan = torchrec_adapter.cw_sharding_plan(ec, placements, 2, "cuda")
    # torchrec's own placement: rank r on cuda:r, one GPU a rank
    assert [str(s.placement) for s in plan["a"].sharding_spec.shards] == [
        "rank:0/cuda:0",
        "rank:1/cuda:1",
        "rank:0/cuda:0",
        "rank:1/cuda:1",
    ]
    torchrec_adapter.place_on_devices(plan, ["cuda:0", "cuda:0"])  # two ranks share one GPU
    for table, ranks in placements.items():
        shards = plan[table].sharding_spec.shards
        assert [(s.placement.rank(), str(s.placement.device())) for s in shards] == [
            (r, "cuda:0") for r in ranks
        ]
        assert plan[table].ranks == ranks
