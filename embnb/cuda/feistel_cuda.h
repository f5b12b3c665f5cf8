// The CUDA feistel_slots launcher, as feistel_cuda.cu exports it: raw device
// pointers and an opaque stream, no torch and no CUDA headers (as
// bucketize_cuda.h), so the binding (feistel_cuda.cpp) compiles with a plain
// C++ compiler.
#pragma once

#include <cstdint>

#include "feistel_common.h"

namespace embnb {

struct CudaFeistelStatus {
  int64_t bad_index;    // the first id outside [0, size), or -1
  int64_t bad_id;       // that id (copied here, so the binding's error path calls no torch op)
  const char* message;  // a CUDA runtime error, or nullptr
};

// slots[i] = feistel_slot(ids[i]) for n int64 ids on the device; `scratch` is 8 bytes of device
// memory. Runs on `stream` (a cudaStream_t) and waits for it, to report a bad id.
CudaFeistelStatus cuda_feistel_slots(const int64_t* ids, int64_t n, const FeistelTable& table,
                                     int64_t* slots, void* scratch, void* stream);

}  // namespace embnb
