// CPU kernel of torch.ops.embnb.bucketize, plus the op's schema and the
// argument checks shared with the CUDA binding.
//
// Output position of key i is rank_base[owner] + (keys before i with the
// same owner): inside one rank the output is segment-major and segments are
// contiguous in the input, so the output order is input order. That lets
// the keys be cut into equal chunks (one per thread) regardless of segment
// boundaries: pass 1 counts per (rank, segment) and per (chunk, rank);
// a scan over chunks gives each chunk its W write cursors; pass 2 scatters.
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <torch/library.h>

#include "checks.h"

#include <algorithm>
#include <memory>
#include <string>
#include <type_traits>

#include "bucketize.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif
#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace embnb {

namespace {

const char* dist_name(int64_t code) {
  switch (code) {
    case kContinuous: return "continuous";
    case kRoundRobin: return "roundrobin";
    case kHashRoundRobin: return "hash_roundrobin";
    case kFeistelRoundRobin: return "feistel_roundrobin";
    default: return "?";
  }
}

void check_index_tensor(const char* name, const at::Tensor& t) {
  EMBNB_CHECK_VALUE(t.scalar_type() == at::kInt || t.scalar_type() == at::kLong,
                   name, " must be int32 or int64, got ", t.scalar_type());
  EMBNB_CHECK_VALUE(t.dim() == 1, name, " must be 1-D, got shape ", t.sizes());
}

}  // namespace

BucketizePlan check_bucketize_args(const at::Tensor& lengths, const at::Tensor& indices,
                                   int64_t world_size, c10::IntArrayRef dist_types,
                                   c10::IntArrayRef block_sizes,
                                   const std::optional<at::Tensor>& weights,
                                   const std::optional<at::Tensor>& feistel_keys) {
  check_index_tensor("lengths", lengths);
  check_index_tensor("indices", indices);
  EMBNB_CHECK_VALUE(lengths.device() == indices.device(), "lengths is on ", lengths.device(),
                    " but indices is on ", indices.device());
  EMBNB_CHECK_VALUE(world_size >= 1, "world_size must be >= 1, got ", world_size);
  const int64_t num_features = static_cast<int64_t>(dist_types.size());
  EMBNB_CHECK_VALUE(num_features >= 1, "dist_types must hold one code per feature, got none");
  EMBNB_CHECK_VALUE(static_cast<int64_t>(block_sizes.size()) == num_features,
                    "len(block_sizes) is ", block_sizes.size(), " but len(dist_types) is ",
                    num_features, ": one entry per feature is required");
  const int64_t num_segments = lengths.numel();
  EMBNB_CHECK_VALUE(num_segments % num_features == 0, "len(lengths) is ", num_segments,
                    ", not a multiple of num_features=", num_features);
  const int64_t num_keys = indices.numel();
  // unbucketize_permute has the dtype of indices: positions must fit.
  EMBNB_CHECK_VALUE(indices.scalar_type() == at::kLong || num_keys <= INT32_MAX,
                    "int32 indices allow at most 2**31 - 1 keys, got ", num_keys);
  if (weights.has_value()) {
    const at::Tensor& w = *weights;
    EMBNB_CHECK_VALUE(w.dim() >= 1 && w.size(0) == num_keys, "weights must be a tensor with ",
                      num_keys, " rows (one per key), got ", w.sizes());
    EMBNB_CHECK_VALUE(w.device() == indices.device(), "weights is on ", w.device(),
                      " but indices is on ", indices.device());
  }
  BucketizePlan plan{num_keys, num_segments, world_size, num_features, {},
                     make_divisor(static_cast<uint64_t>(world_size))};
  at::Tensor keys;  // feistel_roundrobin's round keys, read where a feature routes by them
  if (feistel_keys.has_value()) {
    keys = feistel_keys->contiguous();
    EMBNB_CHECK_VALUE(keys.scalar_type() == at::kLong && keys.dim() == 1 && keys.device().is_cpu() &&
                          keys.numel() >= 1 && keys.numel() <= kMaxFeistelRounds,
                      "feistel_keys must be a 1-D int64 CPU tensor of 1 to ", kMaxFeistelRounds,
                      " round keys, got ", keys.sizes(), " ", keys.scalar_type(), " on ", keys.device());
  }
  plan.routes.reserve(num_features);
  for (int64_t f = 0; f < num_features; ++f) {
    const int64_t code = dist_types[f];
    EMBNB_CHECK_VALUE(code >= kContinuous && code <= kFeistelRoundRobin, "dist_types[", f, "] is ",
                      code, "; codes are 0 continuous, 1 roundrobin, 2 hash_roundrobin, ",
                      "3 feistel_roundrobin");
    const int64_t block = block_sizes[f];
    EMBNB_CHECK_VALUE(code != kContinuous || block >= 1, "block_sizes[", f, "] is ", block,
                      "; continuous features need block sizes >= 1");
    EMBNB_CHECK_VALUE(code != kRoundRobin || block >= 0, "block_sizes[", f, "] is ", block,
                      "; a roundrobin feature's entry is its dense table's rows, or 0 for unbounded keys");
    if (code == kFeistelRoundRobin) {
      EMBNB_CHECK_VALUE(block >= 1 && block <= (int64_t{1} << 62), "block_sizes[", f, "] is ", block,
                        "; a feistel_roundrobin feature's entry is its num_embeddings, in [1, 2**62]");
      EMBNB_CHECK_VALUE(indices.scalar_type() == at::kLong || block <= (int64_t{1} << 31), "block_sizes[",
                        f, "] is ", block, ": int32 indices take feistel_roundrobin tables of at most ",
                        "2**31 rows (the local rows sent have the indices' dtype)");
      EMBNB_CHECK_VALUE(keys.defined(), "feature ", f,
                        " is feistel_roundrobin but feistel_keys is None: give its round keys");
    }
    plan.routes.push_back(make_route(static_cast<int32_t>(code), static_cast<uint64_t>(block),
                                     static_cast<uint64_t>(world_size),
                                     keys.defined() ? keys.data_ptr<int64_t>() : nullptr,
                                     keys.defined() ? keys.numel() : 0));
  }
  return plan;
}

