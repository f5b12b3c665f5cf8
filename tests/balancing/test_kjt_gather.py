"""embnb.balancing.kjt_gather on real gloo ranks: the fused all-gather of a batch's
KeyedJaggedTensors equals the per-key gather and the batch built by hand,
with 2 collectives instead of 2-3 per key."""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from embnb.balancing import kjt_gather
from embnb.dist import launch

WORLD_SIZE = 3
STRIDE = 4


def make_kjts(rank: int) -> list[KeyedJaggedTensor]:
    """A batch of two KJTs: a two-key history (int64, no weights; rank 1 has
    no values at all) and a weighted one-key KJT with int32 values and lengths."""
    gen = torch.Generator().manual_seed(1000 + rank)
    lengths = torch.randint(0, 5, (2 * STRIDE,), generator=gen)
    if rank == 1:
        lengths.zero_()
    history = KeyedJaggedTensor.from_lengths_sync(
        keys=["item_id", "category_id"],
        values=torch.randint(0, 2**40, (int(lengths.sum()),), generator=gen),
        lengths=lengths,
    )
    user_lengths = torch.randint(0, 3, (STRIDE,), generator=gen, dtype=torch.int32)
    num_values = int(user_lengths.sum())
    user = KeyedJaggedTensor.from_lengths_sync(
        keys=["user_tag"],
        values=torch.randint(0, 100, (num_values,), generator=gen, dtype=torch.int32),
        lengths=user_lengths,
        weights=torch.rand(num_values, generator=gen),
    )
    return [history, user]


def as_plain(kjt: KeyedJaggedTensor) -> dict:
    return {
        "keys": kjt.keys(),
        "stride": kjt.stride(),
        "lengths": kjt.lengths(),
        "values": kjt.values(),
        "weights": kjt.weights_or_none(),
    }


class OpNamespaces(TorchDispatchMode):
    """The namespaces of the ops dispatched inside the block (aten, fbgemm, ...)."""

    def __init__(self):
        super().__init__()
        self.seen = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.seen.add(func.namespace)
        return func(*args, **(kwargs or {}))


def gather_on_rank(rank, world_size):
    kjts = make_kjts(rank)
    with OpNamespaces() as ops:
        kjt_gather.select_samples(kjt_gather.allgather_kjt(kjts)[0], [2, 0])
    with kjt_gather.count_collectives() as fused_calls:
        fused = kjt_gather.allgather_kjt(kjts)
    with kjt_gather.count_collectives() as per_key_calls:
        per_key = kjt_gather.allgather_kjt_per_key(kjts)
    return {
        "fused": [as_plain(k) for k in fused],
        "per_key": [as_plain(k) for k in per_key],
        "fused_calls": dict(fused_calls),
        "per_key_calls": dict(per_key_calls),
        "op_namespaces": sorted(ops.seen),
    }


def global_batch_by_hand(j: int) -> dict:
    """KJT j of the global batch: per key, rank 0's samples, rank 1's, ..."""
    batches = [make_kjts(rank)[j] for rank in range(WORLD_SIZE)]
    lengths, values, weights = [], [], []
    for key in batches[0].keys():
        for kjt in batches:
            jagged = kjt[key]
            lengths.append(jagged.lengths())
            values.append(jagged.values())
            if jagged.weights_or_none() is not None:
                weights.append(jagged.weights())
    return {
        "keys": batches[0].keys(),
        "stride": STRIDE * WORLD_SIZE,
        "lengths": torch.cat(lengths),
        "values": torch.cat(values),
        "weights": torch.cat(weights) if weights else None,
    }


def assert_same(got: dict, want: dict):
    assert got["keys"] == want["keys"] and got["stride"] == want["stride"]
    for field in ("lengths", "values", "weights"):
        if want[field] is None:
            assert got[field] is None
        else:
            assert got[field].dtype == want[field].dtype, field
            assert torch.equal(got[field], want[field]), field


@pytest.fixture(scope="module")
def gathered():
    return launch(gather_on_rank, WORLD_SIZE, backend="gloo", timeout_s=180)


def test_fused_gather_equals_the_batch_built_by_hand_on_every_rank(gathered):
    for result in gathered:
        for j in range(2):
            want = global_batch_by_hand(j)
            assert_same(result["fused"][j], want)
            assert_same(result["per_key"][j], want)


def test_fused_gather_makes_two_collectives_instead_of_two_or_three_per_key(gathered):
    for result in gathered:
        assert result["fused_calls"] == {"all_gather": 2}
        # history: 2 keys x (lengths, values); user_tag: lengths, values, weights
        assert result["per_key_calls"] == {"all_gather": 2 * 2 + 3}


def test_gather_and_select_call_no_fbgemm_op(gathered):
    """fbgemm's CPU-only wheel (what the GPU kit carries) has no CUDA kernels:
    the fused gather and select_samples must run on any device with plain torch."""
    for result in gathered:
        assert "aten" in result["op_namespaces"]  # the recorder saw the ops
        assert "fbgemm" not in result["op_namespaces"]


def test_select_samples_matches_a_per_sample_loop():
    (history, user) = make_kjts(0)
    indices = [3, 0, 3, 1]
    for kjt in (history, user):
        picked = kjt_gather.select_samples(kjt, indices)
        assert picked.keys() == kjt.keys() and picked.stride() == len(indices)
        for key in kjt.keys():
            rows = kjt[key].to_dense()
            want = [rows[i] for i in indices]
            got = picked[key].to_dense()
            assert [g.tolist() for g in got] == [w.tolist() for w in want]
            if kjt.weights_or_none() is not None:
                want_w = [kjt[key].to_dense_weights()[i] for i in indices]
                assert [g.tolist() for g in picked[key].to_dense_weights()] == [w.tolist() for w in want_w]
    assert kjt_gather.select_samples(history, []).stride() == 0


def test_bad_input_is_named():
    (history, _) = make_kjts(0)
    with pytest.raises(ValueError, match="kjts is empty"):
        kjt_gather.allgather_kjt([])
    with pytest.raises(TypeError, match="wrap a single one in a list"):
        kjt_gather.allgather_kjt(history)
    with pytest.raises(TypeError, match=r"kjts\[1\] is a Tensor, not a KeyedJaggedTensor"):
        kjt_gather.allgather_kjt_per_key([history, torch.zeros(3)])
    with pytest.raises(ValueError, match="sample index 4 is outside the batch of 4 samples"):
        kjt_gather.select_samples(history, [0, 4])


def test_counting_collectives_prints_no_profiler_lines_but_keeps_other_output(capfd):
    with kjt_gather.count_collectives() as calls:
        torch.ones(3).add_(1)
        print("from the block", flush=True)
    captured = capfd.readouterr()
    assert dict(calls) == {}
    assert "USDT" not in captured.err and "profiler_start" not in captured.err
    assert "from the block" in captured.out


def test_the_stderr_filter_drops_only_the_named_lines(capfd):
    import os

    with kjt_gather._without_stderr_lines("USDT:"):
        os.write(2, b"USDT: profiler_start\na real error\nUSDT: profiler_stop\n")
    assert capfd.readouterr().err == "a real error\n"
