// CUDA dispatch of torch.ops.embnb.bucketize: allocates outputs and scratch
// with torch, calls the launcher in bucketize_cuda.cu. Uses only device-
// generic c10 APIs (no CUDA headers), so it compiles on any machine.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/library.h>

#include "checks.h"

#include "bucketize.h"
#include "bucketize_cuda.h"

namespace embnb {
namespace {

// Feature of key `position`, from the lengths (only on the error path).
int64_t feature_of_key(const at::Tensor& lengths, int64_t position, int64_t batch) {
  const at::Tensor host = lengths.to(at::Device(at::kCPU), at::kLong);
  const int64_t* length = host.data_ptr<int64_t>();
  int64_t end = 0;
  for (int64_t s = 0; s < host.numel(); ++s) {
    end += length[s];
    if (end > position) return s / batch;
  }
  return -1;
}

// The signature of bucketize_cpu: both implement torch.ops.embnb.bucketize.
BucketizeResult bucketize_cuda(const at::Tensor& lengths, const at::Tensor& indices,
                               int64_t world_size, c10::IntArrayRef dist_types,
                               c10::IntArrayRef block_sizes,
                               const std::optional<at::Tensor>& weights,
                               const std::optional<at::Tensor>& feistel_keys) {
  const BucketizePlan plan = check_bucketize_args(lengths, indices, world_size, dist_types,
                                                  block_sizes, weights, feistel_keys);
  // The kernels run in this scope and its errors are thrown after it has closed, with no device
  // guard or device tensor alive, as in the CPU bindings: on the lent GPU machines an error thrown
  // from inside it killed the process (checks.h), and the guard's unwinding is one difference.
  CudaBucketizeStatus status{};
  BucketizeResult result;
  {
    const c10::DeviceGuard guard(indices.device());
    const at::Tensor lengths_c = lengths.contiguous();
    const at::Tensor indices_c = indices.contiguous();
    at::Tensor new_lengths = at::empty({plan.world_size * plan.num_segments}, lengths.options());
    at::Tensor new_indices = at::empty({plan.num_keys}, indices.options());
    at::Tensor permute = at::empty({plan.num_keys}, indices.options());

    const CudaBucketizeArgs args{
        lengths_c.data_ptr(), lengths.scalar_type() == at::kLong, plan.num_segments,
        indices_c.data_ptr(), indices.scalar_type() == at::kLong, plan.num_keys,
        plan.world_size,      plan.num_features,                  plan.routes.data(),
        new_lengths.data_ptr(), new_indices.data_ptr(),           permute.data_ptr()};
    const size_t bytes = cuda_bucketize_workspace_bytes(args);
    at::Tensor workspace =
        at::empty({static_cast<int64_t>(bytes)}, indices.options().dtype(at::kByte));
    void* stream = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)
                       ->getStream(indices.device())
                       .native_handle();
    status = cuda_bucketize(args, workspace.data_ptr(), bytes, stream);
    if (status.code == kCudaOk) {
      result = {new_lengths, new_indices, permute, move_weights(weights, permute)};
    }
  }
  switch (status.code) {
    case kCudaOk:
      break;
    case kCudaNegativeLength:
      raise_negative_length(status.value, status.position);
      break;
    case kCudaLengthSum:
      raise_length_sum(status.value, plan.num_keys);
      break;
    case kCudaBadKey: {
      const int64_t feature =
          feature_of_key(lengths, status.position, plan.num_segments / plan.num_features);
      raise_bad_key(status.value, status.position, feature, plan.routes[feature]);
      break;
    }
    default:
      EMBNB_CHECK(false, "embnb bucketize CUDA kernels failed: ", status.message);
  }
  return result;
}

}  // namespace
}  // namespace embnb

TORCH_LIBRARY_IMPL(embnb, CUDA, m) {
  m.impl("bucketize", &embnb::bucketize_cuda);
}
