// CUDA dispatch of torch.ops.embnb.feistel_slots: checks, allocates with
// torch, calls the launcher in feistel_cuda.cu. Uses only device-generic c10
// APIs (no CUDA headers), as bucketize_cuda.cpp.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/library.h>

#include "feistel_cuda.h"
#include "feistel_op.h"

namespace embnb {
namespace {

at::Tensor feistel_slots_cuda(const at::Tensor& ids, int64_t num_embeddings, int64_t world_size,
                              int64_t half_bits, const at::Tensor& keys) {
  const FeistelTable table = feistel_table(ids, num_embeddings, world_size, half_bits, keys);
  // The kernel runs in this scope and its errors are thrown after it, with no device guard alive
  // (as bucketize_cuda.cpp, which says why).
  CudaFeistelStatus status{};
  at::Tensor slots;
  {
    const c10::DeviceGuard guard(ids.device());
    const at::Tensor ids_c = ids.contiguous();
    slots = at::empty({ids_c.numel()}, ids_c.options());
    at::Tensor scratch = at::empty({1}, ids_c.options());
    void* stream = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)
                       ->getStream(ids.device())
                       .native_handle();
    status = cuda_feistel_slots(ids_c.data_ptr<int64_t>(), ids_c.numel(), table,
                                slots.data_ptr<int64_t>(), scratch.data_ptr(), stream);
  }
  EMBNB_CHECK(status.message == nullptr, "embnb feistel_slots CUDA kernel failed: ", status.message);
  EMBNB_CHECK_VALUE(status.bad_index < 0, "feistel_slots: id ", status.bad_id, " is outside [0, ",
                    num_embeddings, ")");
  return slots;
}

}  // namespace
}  // namespace embnb

TORCH_LIBRARY_IMPL(embnb, CUDA, m) { m.impl("feistel_slots", &embnb::feistel_slots_cuda); }
