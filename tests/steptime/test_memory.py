"""Peak activation memory per rank: at least what autograd saves for
backward (counted by saved-tensor hooks, another mechanism than the
profiler), growing with the rank's tokens, nothing written to stderr."""

import torch

from embnb.steptime.kernels import SequenceDense
from embnb.steptime.memory import peak_memory_partition, peak_step_bytes

WIDTH, HIDDEN = 16, (32,)


def _saved_bytes(lengths):
    torch.manual_seed(0)
    dense = SequenceDense(WIDTH, HIDDEN)
    tokens = torch.randn(sum(lengths), WIDTH, requires_grad=True)
    seen, total = set(), 0

    def pack(tensor):
        nonlocal total
        key = (tensor.untyped_storage().data_ptr(), tensor.untyped_storage().nbytes())
        if key not in seen and tensor.data_ptr() != tokens.data_ptr():
            seen.add(key)
            total += key[1]
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        dense(tokens, lengths)
    return total


def test_peak_is_at_least_what_autograd_saves_and_grows_with_tokens(capfd):
    peaks = peak_memory_partition([[64], [64, 64], [64] * 4, [256]], WIDTH, HIDDEN)
    assert capfd.readouterr().err == ""  # the profiler's own lines are caught
    for lengths, peak in zip([[64], [64, 64], [64] * 4, [256]], peaks):
        saved = _saved_bytes(lengths)
        assert saved > 0 and peak >= saved
        # parameters' gradients and the transient buffers stay within a few times the saved activations
        assert peak < 20 * saved + 200_000
    assert peaks[0] < peaks[1] < peaks[2]
    assert peak_step_bytes([64] * 4, WIDTH, HIDDEN) == peaks[2]  # the same step, the same allocations
