// CUDA kernels of torch.ops.embnb.bucketize. Needs only the CUDA runtime
// and cub (both ship with the toolkit): `nvcc -arch=sm_90 -c` builds it.
//
// Output position of key i is rank_base[owner] + (keys before i with the
// same owner) (see bucketize_cpu.cpp), so the keys are cut into warp tiles
// of kTileKeys consecutive keys whatever the row lengths (parallelism
// inside each row):
//   1. offsets = scan(lengths), checking lengths >= 0 and sum == num_keys;
//   2. count: per (rank, segment) into new_lengths and per (rank, tile),
//      one atomic per distinct value in each 32-key step (__match_any_sync);
//   3. exclusive scan of the (rank, tile) counts, rank-major: each tile's
//      first write position per rank;
//   4. scatter: each warp walks its tile in input order, 32 keys a step;
//      keys of one owner get consecutive slots in lane order, so the order
//      inside each (rank, segment) bucket is the input order.
#include <cub/device/device_scan.cuh>
#include <cuda_runtime.h>

#include "bucketize_cuda.h"

namespace embnb {
namespace {

constexpr int kWarp = 32;
constexpr int kStepsPerTile = 16;
constexpr int64_t kTileKeys = kWarp * kStepsPerTile;
constexpr int kBlockThreads = 256;
constexpr unsigned kFullMask = 0xFFFFFFFFu;
constexpr unsigned long long kNone = ~0ull;

struct DeviceErrors {
  unsigned long long negative_length;  // smallest bad segment, kNone if none
  unsigned long long bad_key;          // smallest index of a key out of range, kNone if none
  long long total;                     // sum of lengths
  int bad_lengths;                     // skip the key kernels
};

__device__ __forceinline__ void add_count(int* p, unsigned n) { atomicAdd(p, static_cast<int>(n)); }
__device__ __forceinline__ void add_count(int64_t* p, unsigned n) {
  atomicAdd(reinterpret_cast<unsigned long long*>(p), static_cast<unsigned long long>(n));
}

template <typename offset_t>
__global__ void widen_lengths(const offset_t* lengths, int64_t num_segments, int64_t* out,
                              DeviceErrors* err) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t s = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; s < num_segments;
       s += stride) {
    const int64_t length = static_cast<int64_t>(lengths[s]);
    if (length < 0) atomicMin(&err->negative_length, static_cast<unsigned long long>(s));
    out[s] = length;
  }
}

__global__ void check_total(const int64_t* offsets, int64_t num_segments, int64_t num_keys,
                            DeviceErrors* err) {
  err->total = offsets[num_segments];
  err->bad_lengths = err->negative_length != kNone || offsets[num_segments] != num_keys;
}

