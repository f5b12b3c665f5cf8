// torch.ops.embnb.feistel_slots: the storage slot of each id of a
// `feistel_roundrobin` table (embnb.rowwise.layout): a keyed 4-round Feistel
// bijection p of [0, N) (cycle-walked into range), then round-robin over W
// ranks, slot = (p % W) * block + p / W. The native twin of
// TableLayout.slots, bit for bit: the routed sharder renumbers every id of
// every batch with it, where the torch version's dozens of small ops cost
// milliseconds per batch. The CUDA kernel is feistel_cuda.cu.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include "feistel_op.h"

#include <cstdint>

namespace embnb {
namespace {

at::Tensor feistel_slots_cpu(const at::Tensor& ids, int64_t num_embeddings, int64_t world_size,
                             int64_t half_bits, const at::Tensor& keys) {
  const FeistelTable table = feistel_table(ids, num_embeddings, world_size, half_bits, keys);
  const at::Tensor ids_c = ids.contiguous();
  const int64_t n = ids_c.numel();
  const int64_t* in = ids_c.data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i) {  // checked first: a bad id changes no output
    EMBNB_CHECK_VALUE(in[i] >= 0 && in[i] < num_embeddings, "feistel_slots: id ", in[i],
                      " is outside [0, ", num_embeddings, ")");
  }
  at::Tensor out = at::empty({n}, ids_c.options());
  int64_t* slot = out.data_ptr<int64_t>();
  at::parallel_for(0, n, 4096, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) slot[i] = feistel_slot(static_cast<uint64_t>(in[i]), table);
  });
  return out;
}

}  // namespace
}  // namespace embnb

// Each source registers its own ops with TORCH_LIBRARY_FRAGMENT (see loader.py).
TORCH_LIBRARY_FRAGMENT(embnb, m) {
  m.def("feistel_slots(Tensor ids, int num_embeddings, int world_size, int half_bits, Tensor keys) -> Tensor");
}

TORCH_LIBRARY_IMPL(embnb, CPU, m) { m.impl("feistel_slots", &embnb::feistel_slots_cpu); }
