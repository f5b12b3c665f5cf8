"""embnb.balancing.kjt_alltoall on real gloo ranks: each rank's part, received
in two all-to-alls, equals the all-gather path (`allgather_kjt`, itself
checked against a per-key gather and a batch built by hand, then
`select_samples`), and the bytes it receives are what `exchange_bytes`
computes from sizes alone."""

import random

import pytest
import torch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from embnb.balancing import kjt_alltoall, kjt_gather
from embnb.balancing.partition import balance
from embnb.collectives import all_gather_flat
from embnb.dist import launch
from tests.balancing.test_kjt_gather import OpNamespaces

STRIDE = 5


def make_batch(rank: int, case: str) -> tuple[list[KeyedJaggedTensor], torch.Tensor]:
    """Two KJTs (an int64 two-key history; a weighted one-key KJT with int32
    values and lengths) and two float32 dense columns. "empty": rank 1 has no
    values at all and sample 0 of every rank is empty everywhere."""
    gen = torch.Generator().manual_seed(100 * rank + len(case))
    lengths = torch.randint(0, 5, (2 * STRIDE,), generator=gen)
    user_lengths = torch.randint(0, 3, (STRIDE,), generator=gen, dtype=torch.int32)
    if case == "empty":
        lengths[[0, STRIDE]] = 0
        user_lengths[0] = 0
        if rank == 1:
            lengths.zero_()
    history = KeyedJaggedTensor.from_lengths_sync(
        keys=["item_id", "category_id"],
        values=torch.randint(0, 2**40, (int(lengths.sum()),), generator=gen),
        lengths=lengths,
    )
    num_values = int(user_lengths.sum())
    user = KeyedJaggedTensor.from_lengths_sync(
        keys=["user_tag"],
        values=torch.randint(0, 100, (num_values,), generator=gen, dtype=torch.int32),
        lengths=user_lengths,
        weights=torch.rand(num_values, generator=gen),
    )
    return [history, user], torch.rand(STRIDE, 2, generator=gen)


def make_parts(world_size: int, case: str) -> list[list[int]]:
    """The same on every rank. "kk": balanced equal counts, ascending;
    "shuffled": uneven sizes in random order, part 0 gets nothing from rank 0."""
    total = world_size * STRIDE
    if case != "shuffled":
        return balance([float((i * 7919) % 13) for i in range(total)], world_size)
    order = list(range(STRIDE, total)) + list(range(STRIDE))  # rank 0's samples last
    random.Random(world_size).shuffle(order[: total - STRIDE])
    cuts = sorted(random.Random(1).sample(range(1, total), world_size - 1))
    return [order[a:b] for a, b in zip([0, *cuts], [*cuts, total])]


def plain(kjt):
    return {k: getattr(kjt, k)() for k in ("keys", "stride", "lengths", "values", "weights_or_none")}


def alltoall_on_rank(rank, world_size, cases):
    out = {}
    for case in cases:
        kjts, dense = make_batch(rank, case)
        parts = make_parts(world_size, case)
        stats = {}
        with kjt_gather.count_collectives() as calls, OpNamespaces() as ops:
            got, got_dense = kjt_alltoall.alltoall_kjt(kjts, dense, parts, stats=stats)
        want = [kjt_gather.select_samples(kjt, parts[rank]) for kjt in kjt_gather.allgather_kjt(kjts)]
        want_dense = all_gather_flat(dense).view(-1, dense.shape[1])[parts[rank]]
        out[case] = {
            "got": [plain(k) for k in got],
            "want": [plain(k) for k in want],
            "got_dense": got_dense,
            "want_dense": want_dense,
            "calls": dict(calls),
            "op_namespaces": sorted(ops.seen),
            "received_bytes": stats["received_bytes"],
            "lengths": [k.lengths().to(torch.int64).view(len(k.keys()), -1).t() for k in kjts],
        }
    return out


CASES = ["kk", "shuffled", "empty"]


@pytest.fixture(scope="module", params=[2, 3, 4])
def exchanged(request):
    return request.param, launch(alltoall_on_rank, request.param, CASES, device="cpu", timeout_s=240)