void raise_negative_length(int64_t length, int64_t position) {
  EMBNB_CHECK_VALUE(false, "lengths must be >= 0, got ", length, " at position ", position);
}

void raise_length_sum(int64_t sum, int64_t num_keys) {
  EMBNB_CHECK_VALUE(false, "lengths sum to ", sum, " but indices has ", num_keys, " keys");
}

void raise_bad_key(int64_t key, int64_t position, int64_t feature, const FeatureRoute& route) {
  EMBNB_CHECK_VALUE(route.mode != kContinuous, "continuous routing needs keys >= 0, got key ", key,
                    " at position ", position, " (feature ", feature, " is continuous)");
  EMBNB_CHECK_VALUE(route.mode != kRoundRobin, "roundrobin routing needs keys in [0, ", route.rows,
                    "), got key ", key, " at position ", position, " (feature ", feature,
                    " is roundrobin with num_embeddings ", route.rows, ")");
  EMBNB_CHECK_VALUE(false, "feistel_roundrobin routing needs keys in [0, ", route.feistel.size,
                    "), got key ", key, " at position ", position, " (feature ", feature,
                    " is feistel_roundrobin with num_embeddings ", route.feistel.size, ")");
}

std::optional<at::Tensor> move_weights(const std::optional<at::Tensor>& weights,
                                       const at::Tensor& permute) {
  if (!weights.has_value()) return std::nullopt;
  at::Tensor out = at::empty_like(*weights);
  out.index_copy_(0, permute.to(at::kLong), *weights);
  return out;
}

