// torch.ops.embnb.feistel_slots' argument checks, shared by the CPU
// (feistel.cpp) and CUDA (feistel_cuda.cpp) bindings.
#pragma once

#include <ATen/core/Tensor.h>

#include "checks.h"
#include "feistel_common.h"

namespace embnb {

// The table's shape and round keys, checked; `ids` checked for dtype and shape (its values are
// checked where they are read: on the host for CPU ids, by the kernel for CUDA ids).
inline FeistelTable feistel_table(const at::Tensor& ids, int64_t num_embeddings, int64_t world_size,
                                  int64_t half_bits, const at::Tensor& keys) {
  EMBNB_CHECK_VALUE(ids.scalar_type() == at::kLong && ids.dim() == 1,
                    "feistel_slots: ids must be a 1-D int64 tensor, got ", ids.sizes(), " ",
                    ids.scalar_type());
  EMBNB_CHECK_VALUE(keys.scalar_type() == at::kLong && keys.dim() == 1 && keys.device().is_cpu() &&
                        keys.numel() >= 1 && keys.numel() <= kMaxFeistelRounds,
                    "feistel_slots: keys must be a 1-D int64 CPU tensor of 1 to ", kMaxFeistelRounds,
                    " round keys");
  EMBNB_CHECK_VALUE(num_embeddings >= 1 && world_size >= 1, "feistel_slots: num_embeddings ",
                    num_embeddings, " and world_size ", world_size, " must be >= 1");
  EMBNB_CHECK_VALUE(half_bits >= 1 && half_bits <= 31 &&
                        (int64_t{1} << (2 * half_bits)) >= num_embeddings,
                    "feistel_slots: half_bits ", half_bits,
                    " must be in [1, 31] with 4 ** half_bits >= ", num_embeddings);
  FeistelTable table{};
  const at::Tensor keys_c = keys.contiguous();
  for (int64_t r = 0; r < keys_c.numel(); ++r) table.keys[r] = keys_c.data_ptr<int64_t>()[r];
  table.rounds = keys_c.numel();
  table.half_bits = half_bits;
  table.size = static_cast<uint64_t>(num_embeddings);
  table.world = static_cast<uint64_t>(world_size);
  table.block = (table.size + table.world - 1) / table.world;
  return table;
}

}  // namespace embnb
