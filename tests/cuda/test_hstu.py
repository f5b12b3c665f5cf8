"""The HSTU-like block's jagged attention (flash attention's variable-length kernel, CUDA only) against
its bucketed attention, itself checked against a per-sample reference in tests/balancing/test_hstu.py:
on the same batch and weights in bf16 (the bench's GPU dtype), the same outputs and gradients within
bf16's rounding. The GPU kit runs this file among its CUDA tests, before any bench."""

import pytest
import torch

from embnb.balancing.hstu import HSTUModel, attention_kind, bucket_by_length, jagged_by_length

pytestmark = pytest.mark.cuda  # tests/conftest.py: skipped without a GPU, failed under EMBNB_REQUIRE_GPU=1

# a one-token sample, one of 300 tokens (past flash attention's 128-row tiles), lengths not multiples of 8
LENGTHS = [5, 1, 17, 3, 33, 8, 16, 2, 300, 129]
# bf16 keeps 8 significant bits (a unit in the last place is 2^-8 to 2^-7 of a value), and the two
# paths sum in different orders. Attention alone: each element within 2% of the tensor's largest
# magnitude plus 2% of itself (bucketed bf16 against float64 on a CPU: at most 0.9% of the largest).
# The whole model, whose LayerNorm gradients add up 514 tokens' bf16 rounding: each tensor's difference
# at most 3% of its norm (bucketed bf16 against float64 on a CPU: at most 0.9%, so two bf16 runs 1.8%).
BF16_TOLERANCE = {"rtol": 2e-2, "atol": 2e-2}
BF16_NORM_TOLERANCE = 3e-2


def _batches():
    return [jagged_by_length(LENGTHS).to("cuda"), bucket_by_length(LENGTHS).to("cuda")]


@pytest.mark.parametrize("width", [16, 512])  # one head of 16; two heads of 256 (recsys-examples' size)
def test_jagged_attention_equals_bucketed_with_its_gradients(width):
    assert attention_kind("auto", "cuda") == "jagged"
    torch.manual_seed(0)
    block = HSTUModel(width, 1)[0].to("cuda", torch.bfloat16)
    q, k, v = (
        torch.randn(sum(LENGTHS), width, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        for _ in range(3)
    )
    weights = torch.randn(sum(LENGTHS), width, device="cuda")
    results = []
    for batch in _batches():
        out = block.attention(q, k, v, batch)
        results.append([out, *torch.autograd.grad((out.float() * weights).sum(), [q, k, v])])
    for got, want in zip(*results):
        scale = want.float().abs().max()
        torch.testing.assert_close(got.float() / scale, want.float() / scale, **BF16_TOLERANCE)


@pytest.mark.parametrize("width, ffn_multiple", [(16, 4), (512, 0)])
def test_jagged_model_equals_bucketed_with_every_gradient(width, ffn_multiple):
    torch.manual_seed(0)
    model = HSTUModel(width, 2, ffn_multiple).to("cuda", torch.bfloat16)
    x = torch.randn(sum(LENGTHS), width, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    weights = torch.randn(sum(LENGTHS), width, device="cuda")
    results = []
    for batch in _batches():
        out = model(x, batch)
        grads = torch.autograd.grad((out.float() * weights).sum(), [x, *model.parameters()])
        results.append([out, *grads])
    for got, want in zip(*results):
        assert (got.float() - want.float()).norm() <= BF16_NORM_TOLERANCE * want.float().norm()
