// torch.ops.embnb.greedy_place: torchrec's GreedyPerfPartitioner and
// NoopPerfModel for one plan, the native twin of
// embnb/planner/replica.py (GreedyPerfReplica.place) for the plans it sees
// most: every option kind but key-value column-wise, one table per
// dependency group. It adds in torchrec's order, so its ratings equal
// torchrec's to the bit:
// 1. uniform options in plan order, shard i on device i (fails at the first
//    shard its device cannot hold);
// 2. the other options, largest total storage (HBM, DDR, SSD) first, stable:
//    - device: each shard on the least loaded device (heap of (perf total,
//      rank % local world size, rank)) that holds it;
//    - host (table-row-wise, table-column-wise; torchrec's
//      _cohost_partition): on the first host, by summed load (stable), whose
//      summed storage holds the option and where it places: table-row-wise
//      shard i on the host's device i, table-column-wise device by device
//      within the host (ties by rank % host size);
//    - grid (torchrec's _multi_hosts_partition): shard i on device i of the
//      first window of num_shards / host size consecutive hosts (by summed
//      load) that holds it, hosts taken round and round when it needs all;
// 3. the rating: per rank, the shards' perf totals added in plan order; the
//    slowest rank's.
// A failed attempt leaves the ranks it set, as torchrec leaves them on the
// shards. Python walks a heap of tuples per shard: milliseconds per plan at
// 800 tables; this is microseconds.
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

#include "checks.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <functional>
#include <queue>
#include <tuple>
#include <vector>

namespace embnb {
namespace {

// Option kinds (replica.py's _NativeOptions); any other is left to Python.
constexpr int64_t kUniform = 0, kDevice = 1, kHostRow = 2, kHostColumn = 3, kGrid = 4;
constexpr int64_t kParts = 5, kStorage = 3;

using Parts = std::array<double, kParts>;
using Storage = std::array<int64_t, kStorage>;
using Entry = std::tuple<double, int64_t, int64_t>;  // (perf total, rank % tie modulus, rank)
using Heap = std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>>;

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
  EMBNB_CHECK(t.dim() == dim && t.scalar_type() == type && t.device().is_cpu() && t.is_contiguous(),
              "greedy_place: ", what, " must be a contiguous ", dim, "-D ", type, " CPU tensor, got ", t.sizes(),
              " ", t.scalar_type());
  return t.data_ptr<T>();
}

// The devices' storage left and summed perf parts, by rank.
struct Devices {
  std::vector<Storage> left;
  std::vector<Parts> load;
};

// One plan's placement: the shard arrays, the devices, and where each
// shard's rank is written.
struct Placer {
  const int64_t* first;   // per option, its first shard
  const int64_t* shards;  // per option, its shard count
  const double* parts;    // per shard, [kParts]
  const int64_t* need;    // per shard, [kStorage]
  int64_t host_size, num_hosts;
  Devices dev;
  int64_t* ranks;  // the result, per chosen shard

  const int64_t* shard_need(int64_t o, int64_t j) const { return need + (first[o] + j) * kStorage; }
  const double* shard_parts(int64_t o, int64_t j) const { return parts + (first[o] + j) * kParts; }

  // Shard j on devices[j] of `d` (torchrec's _uniform_partition).
  bool uniform(int64_t o, const std::vector<int64_t>& devices, Devices& d, int64_t out) const {
    if (shards[o] != static_cast<int64_t>(devices.size())) return false;
    for (int64_t j = 0; j < shards[o]; ++j) {
      const int64_t r = devices[j];
      if (!holds(d.left[r], shard_need(o, j))) return false;
      take(d.left[r], shard_need(o, j));
      add(d.load[r], shard_parts(o, j));
      ranks[out + j] = r;
    }
    return true;
  }

  // Each shard on the least loaded device of `heap` that holds it (torchrec's _device_partition).
  bool device(int64_t o, Heap& heap, Devices& d, int64_t out) const {
    std::vector<Entry> skipped;
    for (int64_t j = 0; j < shards[o]; ++j) {
      skipped.clear();
      bool placed = false;
      while (!heap.empty()) {
        const Entry top = heap.top();
        const int64_t r = std::get<2>(top);
        heap.pop();
        if (holds(d.left[r], shard_need(o, j))) {
          take(d.left[r], shard_need(o, j));
          add(d.load[r], shard_parts(o, j));
          heap.emplace(total_of(d.load[r]), std::get<1>(top), r);
          ranks[out + j] = r;
          placed = true;
          break;
        }
        skipped.push_back(top);
      }
      if (!placed) return false;
      for (const Entry& entry : skipped) heap.push(entry);
    }
    return true;
  }