namespace {

// Stores for permute, written in order and not read back by the kernel:
// non-temporal on x86 skips reading each line before overwriting it.
#if defined(__x86_64__)
inline void stream_store(int64_t* p, int64_t v) {
  _mm_stream_si64(reinterpret_cast<long long*>(p), v);
}
inline void stream_store(int32_t* p, int32_t v) { _mm_stream_si32(p, v); }
inline void stream_fence() { _mm_sfence(); }
#else
template <typename T>
inline void stream_store(T* p, T v) { *p = v; }
inline void stream_fence() {}
#endif

// Fresh output buffers of tens of MB come straight from mmap, and the first
// write to each 4 KiB page faults: at 1e7 keys that was a third of the
// kernel's time. Asking for transparent huge pages (where the system allows
// them: /sys/kernel/mm/transparent_hugepage/enabled) makes it one fault per
// 2 MiB. Only whole 2 MiB pages inside the buffer are advised.
void advise_huge_pages(const at::Tensor& t) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  constexpr uintptr_t kHuge = uintptr_t{1} << 21;
  const auto begin = reinterpret_cast<uintptr_t>(t.data_ptr());
  const uintptr_t first = (begin + kHuge - 1) & ~(kHuge - 1);
  const uintptr_t last = (begin + t.nbytes()) & ~(kHuge - 1);
  if (last >= first + 2 * kHuge) {
    madvise(reinterpret_cast<void*>(first), last - first, MADV_HUGEPAGE);  // a hint: errors ignored
  }
#endif
}

// Calls body(mode) with the dist_type as a compile-time constant, so each
// mode gets its own loop with the other modes' branches folded away.
template <typename Body>
inline void with_mode(int32_t mode, Body&& body) {
  switch (mode) {
    case kContinuous: body(std::integral_constant<int32_t, kContinuous>{}); break;
    case kRoundRobin: body(std::integral_constant<int32_t, kRoundRobin>{}); break;
    case kFeistelRoundRobin: body(std::integral_constant<int32_t, kFeistelRoundRobin>{}); break;
    default: body(std::integral_constant<int32_t, kHashRoundRobin>{}); break;
  }
}

// Keys per chunk below which a second thread costs more than it saves.
constexpr int64_t kMinKeysPerChunk = 1 << 15;

