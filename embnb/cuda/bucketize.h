// torch.ops.embnb.bucketize: argument checks shared by the CPU and CUDA
// implementations (defined in bucketize_cpu.cpp, which is always built).
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <vector>

#include "bucketize_common.h"

namespace embnb {

// The op's schema, registered once (TORCH_LIBRARY_FRAGMENT) in
// bucketize_cpu.cpp. dist_types holds DistCode values, one per feature;
// block_sizes one per feature: the block size of a continuous feature, the
// num_embeddings of a feistel_roundrobin one, of a roundrobin one its dense
// table's rows (its owner gets local rows id / W) or 0 (unbounded keys, sent
// as they are), unread for hash_roundrobin.
// feistel_keys: the round keys (1-D int64, CPU) feistel_roundrobin features
// share; required where there is one.
constexpr const char* kBucketizeSchema =
    "bucketize(Tensor lengths, Tensor indices, int world_size, int[] dist_types, "
    "int[] block_sizes, Tensor? weights=None, Tensor? feistel_keys=None) "
    "-> (Tensor, Tensor, Tensor, Tensor?)";

using BucketizeResult = std::tuple<at::Tensor, at::Tensor, at::Tensor, std::optional<at::Tensor>>;

struct BucketizePlan {
  int64_t num_keys;
  int64_t num_segments;  // num_features * batch
  int64_t world_size;
  int64_t num_features;
  std::vector<FeatureRoute> routes;  // one per feature
  Divisor world;
};

// Checks everything that does not need the data (dtypes, shapes, devices,
// codes, block sizes); raises ValueError/TypeError naming the bad value.
BucketizePlan check_bucketize_args(const at::Tensor& lengths, const at::Tensor& indices,
                                   int64_t world_size, c10::IntArrayRef dist_types,
                                   c10::IntArrayRef block_sizes,
                                   const std::optional<at::Tensor>& weights,
                                   const std::optional<at::Tensor>& feistel_keys);

// The errors for bad data, worded as embnb.routing's reference words them.
void raise_negative_length(int64_t length, int64_t position);
void raise_length_sum(int64_t sum, int64_t num_keys);
// A key its feature's route cannot take (key_in_range).
void raise_bad_key(int64_t key, int64_t position, int64_t feature, const FeatureRoute& route);

// Weights moved like the keys: out[permute[i]] = weights[i].
std::optional<at::Tensor> move_weights(const std::optional<at::Tensor>& weights,
                                       const at::Tensor& permute);

}  // namespace embnb