  static Heap heap_of(const Devices& d, int64_t begin, int64_t end, int64_t modulus) {
    std::vector<Entry> entries;
    for (int64_t r = begin; r < end; ++r) entries.emplace_back(total_of(d.load[r]), r % modulus, r);
    return Heap(std::greater<Entry>(), std::move(entries));
  }

  // The hosts by summed load, stable (torchrec's _sort_devices_by_perf).
  std::vector<int64_t> sorted_hosts() const {
    std::vector<double> sums(num_hosts, 0.0);
    for (int64_t h = 0; h < num_hosts; ++h) {
      for (int64_t r = h * host_size; r < (h + 1) * host_size; ++r) sums[h] += total_of(dev.load[r]);
    }
    std::vector<int64_t> hosts(num_hosts);
    for (int64_t h = 0; h < num_hosts; ++h) hosts[h] = h;
    std::stable_sort(hosts.begin(), hosts.end(), [&](int64_t a, int64_t b) { return sums[a] < sums[b]; });
    return hosts;
  }

  // torchrec's _cohost_partition for a group of one option.
  bool cohost(int64_t o, bool row_wise, const int64_t* total_storage, int64_t out) {
    for (const int64_t h : sorted_hosts()) {
      const int64_t begin = h * host_size, end = begin + host_size;
      Storage have{0, 0, 0};
      for (int64_t r = begin; r < end; ++r) {
        for (int64_t i = 0; i < kStorage; ++i) have[i] += dev.left[r][i];
      }
      if (!holds(have, total_storage)) continue;
      Devices copy = dev;  // only the host's devices change
      bool placed;
      if (row_wise) {
        std::vector<int64_t> devices(host_size);
        for (int64_t i = 0; i < host_size; ++i) devices[i] = begin + i;
        placed = uniform(o, devices, copy, out);
      } else {
        Heap heap = heap_of(copy, begin, end, host_size);
        placed = device(o, heap, copy, out);
      }
      if (placed) {
        std::copy(copy.left.begin() + begin, copy.left.begin() + end, dev.left.begin() + begin);
        std::copy(copy.load.begin() + begin, copy.load.begin() + end, dev.load.begin() + begin);
        return true;
      }
    }
    return false;
  }