template <typename index_t, typename offset_t>
void bucketize_cpu_kernel(const BucketizePlan& plan, const offset_t* lengths,
                          const index_t* keys, offset_t* new_lengths, index_t* new_keys,
                          index_t* permute) {
  const int64_t S = plan.num_segments, N = plan.num_keys, W = plan.world_size;
  const int64_t batch = S / plan.num_features;

  std::vector<int64_t> offsets(S + 1, 0);
  for (int64_t s = 0; s < S; ++s) {
    const int64_t length = static_cast<int64_t>(lengths[s]);
    if (length < 0) raise_negative_length(length, s);
    offsets[s + 1] = offsets[s] + length;
  }
  if (offsets[S] != N) raise_length_sum(offsets[S], N);

  // Chunk c holds keys [key_begin(c), key_begin(c + 1)) and "owns" (writes
  // new_lengths for) segments [seg_begin[c], seg_begin[c + 1]): those that
  // start inside it. A segment started by an earlier chunk continues into
  // at most its first keys (the carry), counted aside and added serially.
  const int64_t num_chunks =
      std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), N / kMinKeysPerChunk));
  auto key_begin = [&](int64_t c) { return N * c / num_chunks; };
  std::vector<int64_t> seg_begin(num_chunks + 1, S);
  seg_begin[0] = 0;
  for (int64_t c = 1; c < num_chunks; ++c) {
    seg_begin[c] = std::lower_bound(offsets.begin(), offsets.begin() + S, key_begin(c)) -
                   offsets.begin();
  }
  auto carry_segment = [&](int64_t c) -> int64_t {  // -1: none
    const int64_t s = seg_begin[c] - 1;
    return (c > 0 && s >= 0 && offsets[s + 1] > key_begin(c)) ? s : -1;
  };

  std::vector<int64_t> rank_count(num_chunks * W, 0);   // keys per (chunk, rank)
  std::vector<int64_t> carry_count(num_chunks * W, 0);  // the carry's keys per rank
  std::vector<int64_t> first_bad(num_chunks, -1);       // a key out of its route's range
  // Pass 1 keeps each key's owner for pass 2 when one byte holds it.
  const bool keep_owner = W <= 256;
  std::unique_ptr<uint8_t[]> owners(keep_owner ? new uint8_t[N] : nullptr);
  // ... and a feistel_roundrobin key's local row: its permutation is the costly part of its route.
  const bool keep_local = keep_owner && std::any_of(plan.routes.begin(), plan.routes.end(), [](const auto& r) {
    return r.mode == kFeistelRoundRobin;
  });
  std::unique_ptr<index_t[]> locals(keep_local ? new index_t[N] : nullptr);

  // Calls visit(segment, first key, end key) over the chunk's keys in order.
  auto for_each_run = [&](int64_t c, auto&& visit) {
    const int64_t k1 = key_begin(c + 1);
    const int64_t carry = carry_segment(c);
    if (carry >= 0) visit(carry, key_begin(c), std::min(offsets[carry + 1], k1));
    for (int64_t s = seg_begin[c]; s < seg_begin[c + 1]; ++s) {
      visit(s, offsets[s], std::min(offsets[s + 1], k1));
    }
  };

  // Counts chunk c's keys [begin, end) of segment s per rank into cnt.
  auto count_run = [&](int64_t c, int64_t s, int64_t begin, int64_t end, int64_t* cnt) {
    with_mode(plan.routes[s / batch].mode, [&](auto mode) {
      FeatureRoute route = plan.routes[s / batch];
      route.mode = mode;
      for (int64_t i = begin; i < end; ++i) {
        const int64_t key = static_cast<int64_t>(keys[i]);
        if (mode != kHashRoundRobin && !key_in_range(key, route)) {
          if (first_bad[c] < 0) first_bad[c] = i;
          continue;
        }
        int64_t owner, sent;
        route_key(key, route, plan.world, &owner, &sent);
        ++cnt[owner];
        if (keep_owner) owners[i] = static_cast<uint8_t>(owner);
        if (mode == kFeistelRoundRobin && keep_local) locals[i] = static_cast<index_t>(sent);
      }
    });
  };

  // Pass 1: counts. Owned segments go in groups so that new_lengths
  // (rank-major) is written a cache line per rank, not an entry.
  constexpr int64_t kGroup = 16;
  at::parallel_for(0, num_chunks, 1, [&](int64_t chunk_lo, int64_t chunk_hi) {
    std::vector<int64_t> count(kGroup * W);
    for (int64_t c = chunk_lo; c < chunk_hi; ++c) {
      const int64_t k1 = key_begin(c + 1);
      const int64_t carry = carry_segment(c);
      if (carry >= 0) {
        count_run(c, carry, key_begin(c), std::min(offsets[carry + 1], k1),
                  carry_count.data() + c * W);
      }
      for (int64_t g = seg_begin[c]; g < seg_begin[c + 1]; g += kGroup) {
        const int64_t group = std::min(kGroup, seg_begin[c + 1] - g);
        std::fill(count.begin(), count.begin() + group * W, 0);
        for (int64_t j = 0; j < group; ++j) {
          const int64_t s = g + j;
          count_run(c, s, offsets[s], std::min(offsets[s + 1], k1), count.data() + j * W);
        }
        for (int64_t r = 0; r < W; ++r) {
          offset_t* out = new_lengths + r * S + g;
          for (int64_t j = 0; j < group; ++j) out[j] = static_cast<offset_t>(count[j * W + r]);
        }
      }
      // The chunk's keys per rank: its carry plus its own segments' counts
      // (a sequential sum, cheaper than a second increment per key).
      for (int64_t r = 0; r < W; ++r) {
        const offset_t* row = new_lengths + r * S;
        int64_t sum = carry_count[c * W + r];
        for (int64_t s = seg_begin[c]; s < seg_begin[c + 1]; ++s) sum += row[s];
        rank_count[c * W + r] = sum;
      }
    }
  });

  for (int64_t c = 0; c < num_chunks; ++c) {
    const int64_t i = first_bad[c];
    if (i < 0) continue;  // chunks are in key order: the first found is first
    const int64_t s = std::upper_bound(offsets.begin(), offsets.end(), i) - offsets.begin() - 1;
    raise_bad_key(static_cast<int64_t>(keys[i]), i, s / batch, plan.routes[s / batch]);
  }
  for (int64_t c = 1; c < num_chunks; ++c) {
    const int64_t carry = carry_segment(c);
    if (carry < 0) continue;
    for (int64_t r = 0; r < W; ++r) {
      new_lengths[r * S + carry] += static_cast<offset_t>(carry_count[c * W + r]);
    }
  }

  // Cursors: chunk c's first rank-r key goes after all keys of ranks < r
  // and the rank-r keys of chunks < c.
  std::vector<int64_t> cursor(num_chunks * W);
  int64_t position = 0;
  for (int64_t r = 0; r < W; ++r) {
    for (int64_t c = 0; c < num_chunks; ++c) {
      cursor[c * W + r] = position;
      position += rank_count[c * W + r];
    }
  }

  // Pass 2: scatter, in input order per rank.
  at::parallel_for(0, num_chunks, 1, [&](int64_t chunk_lo, int64_t chunk_hi) {
    for (int64_t c = chunk_lo; c < chunk_hi; ++c) {
      int64_t* next = cursor.data() + c * W;
      for_each_run(c, [&](int64_t s, int64_t begin, int64_t end) {
        with_mode(plan.routes[s / batch].mode, [&](auto mode) {
          FeatureRoute route = plan.routes[s / batch];
          route.mode = mode;
          for (int64_t i = begin; i < end; ++i) {
            const int64_t key = static_cast<int64_t>(keys[i]);
            int64_t owner, sent;
            if (keep_owner) {
              owner = owners[i];
              sent = mode == kFeistelRoundRobin ? static_cast<int64_t>(locals[i])
                                                : sent_id(key, owner, route, plan.world);
            } else {
              route_key(key, route, plan.world, &owner, &sent);
            }
            const int64_t pos = next[owner]++;
            new_keys[pos] = static_cast<index_t>(sent);
            stream_store(permute + i, static_cast<index_t>(pos));
          }
        });
      });
    }
    stream_fence();
  });
}