// Largest s < S with offsets[s] <= i, given offsets[lo] <= i < offsets[S]:
// the segment holding key i (empty segments start where the next one does).
// Gallops from lo, the segment of this lane's previous key.
__device__ __forceinline__ int64_t find_segment(const int64_t* offsets, int64_t num_segments,
                                                int64_t i, int64_t lo) {
  int64_t hi = lo + 1;
  int64_t step = 1;
  while (hi < num_segments && offsets[hi] <= i) {
    lo = hi;
    hi = lo + step;
    step *= 2;
  }
  if (hi > num_segments) hi = num_segments;
  while (hi - lo > 1) {  // offsets[lo] <= i < offsets[hi]
    const int64_t mid = lo + (hi - lo) / 2;
    if (offsets[mid] <= i) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  return lo;
}

// One lane's view of its keys: segment, feature route, owner, id sent.
struct Walker {
  const int64_t* offsets;
  int64_t num_segments;
  int64_t batch;
  const FeatureRoute* routes;
  int64_t segment = 0;
  int64_t feature_lo = 0, feature_hi = 0;  // segments of the cached feature
  FeatureRoute route;

  // Routes key i; a key out of its route's range gets owner 0 in both passes
  // (the count pass reports it and the scatter pass does not run).
  __device__ __forceinline__ bool route_key_at(int64_t i, int64_t key, const Divisor& world,
                                               int64_t* owner, int64_t* sent) {
    segment = find_segment(offsets, num_segments, i, segment);
    if (segment < feature_lo || segment >= feature_hi) {
      const int64_t f = segment / batch;
      feature_lo = f * batch;
      feature_hi = feature_lo + batch;
      route = routes[f];
    }
    if (!key_in_range(key, route)) {
      *owner = 0;
      *sent = 0;
      return false;
    }
    embnb::route_key(key, route, world, owner, sent);
    return true;
  }
};

template <typename index_t, typename offset_t>
__global__ void __launch_bounds__(kBlockThreads)
count_kernel(const index_t* keys, int64_t num_keys, const int64_t* offsets, int64_t num_segments,
             int64_t batch, const FeatureRoute* routes, Divisor world, int64_t num_tiles,
             offset_t* new_lengths, unsigned long long* tile_counts, DeviceErrors* err) {
  if (err->bad_lengths) return;
  const int lane = threadIdx.x % kWarp;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x / kWarp);
  for (int64_t tile = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) / kWarp;
       tile < num_tiles; tile += warps) {  // uniform per warp
    Walker walk{offsets, num_segments, batch, routes};
    for (int step = 0; step < kStepsPerTile; ++step) {
      const int64_t first = tile * kTileKeys + step * kWarp;
      if (first >= num_keys) break;  // uniform per warp
      const int64_t i = first + lane;
      const bool valid = i < num_keys;
      const unsigned active = __ballot_sync(kFullMask, valid);
      if (!valid) continue;
      int64_t owner, sent;
      if (!walk.route_key_at(i, static_cast<int64_t>(keys[i]), world, &owner, &sent)) {
        atomicMin(&err->bad_key, static_cast<unsigned long long>(i));
      }
      const long long bucket = owner * num_segments + walk.segment;
      const unsigned same_bucket = __match_any_sync(active, bucket);
      if (lane == __ffs(same_bucket) - 1) add_count(new_lengths + bucket, __popc(same_bucket));
      const unsigned same_owner = __match_any_sync(active, static_cast<long long>(owner));
      if (lane == __ffs(same_owner) - 1) {
        atomicAdd(tile_counts + owner * num_tiles + tile,
                  static_cast<unsigned long long>(__popc(same_owner)));
      }
    }
  }
}

template <typename index_t>
__global__ void __launch_bounds__(kBlockThreads)
scatter_kernel(const index_t* keys, int64_t num_keys, const int64_t* offsets,
               int64_t num_segments, int64_t batch, const FeatureRoute* routes, Divisor world,
               int64_t num_tiles, unsigned long long* cursors, index_t* new_keys,
               index_t* permute, const DeviceErrors* err) {
  // Bad input: counts are not trustworthy, so writing could overflow.
  if (err->bad_lengths || err->bad_key != kNone) return;
  const int lane = threadIdx.x % kWarp;
  const unsigned lanes_below = (1u << lane) - 1u;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x / kWarp);
  for (int64_t tile = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) / kWarp;
       tile < num_tiles; tile += warps) {
    Walker walk{offsets, num_segments, batch, routes};
    for (int step = 0; step < kStepsPerTile; ++step) {
      const int64_t first = tile * kTileKeys + step * kWarp;
      if (first >= num_keys) break;
      const int64_t i = first + lane;
      const bool valid = i < num_keys;
      const unsigned active = __ballot_sync(kFullMask, valid);
      if (!valid) continue;
      const index_t key = keys[i];
      int64_t owner, sent;
      walk.route_key_at(i, static_cast<int64_t>(key), world, &owner, &sent);
      // Lanes with the same owner take consecutive slots in lane (= input)
      // order; the leader reserves them. The next step's reservation comes
      // after this one returns (the shuffle waits for it): order is kept.
      const unsigned same_owner = __match_any_sync(active, static_cast<long long>(owner));
      const int leader = __ffs(same_owner) - 1;
      unsigned long long base = 0;
      if (lane == leader) {
        base = atomicAdd(cursors + owner * num_tiles + tile,
                         static_cast<unsigned long long>(__popc(same_owner)));
      }
      base = __shfl_sync(active, base, leader);
      const unsigned long long pos = base + __popc(same_owner & lanes_below);
      new_keys[pos] = static_cast<index_t>(sent);
      permute[i] = static_cast<index_t>(pos);
    }
  }
}

constexpr size_t align_up(size_t n) { return (n + 255) / 256 * 256; }

struct Layout {
  int64_t num_tiles;
  size_t offsets, widened, tile_counts, cursors, routes, errors, scan, total;  // byte offsets
  size_t scan_bytes;
  cudaError_t status;  // of cub's workspace size queries
};

