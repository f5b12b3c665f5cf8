// The feistel_roundrobin slot of an id, shared by the CPU (feistel.cpp) and
// CUDA (feistel_cuda.cu) kernels of torch.ops.embnb.feistel_slots, so both
// compute it with the same code. Needs only <cstdint> (and fmix64 from
// bucketize_common.h): nvcc compiles it without torch.
#pragma once

#include <cstdint>

#include "bucketize_common.h"

namespace embnb {

constexpr int64_t kMaxFeistelRounds = 8;  // embnb.rowwise.layout uses 4

// The round keys and the table's shape, passed by value to a kernel.
struct FeistelTable {
  int64_t keys[kMaxFeistelRounds];
  int64_t rounds;
  int64_t half_bits;
  uint64_t size;   // num_embeddings
  uint64_t world;  // world_size
  uint64_t block;  // ceil(size / world)
};

// One pass of the network over [0, 4 ** half_bits): as layout._feistel,
// with int64 wrap-around read as uint64 (the same bits).
EMBNB_HD uint64_t feistel_once(uint64_t x, const FeistelTable& t) {
  const uint64_t mask = (uint64_t{1} << t.half_bits) - 1;
  uint64_t left = x >> t.half_bits, right = x & mask;
  for (int64_t r = 0; r < t.rounds; ++r) {
    const uint64_t mixed = left ^ (fmix64(right + static_cast<uint64_t>(t.keys[r])) & mask);
    left = right;
    right = mixed;
  }
  return (left << t.half_bits) | right;
}

// The storage slot of `id` (in [0, size): the callers check): the
// permutation, cycle-walked into range, then round-robin over the ranks.
EMBNB_HD int64_t feistel_slot(uint64_t id, const FeistelTable& t) {
  uint64_t p = feistel_once(id, t);
  while (p >= t.size) p = feistel_once(p, t);  // cycle walking: ends, p's cycle holds id
  return static_cast<int64_t>((p % t.world) * t.block + p / t.world);
}

}  // namespace embnb
