// The CUDA bucketize launcher, as bucketize_cuda.cu exports it: raw device
// pointers and an opaque stream, no torch and no CUDA headers, so the .cu
// compiles with nvcc alone (CI without CUDA torch) and the torch binding
// (bucketize_cuda.cpp) compiles with a plain C++ compiler.
#pragma once

#include <cstddef>
#include <cstdint>

#include "bucketize_common.h"

namespace embnb {

struct CudaBucketizeArgs {
  const void* lengths;  // [num_segments], int32 or int64, device
  bool lengths_int64;
  int64_t num_segments;
  const void* indices;  // [num_keys], int32 or int64, device
  bool indices_int64;
  int64_t num_keys;
  int64_t world_size;
  int64_t num_features;
  const FeatureRoute* routes;  // [num_features], host memory
  void* new_lengths;           // [world_size * num_segments], lengths' dtype
  void* new_indices;           // [num_keys], indices' dtype
  void* permute;               // [num_keys], indices' dtype
};

enum CudaBucketizeCode : int32_t {
  kCudaOk = 0,
  kCudaNegativeLength = 1,  // position: segment, value: its length
  kCudaLengthSum = 2,       // value: the sum of lengths
  kCudaBadKey = 3,          // position: key index, value: the key (not key_in_range)
  kCudaRuntimeError = 4,    // message: cudaGetErrorString
};

struct CudaBucketizeStatus {
  int32_t code;
  int64_t position;
  int64_t value;
  const char* message;
};

// Device scratch the launcher needs (offsets, per-tile counts, scan space).
size_t cuda_bucketize_workspace_bytes(const CudaBucketizeArgs& args);

// Runs on `stream` (a cudaStream_t) and waits for it, to report bad input.
CudaBucketizeStatus cuda_bucketize(const CudaBucketizeArgs& args, void* workspace,
                                   size_t workspace_bytes, void* stream);

}  // namespace embnb
