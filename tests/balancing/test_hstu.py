"""embnb.balancing.hstu and `python -m embnb.bench hstu`: the bucketed block against a per-sample
reference written with plain matmuls, causality, the FLOP formula against torch's FLOP counter, the
attention option's choice, the jagged path's shapes and gradients on the meta device (its numbers:
tests/cuda/test_hstu.py), and the bench's JSON at tiny sizes on CPU (no timed assertion)."""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from embnb.balancing.hstu import (
    HSTUBlock,
    HSTUModel,
    attention_kind,
    bucket_by_length,
    head_layout,
    hstu_flops,
    jagged_by_length,
)
from embnb.bench import hstu as bench

LENGTHS = [5, 1, 17, 3, 33, 8, 16, 2]


def _reference_block(block: HSTUBlock, x: torch.Tensor) -> torch.Tensor:
    """One sample [L, d] through the block's weights, attention as softmax(Q K^T / sqrt(h) + causal)."""
    u, v, q, k = F.silu(block.uvqk(block.norm_in(x))).chunk(4, dim=-1)
    length, heads, size = x.shape[0], block.heads, block.head_dim
    q, k, v = (t.view(length, heads, size).transpose(0, 1) for t in (q, k, v))
    scores = q @ k.transpose(1, 2) / math.sqrt(size)
    future = torch.ones(length, length, dtype=torch.bool).triu(1)
    attended = (scores.masked_fill(future, float("-inf")).softmax(-1) @ v).transpose(0, 1).reshape(length, -1)
    x = x + block.out(block.norm_attention(attended) * u)
    return x + block.ffn(x) if block.ffn is not None else x


@pytest.mark.parametrize("width, ffn_multiple", [(16, 4), (512, 0)])  # one head of 16; two heads of 256
def test_bucketed_padded_batches_equal_each_sample_run_alone(width, ffn_multiple):
    torch.manual_seed(0)
    model = HSTUModel(width, 2, ffn_multiple).double()
    x = torch.randn(sum(LENGTHS), width, dtype=torch.float64, requires_grad=True)
    out = model(x, bucket_by_length(LENGTHS))
    expected, start = [], 0
    for n in LENGTHS:
        y = x[start : start + n]
        for block in model:
            y = _reference_block(block, y)
        expected.append(y)
        start += n
    expected = torch.cat(expected)
    torch.testing.assert_close(out, expected)
    weights = torch.randn_like(out)
    grads = torch.autograd.grad((out * weights).sum(), [x, *model.parameters()])
    reference = torch.autograd.grad((expected * weights).sum(), [x, *model.parameters()])
    for got, want in zip(grads, reference):
        torch.testing.assert_close(got, want)


def test_a_token_changes_only_later_tokens_of_its_own_sample():
    torch.manual_seed(1)
    model = HSTUModel(32, 2).double()
    x = torch.randn(sum(LENGTHS), 32, dtype=torch.float64)
    buckets = bucket_by_length(LENGTHS)
    before = model(x, buckets)
    start = sum(LENGTHS[:4])  # sample 4, 33 tokens: change its token 10
    changed = x.clone()
    changed[start + 10] += 1.0
    after = model(changed, buckets)
    moved = (after - before).abs().amax(dim=1) > 0
    expected = torch.zeros(len(moved), dtype=torch.bool)
    expected[start + 10 : start + LENGTHS[4]] = True
    assert torch.equal(moved, expected)


def test_buckets_pad_each_sample_to_less_than_twice_its_length_and_restore_the_order():
    lengths = [1, 2, 3, 4, 5, 9, 16, 17, 100, 64, 65]
    buckets = bucket_by_length(lengths)
    starts = torch.tensor([0, *lengths]).cumsum(0)
    for index, keep, (samples, longest) in zip(buckets.gather, buckets.keep, buckets.shapes):
        assert index.numel() == samples * longest
        assert torch.equal(index[keep], index[index < buckets.num_tokens])
        rows = index.view(samples, longest)
        for row in rows:
            real = row[row < buckets.num_tokens]
            sample = int(torch.searchsorted(starts, real[0], right=True)) - 1
            assert real.tolist() == list(range(starts[sample], starts[sample + 1]))  # whole, in order, first
            assert longest < 2 * lengths[sample]
    padded_tokens = torch.arange(buckets.num_tokens + 1).float()
    real_rows = torch.cat([padded_tokens[i][k] for i, k in zip(buckets.gather, buckets.keep)])
    assert torch.equal(real_rows[buckets.restore], torch.arange(buckets.num_tokens).float())
    assert sum(s for s, _ in buckets.shapes) == len(lengths)