  // torchrec's _multi_hosts_partition (grid sharding).
  bool grid(int64_t o, int64_t out) {
    if (shards[o] % host_size) return false;
    const int64_t needed = shards[o] / host_size;
    const std::vector<int64_t> hosts = sorted_hosts();
    const bool round = needed >= num_hosts;
    for (int64_t start = 0; round ? start == 0 : start + needed <= num_hosts; ++start) {
      std::vector<int64_t> devices;
      for (int64_t i = 0; i < needed; ++i) {
        const int64_t h = hosts[round ? i % num_hosts : start + i];
        for (int64_t r = h * host_size; r < (h + 1) * host_size; ++r) devices.push_back(r);
      }
      Devices copy = dev;
      if (uniform(o, devices, copy, out)) {
        dev = std::move(copy);
        return true;
      }
    }
    return false;
  }
};

// Returns (status, loads, ranks): status 1 placed, 0 not placed, -1 a plan
// this op does not model (left to Python); loads per rank (placed only);
// every chosen shard's rank in plan order, -1 where none was set.
std::tuple<int64_t, at::Tensor, at::Tensor> greedy_place_cpu(
    const at::Tensor& choice, const at::Tensor& kind, const at::Tensor& key, const at::Tensor& first_shard,
    const at::Tensor& num_shards, const at::Tensor& total_storage, const at::Tensor& parts,
    const at::Tensor& totals, const at::Tensor& storage, const at::Tensor& device_storage,
    const at::Tensor& device_parts, int64_t local_world_size, int64_t host_size) {
  const int64_t* chosen = data<int64_t>(choice, at::kLong, 1, "choice");
  const int64_t* option_kind = data<int64_t>(kind, at::kLong, 1, "kind");
  const int64_t* option_key = data<int64_t>(key, at::kLong, 1, "key");
  const int64_t* option_storage = data<int64_t>(total_storage, at::kLong, 2, "total_storage");
  const double* shard_total = data<double>(totals, at::kDouble, 1, "totals");
  const int64_t* start_storage = data<int64_t>(device_storage, at::kLong, 2, "device_storage");
  const double* start_parts = data<double>(device_parts, at::kDouble, 2, "device_parts");
  const int64_t num_options = kind.numel(), num_tables = choice.numel(), world = device_storage.size(0);
  EMBNB_CHECK(local_world_size >= 1 && device_parts.size(0) == world, "greedy_place: local_world_size ",
              local_world_size, " must be >= 1, and device_parts must have ", world, " rows");
  EMBNB_CHECK(host_size >= 1 && world % host_size == 0, "greedy_place: host_size ", host_size,
              " must be >= 1 and divide the ", world, " devices");
  Placer placer{data<int64_t>(first_shard, at::kLong, 1, "first_shard"),
                data<int64_t>(num_shards, at::kLong, 1, "num_shards"),
                data<double>(parts, at::kDouble, 2, "parts"),
                data<int64_t>(storage, at::kLong, 2, "storage"),
                host_size,
                world / host_size,
                {std::vector<Storage>(world), std::vector<Parts>(world)},
                nullptr};
  const int64_t* option_shards = placer.shards;

  const auto none = [] { return at::empty({0}, at::TensorOptions().dtype(at::kDouble)); };
  const auto unmodelled = [&] { return std::make_tuple(int64_t{-1}, none(), at::empty({0}, at::kLong)); };
  // Where each table's shards go in the result; and whether this op models the plan.
  std::vector<int64_t> out_at(num_tables + 1, 0), keys;
  for (int64_t t = 0; t < num_tables; ++t) {
    const int64_t o = chosen[t];
    EMBNB_CHECK(o >= 0 && o < num_options, "greedy_place: choice[", t, "] = ", o, " is not an option in [0, ",
                num_options, ")");
    if (option_kind[o] < kUniform || option_kind[o] > kGrid) return unmodelled();
    if (option_kind[o] != kUniform) keys.push_back(option_key[o]);
    out_at[t + 1] = out_at[t] + option_shards[o];
  }
  std::sort(keys.begin(), keys.end());
  if (std::adjacent_find(keys.begin(), keys.end()) != keys.end()) {  // a group of several tables
    return unmodelled();
  }
  at::Tensor ranks_out = at::full({out_at[num_tables]}, -1, at::TensorOptions().dtype(at::kLong));
  placer.ranks = ranks_out.data_ptr<int64_t>();
  Devices& dev = placer.dev;
  for (int64_t r = 0; r < world; ++r) {
    std::copy_n(start_storage + r * kStorage, kStorage, dev.left[r].begin());
    std::copy_n(start_parts + r * kParts, kParts, dev.load[r].begin());
  }
  const auto not_placed = [&] { return std::make_tuple(int64_t{0}, none(), ranks_out); };

  // 1. Uniform options in plan order.
  std::vector<int64_t> rest, everyone(world);
  for (int64_t r = 0; r < world; ++r) everyone[r] = r;
  for (int64_t t = 0; t < num_tables; ++t) {
    if (option_kind[chosen[t]] != kUniform) {
      rest.push_back(t);
    } else if (!placer.uniform(chosen[t], everyone, dev, out_at[t])) {
      return not_placed();
    }
  }

  // 2. The rest, largest total storage first (stable, as Python's sorted).
  const auto storage_of = [&](int64_t t) {
    const int64_t* s = option_storage + chosen[t] * kStorage;
    return std::make_tuple(s[0], s[1], s[2]);
  };
  std::stable_sort(rest.begin(), rest.end(), [&](int64_t a, int64_t b) { return storage_of(a) > storage_of(b); });
  bool heap_valid = false;  // the device heap over every device, until a host or grid option moves loads
  Heap heap;
  for (const int64_t t : rest) {
    const int64_t o = chosen[t], k = option_kind[o];
    bool placed;
    if (k == kDevice) {
      if (!heap_valid) heap = Placer::heap_of(dev, 0, world, local_world_size);
      heap_valid = true;
      placed = placer.device(o, heap, dev, out_at[t]);
    } else {
      heap_valid = false;
      placed = k == kGrid ? placer.grid(o, out_at[t])
                          : placer.cohost(o, k == kHostRow, option_storage + o * kStorage, out_at[t]);
    }
    if (!placed) return not_placed();
  }

  // 3. NoopPerfModel: per rank, the totals added in plan order.
  const int64_t* ranks = placer.ranks;
  at::Tensor loads_out = at::zeros({world}, at::TensorOptions().dtype(at::kDouble));
  double* loads = loads_out.data_ptr<double>();
  for (int64_t t = 0; t < num_tables; ++t) {
    const int64_t o = chosen[t];
    for (int64_t j = 0; j < option_shards[o]; ++j) {
      loads[ranks[out_at[t] + j]] += shard_total[placer.first[o] + j];
    }
  }
  return {1, loads_out, ranks_out};
}

}  // namespace
}  // namespace embnb

TORCH_LIBRARY_FRAGMENT(embnb, m) {
  m.def(
      "greedy_place(Tensor choice, Tensor kind, Tensor key, Tensor first_shard, Tensor num_shards, "
      "Tensor total_storage, Tensor parts, Tensor totals, Tensor storage, Tensor device_storage, "
      "Tensor device_parts, int local_world_size, int host_size) -> (int status, Tensor loads, Tensor ranks)");
}

TORCH_LIBRARY_IMPL(embnb, CPU, m) { m.impl("greedy_place", &embnb::greedy_place_cpu); }
