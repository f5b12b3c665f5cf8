// CUDA kernel of torch.ops.embnb.feistel_slots: one thread per id, the same
// code as the CPU kernel (feistel_common.h). Needs only the CUDA runtime:
// `nvcc -arch=sm_90 -c` builds it.
#include <cuda_runtime.h>

#include "feistel_cuda.h"

namespace embnb {
namespace {

constexpr int kThreads = 256;
constexpr unsigned long long kNone = ~0ull;

__global__ void feistel_slots_kernel(const int64_t* ids, int64_t n, FeistelTable table, int64_t* slots,
                                     unsigned long long* bad) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const int64_t id = ids[i];
  if (id < 0 || static_cast<uint64_t>(id) >= table.size) {  // walking from it might never end
    atomicMin(bad, static_cast<unsigned long long>(i));
    return;
  }
  slots[i] = feistel_slot(static_cast<uint64_t>(id), table);
}

}  // namespace

CudaFeistelStatus cuda_feistel_slots(const int64_t* ids, int64_t n, const FeistelTable& table,
                                     int64_t* slots, void* scratch, void* stream) {
  auto s = static_cast<cudaStream_t>(stream);
  auto* bad = static_cast<unsigned long long*>(scratch);
  auto failed = [](cudaError_t e) { return CudaFeistelStatus{-1, 0, cudaGetErrorString(e)}; };
  cudaError_t e = cudaMemsetAsync(bad, 0xFF, sizeof(unsigned long long), s);  // kNone
  if (e != cudaSuccess) return failed(e);
  if (n > 0) {
    const int64_t blocks = (n + kThreads - 1) / kThreads;
    feistel_slots_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, s>>>(ids, n, table, slots, bad);
    e = cudaGetLastError();
    if (e != cudaSuccess) return failed(e);
  }
  unsigned long long first = kNone;  // one wait per call: a bad id must raise, not return garbage
  e = cudaMemcpyAsync(&first, bad, sizeof first, cudaMemcpyDeviceToHost, s);
  if (e == cudaSuccess) e = cudaStreamSynchronize(s);
  if (e != cudaSuccess) return failed(e);
  if (first == kNone) return CudaFeistelStatus{-1, 0, nullptr};
  int64_t id = 0;
  e = cudaMemcpy(&id, ids + first, sizeof id, cudaMemcpyDeviceToHost);  // the stream has finished
  if (e != cudaSuccess) return failed(e);
  return CudaFeistelStatus{static_cast<int64_t>(first), id, nullptr};
}

}  // namespace embnb