@pytest.mark.parametrize("width, ffn_multiple, heads", [(64, 4, 1), (512, 4, 2), (256, 0, 1)])
def test_the_flop_formula_matches_torchs_flop_counter(width, ffn_multiple, heads):
    assert head_layout(width)[0] == heads
    model = HSTUModel(width, 3, ffn_multiple)
    counted = 0
    for n in LENGTHS:  # one sample at a time: no padding in what the counter sees
        # the math backend: attention as matmuls over the full score matrix, which the counter sees
        with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
            model(torch.randn(n, width), bucket_by_length([n]))
        counted += counter.get_total_flops()
    assert float(hstu_flops(LENGTHS, width, 3, ffn_multiple, causal=False).sum()) == counted
    # causal: half the score matrix
    full, causal = (hstu_flops([4096], width, 1, ffn_multiple, causal=c).item() for c in (False, True))
    assert full - causal == 2 * 4096 * 4096 * width


def test_bad_input_is_refused_naming_the_value():
    with pytest.raises(ValueError, match="multiple of it, got 384"):
        head_layout(384)
    with pytest.raises(ValueError, match=r"lengths\[1\] = -3"):
        hstu_flops([2, -3], 64)
    with pytest.raises(ValueError, match="lengths is empty"):
        bucket_by_length([])
    with pytest.raises(ValueError, match=r"lengths\[0\]"):
        bucket_by_length([0, 3])
    with pytest.raises(ValueError, match=r"lengths\[1\]"):
        jagged_by_length([2, 0])


def test_auto_attention_is_jagged_on_cuda_only_and_jagged_elsewhere_is_refused_naming_the_device():
    assert [attention_kind(a, "cpu") for a in ("auto", "bucketed")] == ["bucketed", "bucketed"]
    # a device name, not a GPU: the choice needs none
    assert [attention_kind(a, "cuda:0") for a in ("auto", "jagged", "bucketed")] == [
        "jagged",
        "jagged",
        "bucketed",
    ]
    with pytest.raises(ValueError, match="needs a CUDA device .*; on cpu use 'bucketed' or 'auto'"):
        attention_kind("jagged", "cpu")
    with pytest.raises(ValueError, match="attention 'flash' is not one of 'bucketed', 'jagged', 'auto'"):
        attention_kind("flash", "cuda")


def test_jagged_batch_offsets_and_the_jagged_path_reaches_every_weight_on_the_meta_device():
    batch = jagged_by_length(LENGTHS)
    assert batch.offsets.dtype == torch.int32 and batch.longest == 33
    assert batch.offsets.tolist() == [0, *torch.tensor(LENGTHS).cumsum(0).tolist()]
    # shapes and autograd only: varlen_attn's fake kernel (the numbers need CUDA: tests/cuda/test_hstu.py)
    model = HSTUModel(512, 2).to("meta", torch.bfloat16)
    x = torch.randn(sum(LENGTHS), 512, device="meta", dtype=torch.bfloat16, requires_grad=True)
    out = model(x, batch.to("meta"))
    assert out.shape == x.shape and out.dtype == torch.bfloat16
    out.float().square().mean().backward()
    assert x.grad.shape == x.shape and all(p.grad.shape == p.shape for p in model.parameters())


def test_the_bench_writes_every_method_at_every_size_and_its_numbers_add_up(tmp_path, capsys):
    # a fixed share up to 100% passes the acceptance check, so every size is compared
    # (tests/test_bench_acceptance.py checks the sweep at the 10%)
    argv = ["--world-sizes", "2", "--sweep-widths", "16", "32", "--sweep-world-size", "2", "--repeats", "2"]
    argv += ["--max-fixed-share", "1"]
    assert bench.main([*argv, "--device", "cpu", "--out", str(tmp_path)]) == 0
    (path,) = tmp_path.glob("hstu-*.json")
    payload = json.loads(path.read_text())
    assert payload["device"] == "cpu" and payload["dtype"] == "float32" and payload["cut_by_deadline"] == []
    assert payload["config"]["attention"] == "bucketed"  # "auto" on a CPU
    assert [(w["world_size"], w["width"]) for w in payload["worlds"]] == [(2, 64), (2, 16), (2, 32)]
    for world in payload["worlds"]:
        runs = {r["method"]: r for r in world["runs"]}
        assert list(runs) == list(bench.METHODS)
        lengths_total = sum(runs["contiguous"]["rank_tokens"])
        total_flops = sum(runs["contiguous"]["rank_flops"])
        for run in runs.values():
            assert len(run["rank_ms_median"]) == len(run["rank_flops"]) == world["world_size"]
            assert sum(run["rank_tokens"]) == lengths_total  # the same samples, split differently
            assert sum(run["rank_flops"]) == pytest.approx(total_flops)
            ratios = [c / s for c, s in zip(runs["contiguous"]["step_ms"], run["step_ms"])]
            assert run["speedup_vs_cut"]["low"] == pytest.approx(min(ratios))
            cut_max = max(runs["contiguous"]["rank_flops"])
            assert run["flop_model_speedup"] == pytest.approx(cut_max / max(run["rank_flops"]))
            # no partition into equal counts beats the bound
            assert run["flop_model_speedup"] <= world["bound_speedup"] * (1 + 1e-9)
    assert "KK + swaps shortens the step" in capsys.readouterr().out


