// The feistel_roundrobin slot of an id, shared by the CPU (feistel.cpp) and
// CUDA (feistel_cuda.cu) kernels of torch.ops.embnb.feistel_slots, so both
// compute it with the same code, the network bucketize's feistel_roundrobin
// routing runs (bucketize_common.h). Needs only <cstdint>: nvcc compiles it
// without torch.
#pragma once

#include <cstdint>

#include "bucketize_common.h"

namespace embnb {

// The storage slot of `id` (in [0, size): the callers check): the
// permutation, cycle-walked into range, then round-robin over the ranks.
EMBNB_HD int64_t feistel_slot(uint64_t id, const FeistelTable& t) {
  const uint64_t p = feistel_permute(id, t);
  return static_cast<int64_t>((p % t.world) * t.block + p / t.world);
}

}  // namespace embnb