Layout make_layout(const CudaBucketizeArgs& a) {
  Layout l{};
  l.num_tiles = (a.num_keys + kTileKeys - 1) / kTileKeys;
  const int64_t num_counts = a.world_size * l.num_tiles;
  size_t lengths_scan = 0, tiles_scan = 0;
  l.status = cub::DeviceScan::InclusiveSum(nullptr, lengths_scan, static_cast<const int64_t*>(nullptr),
                                           static_cast<int64_t*>(nullptr), a.num_segments);
  if (l.status == cudaSuccess) {
    l.status = cub::DeviceScan::ExclusiveSum(nullptr, tiles_scan,
                                             static_cast<const unsigned long long*>(nullptr),
                                             static_cast<unsigned long long*>(nullptr), num_counts);
  }
  l.scan_bytes = lengths_scan > tiles_scan ? lengths_scan : tiles_scan;
  size_t at = 0;
  auto take = [&at](size_t bytes) {
    const size_t start = at;
    at += align_up(bytes);
    return start;
  };
  l.offsets = take(sizeof(int64_t) * (a.num_segments + 1));
  l.widened = take(sizeof(int64_t) * a.num_segments);
  l.tile_counts = take(sizeof(unsigned long long) * num_counts);
  l.cursors = take(sizeof(unsigned long long) * num_counts);
  l.routes = take(sizeof(FeatureRoute) * a.num_features);
  l.errors = take(sizeof(DeviceErrors));
  l.scan = take(l.scan_bytes > 0 ? l.scan_bytes : 1);
  l.total = at;
  return l;
}

template <typename T>
T* at_offset(void* base, size_t offset) {
  return reinterpret_cast<T*>(static_cast<char*>(base) + offset);
}

template <typename index_t, typename offset_t>
cudaError_t launch(const CudaBucketizeArgs& a, const Layout& l, void* ws, cudaStream_t stream) {
  const int64_t S = a.num_segments, N = a.num_keys, W = a.world_size;
  int64_t* offsets = at_offset<int64_t>(ws, l.offsets);
  int64_t* widened = at_offset<int64_t>(ws, l.widened);
  auto* tile_counts = at_offset<unsigned long long>(ws, l.tile_counts);
  auto* cursors = at_offset<unsigned long long>(ws, l.cursors);
  auto* routes = at_offset<FeatureRoute>(ws, l.routes);
  auto* errors = at_offset<DeviceErrors>(ws, l.errors);
  void* scan_space = at_offset<char>(ws, l.scan);
  size_t scan_bytes = l.scan_bytes;
  const int64_t num_counts = W * l.num_tiles;
  auto blocks_for = [](int64_t threads) {
    const int64_t blocks = (threads + kBlockThreads - 1) / kBlockThreads;
    return static_cast<unsigned>(blocks < 1 ? 1 : (blocks > 65535 * 32 ? 65535 * 32 : blocks));
  };

  cudaError_t e;
#define EMBNB_TRY(call) \
  if ((e = (call)) != cudaSuccess) return e
  EMBNB_TRY(cudaMemcpyAsync(routes, a.routes, sizeof(FeatureRoute) * a.num_features,
                            cudaMemcpyHostToDevice, stream));
  EMBNB_TRY(cudaMemsetAsync(errors, 0xFF, sizeof(DeviceErrors), stream));
  EMBNB_TRY(cudaMemsetAsync(offsets, 0, sizeof(int64_t), stream));
  if (W * S > 0) {  // an empty tensor's data pointer may be null
    EMBNB_TRY(cudaMemsetAsync(a.new_lengths, 0, (a.lengths_int64 ? 8 : 4) * W * S, stream));
  }
  if (num_counts > 0) {
    EMBNB_TRY(cudaMemsetAsync(tile_counts, 0, sizeof(unsigned long long) * num_counts, stream));
  }
  if (S > 0) {
    widen_lengths<offset_t><<<blocks_for(S), kBlockThreads, 0, stream>>>(
        static_cast<const offset_t*>(a.lengths), S, widened, errors);
    EMBNB_TRY(cudaGetLastError());
    EMBNB_TRY(cub::DeviceScan::InclusiveSum(scan_space, scan_bytes, widened, offsets + 1, S,
                                            stream));
  }
  check_total<<<1, 1, 0, stream>>>(offsets, S, N, errors);
  EMBNB_TRY(cudaGetLastError());
  if (N == 0) return cudaSuccess;

  const int64_t batch = S / a.num_features;  // >= 1: N > 0 needs segments
  const Divisor world = make_divisor(static_cast<uint64_t>(W));
  const unsigned tile_blocks = blocks_for(l.num_tiles * kWarp);
  count_kernel<index_t, offset_t><<<tile_blocks, kBlockThreads, 0, stream>>>(
      static_cast<const index_t*>(a.indices), N, offsets, S, batch, routes, world, l.num_tiles,
      static_cast<offset_t*>(a.new_lengths), tile_counts, errors);
  EMBNB_TRY(cudaGetLastError());
  scan_bytes = l.scan_bytes;
  EMBNB_TRY(cub::DeviceScan::ExclusiveSum(scan_space, scan_bytes, tile_counts, cursors,
                                          num_counts, stream));
  scatter_kernel<index_t><<<tile_blocks, kBlockThreads, 0, stream>>>(
      static_cast<const index_t*>(a.indices), N, offsets, S, batch, routes, world, l.num_tiles,
      cursors, static_cast<index_t*>(a.new_indices), static_cast<index_t*>(a.permute), errors);
  EMBNB_TRY(cudaGetLastError());
#undef EMBNB_TRY
  return cudaSuccess;
}