def test_each_rank_receives_exactly_its_part_as_the_all_gather_path_gives_it(exchanged):
    _, per_rank = exchanged
    for rank, cases in enumerate(per_rank):
        for case, r in cases.items():
            for got, want in zip(r["got"], r["want"]):
                assert got["keys"] == want["keys"] and got["stride"] == want["stride"], (rank, case)
                for field in ("lengths", "values", "weights_or_none"):
                    if want[field] is None:
                        assert got[field] is None
                    else:
                        assert got[field].dtype == want[field].dtype, (rank, case, field)
                        assert torch.equal(got[field], want[field]), (rank, case, field)
            assert torch.equal(r["got_dense"], r["want_dense"]), (rank, case)


def test_the_exchange_calls_no_fbgemm_op(exchanged):
    """It runs on any device with plain torch (fbgemm's CPU wheel has no CUDA kernels)."""
    _, per_rank = exchanged
    for result in per_rank:
        for case in CASES:
            assert "aten" in result[case]["op_namespaces"]
            assert "fbgemm" not in result[case]["op_namespaces"]


def test_two_all_to_alls_and_nothing_else(exchanged):
    _, per_rank = exchanged
    for cases in per_rank:
        for r in cases.values():
            assert r["calls"] == {"all_to_all": 2}


def test_received_bytes_are_what_the_part_holds_and_what_exchange_bytes_computes(exchanged):
    world_size, per_rank = exchanged
    for case in CASES:
        measured = []
        for rank, cases in enumerate(per_rank):
            r = cases[case]
            # the part as the all-gather path built it: lengths (8 bytes each), values, weights, dense
            held = sum(
                k["lengths"].numel() * 8
                + k["values"].numel() * k["values"].element_size()
                + (0 if k["weights_or_none"] is None else k["weights_or_none"].numel() * 4)
                for k in r["want"]
            )
            held += r["want_dense"].numel() * r["want_dense"].element_size()
            assert r["received_bytes"] == held, (rank, case)
            measured.append(held)
        lengths = torch.stack([torch.cat(cases[case]["lengths"], dim=1) for cases in per_rank])
        counted = kjt_alltoall.exchange_bytes(lengths, [8, 8, 4 + 4], 2 * 4, make_parts(world_size, case))
        assert counted["alltoall"] == {
            "max": max(measured),
            "mean": pytest.approx(sum(measured) / world_size),
        }


def test_exchange_bytes_by_hand():
    # W=2, B=2, one key of 8-byte values, an 8-byte dense row; rank 0's lengths
    # [3, 0], rank 1's [1, 2]; part 0 = samples 0 and 3, part 1 = samples 1 and 2
    lengths = torch.tensor([[[3], [0]], [[1], [2]]])
    counted = kjt_alltoall.exchange_bytes(lengths, [8], 8, [[0, 3], [1, 2]])
    # a sample's lengths + dense row: 16 bytes. Part 0: 2 x 16 + (3 + 2) x 8 = 72;
    # part 1: 2 x 16 + (0 + 1) x 8 = 40. All-gather: 4 x 16 + 2 x max(24, 24) = 112.
    assert counted == {"allgather": {"max": 112.0, "mean": 112.0}, "alltoall": {"max": 72.0, "mean": 56.0}}


def test_bad_parts_and_shapes_are_named():
    with pytest.raises(ValueError, match=r"exactly once; missing \[3\], repeated \[\], out of range \[\]"):
        kjt_alltoall.owners([[0, 1], [2]], 4)
    with pytest.raises(ValueError, match=r"missing \[\], repeated \[1\], out of range \[\]"):
        kjt_alltoall.owners([[0, 1], [1, 2, 3]], 4)
    with pytest.raises(ValueError, match=r"missing \[0\], repeated \[\], out of range \[9\]"):
        kjt_alltoall.owners([[9, 1], [2, 3]], 4)
    kjts, dense = make_batch(0, "kk")
    with pytest.raises(ValueError, match=r"dense must have one row per sample \(5\), got shape \(4, 2\)"):
        kjt_alltoall.alltoall_kjt(kjts, dense[:4], [[0]])
    with pytest.raises(ValueError, match=r"kjts\[1\] has stride 4, kjts\[0\] has 5"):
        kjt_alltoall.alltoall_kjt([kjts[0], kjt_gather.select_samples(kjts[1], [0, 1, 2, 3])], dense, [[0]])
    with pytest.raises(ValueError, match=r"lengths must be \(ranks, samples, keys\) with 2 keys"):
        kjt_alltoall.exchange_bytes(torch.zeros(2, 2, 3), [8, 8], 8, [[0, 1], [2, 3]])
