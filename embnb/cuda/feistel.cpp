// torch.ops.embnb.feistel_slots: the storage slot of each id of a
// `feistel_roundrobin` table (embnb.rowwise.layout): a keyed 4-round Feistel
// bijection p of [0, N) (cycle-walked into range), then round-robin over W
// ranks, slot = (p % W) * block + p / W. The native twin of
// TableLayout.slots, bit for bit: the routed sharder renumbers every id of
// every batch with it, where the torch version's dozens of small ops cost
// milliseconds per batch.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include "bucketize_common.h"
#include "checks.h"

#include <cstdint>

namespace embnb {
namespace {

// One pass of the network over [0, 4 ** half_bits): as layout._feistel,
// with int64 wrap-around read as uint64 (the same bits).
uint64_t feistel_once(uint64_t x, int64_t half_bits, const int64_t* keys, int64_t rounds) {
  const uint64_t mask = (uint64_t{1} << half_bits) - 1;
  uint64_t left = x >> half_bits, right = x & mask;
  for (int64_t r = 0; r < rounds; ++r) {
    const uint64_t mixed = left ^ (fmix64(right + static_cast<uint64_t>(keys[r])) & mask);
    left = right;
    right = mixed;
  }
  return (left << half_bits) | right;
}

at::Tensor feistel_slots_cpu(const at::Tensor& ids, int64_t num_embeddings, int64_t world_size,
                             int64_t half_bits, const at::Tensor& keys) {
  EMBNB_CHECK_VALUE(ids.scalar_type() == at::kLong && ids.dim() == 1,
                   "feistel_slots: ids must be a 1-D int64 tensor, got ", ids.sizes(), " ",
                   ids.scalar_type());
  EMBNB_CHECK_VALUE(keys.scalar_type() == at::kLong && keys.dim() == 1 && keys.device().is_cpu(),
                   "feistel_slots: keys must be a 1-D int64 CPU tensor");
  EMBNB_CHECK_VALUE(num_embeddings >= 1 && world_size >= 1, "feistel_slots: num_embeddings ",
                    num_embeddings, " and world_size ", world_size, " must be >= 1");
  EMBNB_CHECK_VALUE(half_bits >= 1 && half_bits <= 31 &&
                        (int64_t{1} << (2 * half_bits)) >= num_embeddings,
                    "feistel_slots: half_bits ", half_bits, " must be in [1, 31] with 4 ** half_bits >= ",
                    num_embeddings);
  const at::Tensor ids_c = ids.contiguous();
  const at::Tensor keys_c = keys.contiguous();
  const int64_t n = ids_c.numel();
  const int64_t* in = ids_c.data_ptr<int64_t>();
  const int64_t* key = keys_c.data_ptr<int64_t>();
  const int64_t rounds = keys_c.numel();
  for (int64_t i = 0; i < n; ++i) {  // checked first: a bad id changes no output
    EMBNB_CHECK_VALUE(in[i] >= 0 && in[i] < num_embeddings, "feistel_slots: id ", in[i],
                      " is outside [0, ", num_embeddings, ")");
  }
  at::Tensor out = at::empty({n}, ids_c.options());
  int64_t* slot = out.data_ptr<int64_t>();
  const uint64_t size = static_cast<uint64_t>(num_embeddings);
  const uint64_t world = static_cast<uint64_t>(world_size);
  const uint64_t block = (size + world - 1) / world;
  at::parallel_for(0, n, 4096, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      uint64_t p = feistel_once(static_cast<uint64_t>(in[i]), half_bits, key, rounds);
      while (p >= size) p = feistel_once(p, half_bits, key, rounds);  // cycle walking
      slot[i] = static_cast<int64_t>((p % world) * block + p / world);
    }
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