int64_t read_int(const void* base, bool is_int64, int64_t index, cudaStream_t stream,
                 cudaError_t* e) {
  if (is_int64) {
    int64_t v = 0;
    *e = cudaMemcpyAsync(&v, static_cast<const int64_t*>(base) + index, sizeof v,
                         cudaMemcpyDeviceToHost, stream);
    if (*e == cudaSuccess) *e = cudaStreamSynchronize(stream);
    return v;
  }
  int32_t v = 0;
  *e = cudaMemcpyAsync(&v, static_cast<const int32_t*>(base) + index, sizeof v,
                       cudaMemcpyDeviceToHost, stream);
  if (*e == cudaSuccess) *e = cudaStreamSynchronize(stream);
  return v;
}

}  // namespace

size_t cuda_bucketize_workspace_bytes(const CudaBucketizeArgs& args) {
  return make_layout(args).total;
}

CudaBucketizeStatus cuda_bucketize(const CudaBucketizeArgs& a, void* workspace,
                                   size_t workspace_bytes, void* stream_handle) {
  const cudaStream_t stream = static_cast<cudaStream_t>(stream_handle);
  const Layout l = make_layout(a);
  auto failed = [](cudaError_t e) {
    return CudaBucketizeStatus{kCudaRuntimeError, 0, static_cast<int64_t>(e),
                               cudaGetErrorString(e)};
  };
  if (l.status != cudaSuccess) return failed(l.status);
  if (workspace_bytes < l.total) {
    return CudaBucketizeStatus{kCudaRuntimeError, 0, 0, "bucketize workspace too small"};
  }
  cudaError_t e;
  if (a.indices_int64) {
    e = a.lengths_int64 ? launch<int64_t, int64_t>(a, l, workspace, stream)
                        : launch<int64_t, int32_t>(a, l, workspace, stream);
  } else {
    e = a.lengths_int64 ? launch<int32_t, int64_t>(a, l, workspace, stream)
                        : launch<int32_t, int32_t>(a, l, workspace, stream);
  }
  if (e != cudaSuccess) return failed(e);

  // One wait per call: bad lengths or keys must raise, not return garbage.
  DeviceErrors errors;
  e = cudaMemcpyAsync(&errors, at_offset<DeviceErrors>(workspace, l.errors), sizeof errors,
                      cudaMemcpyDeviceToHost, stream);
  if (e == cudaSuccess) e = cudaStreamSynchronize(stream);
  if (e != cudaSuccess) return failed(e);
  if (errors.negative_length != kNone) {
    const int64_t s = static_cast<int64_t>(errors.negative_length);
    const int64_t value = read_int(a.lengths, a.lengths_int64, s, stream, &e);
    if (e != cudaSuccess) return failed(e);
    return CudaBucketizeStatus{kCudaNegativeLength, s, value, nullptr};
  }
  if (errors.total != a.num_keys) {
    return CudaBucketizeStatus{kCudaLengthSum, 0, errors.total, nullptr};
  }
  if (errors.bad_key != kNone) {
    const int64_t i = static_cast<int64_t>(errors.bad_key);
    const int64_t value = read_int(a.indices, a.indices_int64, i, stream, &e);
    if (e != cudaSuccess) return failed(e);
    return CudaBucketizeStatus{kCudaBadKey, i, value, nullptr};
  }
  return CudaBucketizeStatus{kCudaOk, 0, 0, nullptr};
}

}  // namespace embnb
