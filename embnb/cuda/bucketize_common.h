// Per-key routing shared by the CPU (bucketize_cpu.cpp) and CUDA
// (bucketize_cuda.cu) kernels, so both compute the owner and the id sent
// with the same code. Needs only <cstdint>: nvcc compiles it without torch.
//
// Semantics are embnb.routing's (the pure-torch reference): keys are int64
// (int32 keys sign-extended); round-robin modes read them as uint64 and send
// the raw key; continuous sends the local row and rejects negative keys;
// feistel_roundrobin permutes ids of [0, N) (a keyed Feistel bijection),
// routes the result round-robin, sends the local row and rejects ids outside
// [0, N).
#pragma once

#include <cstdint>

#ifdef __CUDACC__
#define EMBNB_HD __host__ __device__ __forceinline__
#else
#define EMBNB_HD inline
#endif

namespace embnb {

// Per-feature dist_type codes, as torch.ops.embnb.bucketize takes them.
enum DistCode : int32_t {
  kContinuous = 0,
  kRoundRobin = 1,
  kHashRoundRobin = 2,
  kFeistelRoundRobin = 3,
};

// Exact unsigned division by a runtime divisor without the 64-bit `div`
// instruction (35-90 cycles on Cascade Lake, emulated on GPUs): below 2**52
// a double reciprocal gives the quotient to within one, fixed by one
// multiply-compare; powers of two shift.
struct Divisor {
  uint64_t d;    // >= 1
  double inv;    // 1.0 / d, rounded
  uint64_t mask; // d - 1 when d is a power of two
  int32_t shift; // log2(d) when d is a power of two, else -1
};

inline Divisor make_divisor(uint64_t d) {
  Divisor v{d, 1.0 / static_cast<double>(d), d - 1, -1};
  if ((d & (d - 1)) == 0) {
    v.shift = 0;
    while ((uint64_t{1} << v.shift) != d) ++v.shift;
  }
  return v;
}

constexpr uint64_t kExactDoubleLimit = uint64_t{1} << 52;

// floor(n / d) for n < 2**52: |n * inv - n / d| < 0.5 there, so the
// truncated estimate is off by at most one in either direction.
EMBNB_HD uint64_t div_below_2_52(uint64_t n, const Divisor& v) {
  uint64_t q = static_cast<uint64_t>(
      static_cast<int64_t>(static_cast<double>(static_cast<int64_t>(n)) * v.inv));
  const uint64_t p = q * v.d;  // <= n + d < 2**64: no overflow
  if (p > n) {
    --q;
  } else if (n - p >= v.d) {
    ++q;
  }
  return q;
}

EMBNB_HD uint64_t divide(uint64_t n, const Divisor& v) {
  if (v.shift >= 0) return n >> v.shift;
  if (n < kExactDoubleLimit) return div_below_2_52(n, v);
  return n / v.d;
}

EMBNB_HD uint64_t modulo(uint64_t n, const Divisor& v) {
  if (v.shift >= 0) return n & v.mask;
  if (n < kExactDoubleLimit) return n - div_below_2_52(n, v) * v.d;
  if (v.d < (uint64_t{1} << 20)) {
    // Full 64-bit keys (hashes): n = hi * 2**32 + lo, and
    // (hi % d) * 2**32 + lo < d * 2**32 < 2**52 keeps both steps exact.
    const uint64_t h = n >> 32;
    const uint64_t hi = h - div_below_2_52(h, v) * v.d;
    const uint64_t t = (hi << 32) | (n & 0xFFFFFFFFull);
    return t - div_below_2_52(t, v) * v.d;
  }
  return n % v.d;
}

// MurmurHash3 fmix64, no seed (NVIDIA dynamicemb's key hash).
EMBNB_HD uint64_t fmix64(uint64_t x) {
  x ^= x >> 33;
  x *= 0xFF51AFD7ED558CCDull;
  x ^= x >> 33;
  x *= 0xC4CEB9FE1A85EC53ull;
  x ^= x >> 33;
  return x;
}

constexpr int64_t kMaxFeistelRounds = 8;  // embnb.rowwise.routing uses 4

// A keyed Feistel bijection of [0, size), passed by value to a kernel.
struct FeistelTable {
  int64_t keys[kMaxFeistelRounds];
  int64_t rounds;
  int64_t half_bits;  // the network permutes [0, 4 ** half_bits)
  uint64_t size;      // num_embeddings
  uint64_t world;     // world_size
  uint64_t block;     // ceil(size / world)
};

// The least h >= 1 with 4 ** h >= size (size <= 2**62).
inline int64_t feistel_half_bits(uint64_t size) {
  int64_t h = 1;
  while ((uint64_t{1} << (2 * h)) < size) ++h;
  return h;
}

// One pass of the network over [0, 4 ** half_bits): as routing._feistel,
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

// The permuted id of `id` (in [0, size): the callers check), cycle-walked
// into range: the walk ends, since p's cycle holds id.
EMBNB_HD uint64_t feistel_permute(uint64_t id, const FeistelTable& t) {
  uint64_t p = feistel_once(id, t);
  while (p >= t.size) p = feistel_once(p, t);
  return p;
}

// How one feature's keys are routed.
struct FeatureRoute {
  int32_t mode;         // DistCode
  Divisor block;        // continuous only
  uint64_t limit;       // block.d * world_size, saturated: keys below it are in blocks
  uint64_t rows;        // roundrobin: a dense table's rows (local rows sent); 0: keys sent as they are
  FeistelTable feistel; // feistel_roundrobin only
};

// `size`: the block size of a continuous feature, the num_embeddings of a
// feistel_roundrobin one (whose round keys are `keys[0, rounds)`), and of a
// roundrobin one whose table is dense (0: unbounded keys, as dynamicemb's).
inline FeatureRoute make_route(int32_t mode, uint64_t size, uint64_t world_size,
                               const int64_t* keys = nullptr, int64_t rounds = 0) {
  FeatureRoute r{mode, make_divisor(mode == kContinuous ? size : 1), 0, 0, {}};
  if (mode == kRoundRobin) {
    r.rows = size;
  } else if (mode == kContinuous) {
    r.limit = size > UINT64_MAX / world_size ? UINT64_MAX : size * world_size;
  } else if (mode == kFeistelRoundRobin) {
    for (int64_t i = 0; i < rounds; ++i) r.feistel.keys[i] = keys[i];
    r.feistel.rounds = rounds;
    r.feistel.half_bits = feistel_half_bits(size);
    r.feistel.size = size;
    r.feistel.world = world_size;
    r.feistel.block = (size + world_size - 1) / world_size;
  }
  return r;
}

// Whether `key` may be routed: continuous keys are >= 0, the ids of a table
// of known rows (feistel_roundrobin, a dense roundrobin table) in [0, rows);
// round-robin modes on unbounded keys take any key.
EMBNB_HD bool key_in_range(int64_t key, const FeatureRoute& route) {
  if (route.mode == kContinuous) return key >= 0;
  if (route.mode == kFeistelRoundRobin) return key >= 0 && static_cast<uint64_t>(key) < route.feistel.size;
  if (route.mode == kRoundRobin && route.rows) return key >= 0 && static_cast<uint64_t>(key) < route.rows;
  return true;
}

// Owner rank of `key` and the id sent to it. The key must be in range
// (key_in_range: the callers check first).
EMBNB_HD void route_key(int64_t key, const FeatureRoute& route, const Divisor& world,
                        int64_t* owner, int64_t* sent) {
  const uint64_t u = static_cast<uint64_t>(key);
  if (route.mode == kFeistelRoundRobin) {  // owner p % W, local row p / W
    const uint64_t p = feistel_permute(u, route.feistel);
    const uint64_t q = divide(p, world);
    *owner = static_cast<int64_t>(p - q * world.d);
    *sent = static_cast<int64_t>(q);
    return;
  }
  if (route.mode == kContinuous) {
    if (u < route.limit) {
      const uint64_t q = divide(u, route.block);
      *owner = static_cast<int64_t>(q);
      *sent = static_cast<int64_t>(u - q * route.block.d);
    } else {  // past the last block, as FBGEMM: key % W, local id key / W
      const uint64_t q = divide(u, world);
      *owner = static_cast<int64_t>(u - q * world.d);
      *sent = static_cast<int64_t>(q);
    }
    return;
  }
  *owner = static_cast<int64_t>(modulo(route.mode == kHashRoundRobin ? fmix64(u) : u, world));
  *sent = route.mode == kRoundRobin && route.rows ? static_cast<int64_t>(divide(u, world)) : key;  // local row
}

// The id sent for `key` once its owner is known (what route_key returns
// as `sent`), without recomputing the owner.
EMBNB_HD int64_t sent_id(int64_t key, int64_t owner, const FeatureRoute& route,
                         const Divisor& world) {
  const uint64_t u = static_cast<uint64_t>(key);
  if (route.mode == kFeistelRoundRobin) return static_cast<int64_t>(divide(feistel_permute(u, route.feistel), world));
  if (route.mode == kRoundRobin && route.rows) return static_cast<int64_t>(divide(u, world));
  if (route.mode != kContinuous) return key;
  if (u < route.limit) return static_cast<int64_t>(u - static_cast<uint64_t>(owner) * route.block.d);
  return static_cast<int64_t>(divide(u, world));
}

}  // namespace embnb