BucketizeResult bucketize_cpu(const at::Tensor& lengths, const at::Tensor& indices,
                              int64_t world_size, c10::IntArrayRef dist_types,
                              c10::IntArrayRef block_sizes,
                              const std::optional<at::Tensor>& weights,
                              const std::optional<at::Tensor>& feistel_keys) {
  const BucketizePlan plan = check_bucketize_args(lengths, indices, world_size, dist_types,
                                                  block_sizes, weights, feistel_keys);
  const at::Tensor lengths_c = lengths.contiguous();
  const at::Tensor indices_c = indices.contiguous();
  at::Tensor new_lengths = at::empty({plan.world_size * plan.num_segments}, lengths.options());
  at::Tensor new_indices = at::empty({plan.num_keys}, indices.options());
  at::Tensor permute = at::empty({plan.num_keys}, indices.options());
  advise_huge_pages(new_indices);
  advise_huge_pages(permute);
  AT_DISPATCH_INDEX_TYPES(indices.scalar_type(), "embnb_bucketize_keys", [&] {
    using key_t = index_t;
    AT_DISPATCH_INDEX_TYPES(lengths.scalar_type(), "embnb_bucketize_lengths", [&] {
      bucketize_cpu_kernel<key_t, index_t>(
          plan, lengths_c.data_ptr<index_t>(), indices_c.data_ptr<key_t>(),
          new_lengths.data_ptr<index_t>(), new_indices.data_ptr<key_t>(),
          permute.data_ptr<key_t>());
    });
  });
  return {new_lengths, new_indices, permute, move_weights(weights, permute)};
}

}  // namespace
}  // namespace embnb

// Each source registers its own ops with TORCH_LIBRARY_FRAGMENT, so more
// sources can join the extension without touching this one.
TORCH_LIBRARY_FRAGMENT(embnb, m) {
  m.def(embnb::kBucketizeSchema);
}

TORCH_LIBRARY_IMPL(embnb, CPU, m) {
  m.impl("bucketize", &embnb::bucketize_cpu);
}