def test_the_bench_past_its_deadline_records_what_it_cut(tmp_path):
    argv = ["--world-sizes", "2", "--sweep-widths", "16", "--sweep-world-size", "2", "--deadline-s", "1e-9"]
    assert bench.main([*argv, "--device", "cpu", "--out", str(tmp_path)]) == 0
    (path,) = tmp_path.glob("hstu-*.json")
    payload = json.loads(path.read_text())
    assert payload["worlds"] == [] and payload["cut_by_deadline"] == [
        {"world_size": 2, "width": 64},
        {"world_size": 2, "width": 16},
    ]


def test_first_width_shortened_needs_every_wider_width_shortened_too():
    def world(width, low):
        return {"width": width, "runs": [{"method": "kk_swap", "speedup_vs_cut": {"low": low}}]}

    assert bench.first_width_shortened([world(32, 1.2), world(64, 0.9), world(128, 1.1)]) == 128
    assert bench.first_width_shortened([world(32, 1.01), world(64, 1.5)]) == 32
    assert bench.first_width_shortened([world(32, 1.2), world(64, 1.0)]) is None


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--width", "384"], "multiple of it, got 384"),
        (["--world-sizes", "0"], "--world-sizes must be >= 1"),
        (["--attention", "jagged"], "--attention: attention='jagged' needs a CUDA device"),
    ],
)
def test_the_bench_refuses_bad_sizes(argv, message, capsys):
    with pytest.raises(SystemExit):
        bench._options(argv)
    assert message in capsys.readouterr().err


def test_docs_balancing_states_the_committed_cpu_runs_numbers():
    """docs/balancing.md's CPU sentences, recomputed from the committed results file."""
    import pathlib

    root = pathlib.Path(__file__).resolve().parents[2]
    (path,) = (root / "benchmarks" / "results").glob("hstu-*-x86-64-x2-cores.json")
    payload = json.loads(path.read_text())
    text = " ".join((root / "docs" / "balancing.md").read_text().split())
    assert (
        "hstu-*-x86-64-x2-cores.json" in text
        and payload["device"] == "cpu"
        and payload["cut_by_deadline"] == []
    )
    runs = {(w["world_size"], w["width"], r["method"]): r for w in payload["worlds"] for r in w["runs"]}

    def ratio(key):
        s = runs[key]["speedup_vs_cut"]
        return f"{s['median']:.2f}x ({s['low']:.2f}x-{s['high']:.2f}x"

    for key in [(8, 128, "kk_swap"), (16, 128, "kk_swap"), (8, 32, "kk_swap"), (8, 256, "kk_swap")]:
        assert ratio(key) in text, key
    for w in (8, 16):
        assert f"{runs[(w, 128, 'kk_swap')]['flop_model_speedup']:.2f}x" in text
    # shortened at every size: the slowest repeat of KK + swaps beats the cut
    assert all(r["speedup_vs_cut"]["low"] > 1 for k, r in runs.items() if k[2] == "kk_swap")
    others = [r for k, r in runs.items() if k[2] in ("greedy_lpt", "karmarkar_karp")]
    medians = [r["speedup_vs_cut"]["median"] for r in others]
    assert f"medians of {min(medians):.2f}x-{max(medians):.2f}x" in text
    for (w, width, m), r in runs.items():
        if m in ("greedy_lpt", "karmarkar_karp"):
            swap = runs[(w, width, "kk_swap")]["speedup_vs_cut"]
            assert r["speedup_vs_cut"]["low"] <= swap["high"] and swap["low"] <= r["speedup_vs_cut"]["high"]
    assert payload["first_width_shortened"] == 32 == min(w for _, w, _ in runs)
