"""FBGEMM's CUDA table-batched embeddings, as embnb.steptime builds them,
against FBGEMM's CPU kernels: the forward output, and the tables after one
backward with the optimizer fused in (or SGD after backward, the dense
kernel). Runs where a GPU and the fbgemm-gpu CUDA build are there (the GPU
kit brings a slimmed copy, scripts/fbgemm_cuda.py)."""

from __future__ import annotations

import pytest
import torch

from embnb.steptime.kernels import lookup_module
from embnb.steptime.work import LookupGroup, Shard

pytestmark = pytest.mark.cuda


def _group(kernel: str, generator: torch.Generator) -> LookupGroup:
    # Three shards of unequal widths, one of them read by two features (a shared table).
    widths, rows = [16, 64, 128], [500, 2000, 50]
    shards = [
        Shard(f"t{i}", "table_wise", kernel, 0, 0, r, 0, c, (f"f{i}",))
        for i, (r, c) in enumerate(zip(rows, widths))
    ]
    feature_shard = [0, 1, 1, 2]
    batch = 32
    lengths = torch.randint(0, 12, (len(feature_shard) * batch,), generator=generator)
    ids = torch.cat(
        [
            torch.randint(0, rows[s], (int(n),), generator=generator)
            for s, bag_lengths in zip(feature_shard, lengths.view(len(feature_shard), batch))
            for n in [bag_lengths.sum()]
        ]
    )
    return LookupGroup("table_wise", kernel, shards, feature_shard, batch, lengths, ids)


def _tables(module: torch.nn.Module) -> list[torch.Tensor]:
    return list(getattr(module, "tbe", module).split_embedding_weights())


def _flat(tables: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat([t.detach().flatten().cpu() for t in tables])


@pytest.mark.parametrize(
    "kernel, optimizer", [("fused", "exact_sgd"), ("fused", "exact_row_wise_adagrad"), ("dense", "exact_sgd")]
)
def test_cuda_tbe_matches_the_cpu_tbe(kernel, optimizer):
    group = _group(kernel, torch.Generator().manual_seed(7))
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), group.lengths.cumsum(0)])
    start, outputs, tables = None, {}, {}
    for device in ("cpu", "cuda"):
        module = lookup_module(group, device, optimizer=optimizer, learning_rate=0.05)
        if start is None:
            start = [t.detach().clone() for t in _tables(module)]
        with torch.no_grad():  # the same tables on both devices
            for table, initial in zip(_tables(module), start):
                table.copy_(initial.to(table.device))
        out = module(group.ids.to(device), offsets.to(device))
        out.backward(torch.linspace(-1, 1, out.numel(), device=device).view_as(out))
        if kernel == "dense":
            module.step()
        outputs[device], tables[device] = out.detach().cpu(), _flat(_tables(module))
    assert outputs["cuda"].shape == (group.batch_size, group.pooled_dim)
    torch.testing.assert_close(outputs["cuda"], outputs["cpu"], rtol=1e-5, atol=1e-5)
    assert not torch.equal(tables["cpu"], _flat(start))  # the step changed the tables
    torch.testing.assert_close(tables["cuda"], tables["cpu"], rtol=1e-5, atol=1e-5)
