// torch.ops.embnb.greedy_place: torchrec's GreedyPerfPartitioner and
// NoopPerfModel for one plan, the native twin of
// embnb/planner/replica.py (GreedyPerfReplica.place) for the plans it sees
// most: uniform options (shard i on device i) and options placed device by
// device, one table per dependency group. It adds in torchrec's order, so
// its ratings equal torchrec's to the bit:
// 1. uniform options in plan order, shard i on device i (fails at the first
//    shard its device cannot hold);
// 2. the other options, largest total storage (HBM, DDR, SSD) first, stable;
//    each shard on the least loaded device (heap of (perf total, rank % local
//    world size, rank)) that holds it;
// 3. the rating: per rank, the shards' perf totals added in plan order; the
//    slowest rank's.
// Python walks a heap of tuples per shard: milliseconds per plan at 800
// tables; this is microseconds.
//
// The options of every table are laid out flat (see replica.py's
// _NativeOptions): per option its kind, dependency key, first shard and
// shard count, total storage; per shard its perf parts (in the order
// Perf.total adds them), perf total and storage.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>
#include <ATen/ops/zeros.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <functional>
#include <queue>
#include <tuple>
#include <vector>

namespace embnb {
namespace {

constexpr int64_t kUniform = 0, kDevice = 1;  // other kinds are left to Python
constexpr int64_t kParts = 5, kStorage = 3;

using Parts = std::array<double, kParts>;
using Storage = std::array<int64_t, kStorage>;

double total_of(const Parts& p) { return p[0] + p[1] + p[2] + p[3] + p[4]; }

bool holds(const Storage& have, const int64_t* need) {
  return need[0] <= have[0] && need[1] <= have[1] && need[2] <= have[2];
}

void take(Storage& have, const int64_t* need) {
  for (int64_t i = 0; i < kStorage; ++i) have[i] -= need[i];
}

void add(Parts& now, const double* more) {
  for (int64_t i = 0; i < kParts; ++i) now[i] += more[i];
}

template <typename T>
const T* data(const at::Tensor& t, at::ScalarType type, int64_t dim, const char* what) {
  TORCH_CHECK(t.dim() == dim && t.scalar_type() == type && t.device().is_cpu() && t.is_contiguous(),
              "greedy_place: ", what, " must be a contiguous ", dim, "-D ", type, " CPU tensor, got ", t.sizes(),
              " ", t.scalar_type());
  return t.data_ptr<T>();
}

// Returns (status, loads, ranks): status 1 placed, 0 not placed, -1 a plan
// this op does not model (left to Python); loads per rank (placed only);
// every chosen shard's rank in plan order, -1 where none was set.
std::tuple<int64_t, at::Tensor, at::Tensor> greedy_place_cpu(
    const at::Tensor& choice, const at::Tensor& kind, const at::Tensor& key, const at::Tensor& first_shard,
    const at::Tensor& num_shards, const at::Tensor& total_storage, const at::Tensor& parts,
    const at::Tensor& totals, const at::Tensor& storage, const at::Tensor& device_storage,
    const at::Tensor& device_parts, int64_t local_world_size) {
  const int64_t* chosen = data<int64_t>(choice, at::kLong, 1, "choice");
  const int64_t* option_kind = data<int64_t>(kind, at::kLong, 1, "kind");
  const int64_t* option_key = data<int64_t>(key, at::kLong, 1, "key");
  const int64_t* option_first = data<int64_t>(first_shard, at::kLong, 1, "first_shard");
  const int64_t* option_shards = data<int64_t>(num_shards, at::kLong, 1, "num_shards");
  const int64_t* option_storage = data<int64_t>(total_storage, at::kLong, 2, "total_storage");
  const double* shard_parts = data<double>(parts, at::kDouble, 2, "parts");
  const double* shard_total = data<double>(totals, at::kDouble, 1, "totals");
  const int64_t* shard_storage = data<int64_t>(storage, at::kLong, 2, "storage");
  const int64_t* start_storage = data<int64_t>(device_storage, at::kLong, 2, "device_storage");
  const double* start_parts = data<double>(device_parts, at::kDouble, 2, "device_parts");
  const int64_t num_options = kind.numel(), num_tables = choice.numel(), world = device_storage.size(0);
  TORCH_CHECK(local_world_size >= 1 && device_parts.size(0) == world, "greedy_place: local_world_size ",
              local_world_size, " must be >= 1, and device_parts must have ", world, " rows");

  const auto none = [] { return at::empty({0}, at::TensorOptions().dtype(at::kDouble)); };
  const auto unmodelled = [&] { return std::make_tuple(int64_t{-1}, none(), at::empty({0}, at::kLong)); };
  // Where each table's shards go in the result; and whether this op models the plan.
  std::vector<int64_t> out_at(num_tables + 1, 0), keys;
  for (int64_t t = 0; t < num_tables; ++t) {
    const int64_t o = chosen[t];
    TORCH_CHECK(o >= 0 && o < num_options, "greedy_place: choice[", t, "] = ", o, " is not an option in [0, ",
                num_options, ")");
    const bool uniform = option_kind[o] == kUniform;
    if (!(uniform || option_kind[o] == kDevice) || (uniform && option_shards[o] != world)) {
      return unmodelled();
    }
    if (!uniform) keys.push_back(option_key[o]);
    out_at[t + 1] = out_at[t] + option_shards[o];
  }
  std::sort(keys.begin(), keys.end());
  if (std::adjacent_find(keys.begin(), keys.end()) != keys.end()) {  // a group of several tables
    return unmodelled();
  }
  at::Tensor ranks_out = at::full({out_at[num_tables]}, -1, at::TensorOptions().dtype(at::kLong));
  int64_t* ranks = ranks_out.data_ptr<int64_t>();
  std::vector<Storage> left(world);
  std::vector<Parts> load(world);
  for (int64_t r = 0; r < world; ++r) {
    std::copy_n(start_storage + r * kStorage, kStorage, left[r].begin());
    std::copy_n(start_parts + r * kParts, kParts, load[r].begin());
  }
  const auto not_placed = [&] { return std::make_tuple(int64_t{0}, none(), ranks_out); };

  // 1. Uniform options in plan order.
  std::vector<int64_t> rest;
  for (int64_t t = 0; t < num_tables; ++t) {
    const int64_t o = chosen[t];
    if (option_kind[o] != kUniform) {
      rest.push_back(t);
      continue;
    }
    for (int64_t r = 0; r < world; ++r) {
      const int64_t s = option_first[o] + r;
      if (!holds(left[r], shard_storage + s * kStorage)) return not_placed();
      take(left[r], shard_storage + s * kStorage);
      add(load[r], shard_parts + s * kParts);
      ranks[out_at[t] + r] = r;
    }
  }

  // 2. The rest, largest total storage first (stable, as Python's sorted).
  const auto storage_of = [&](int64_t t) {
    const int64_t* s = option_storage + chosen[t] * kStorage;
    return std::make_tuple(s[0], s[1], s[2]);
  };
  std::stable_sort(rest.begin(), rest.end(), [&](int64_t a, int64_t b) { return storage_of(a) > storage_of(b); });
  using Entry = std::tuple<double, int64_t, int64_t>;  // (perf total, rank % local world size, rank)
  std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> heap;
  for (int64_t r = 0; r < world; ++r) heap.emplace(total_of(load[r]), r % local_world_size, r);
  std::vector<Entry> skipped;
  for (const int64_t t : rest) {
    const int64_t o = chosen[t];
    for (int64_t j = 0; j < option_shards[o]; ++j) {
      const int64_t s = option_first[o] + j;
      const int64_t* need = shard_storage + s * kStorage;
      skipped.clear();
      bool placed = false;
      while (!heap.empty()) {
        const Entry top = heap.top();
        const int64_t r = std::get<2>(top);
        heap.pop();
        if (holds(left[r], need)) {
          take(left[r], need);
          add(load[r], shard_parts + s * kParts);
          heap.emplace(total_of(load[r]), std::get<1>(top), r);
          ranks[out_at[t] + j] = r;
          placed = true;
          break;
        }
        skipped.push_back(top);
      }
      if (!placed) return not_placed();
      for (const Entry& entry : skipped) heap.push(entry);
    }
  }

  // 3. NoopPerfModel: per rank, the totals added in plan order.
  at::Tensor loads_out = at::zeros({world}, at::TensorOptions().dtype(at::kDouble));
  double* loads = loads_out.data_ptr<double>();
  for (int64_t t = 0; t < num_tables; ++t) {
    const int64_t o = chosen[t];
    for (int64_t j = 0; j < option_shards[o]; ++j) loads[ranks[out_at[t] + j]] += shard_total[option_first[o] + j];
  }
  return {1, loads_out, ranks_out};
}

}  // namespace
}  // namespace embnb

TORCH_LIBRARY_FRAGMENT(embnb, m) {
  m.def(
      "greedy_place(Tensor choice, Tensor kind, Tensor key, Tensor first_shard, Tensor num_shards, "
      "Tensor total_storage, Tensor parts, Tensor totals, Tensor storage, Tensor device_storage, "
      "Tensor device_parts, int local_world_size) -> (int status, Tensor loads, Tensor ranks)");
}

TORCH_LIBRARY_IMPL(embnb, CPU, m) { m.impl("greedy_place", &embnb::greedy_place_cpu); }
