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
// 3. the rating: per rank, the shards' perf totals added in plan order
//    (NoopPerfModel's sums), plus kernel_call_ms times the rank's distinct TBE
//    groups (shard_group); the slowest rank's, plus the pair_ms of each distinct
//    (module, sharding type) id of the plan (option_pair), added in id order
//    (embnb/planner/perf_model.py's KernelCallPerfModel and RatingTerms; empty
//    arrays and 0: NoopPerfModel's rating).
// A failed attempt leaves the ranks it set, as torchrec leaves them on the
// shards. Python walks a heap of tuples per shard: milliseconds per plan at
// 800 tables; this is microseconds. On many hosts what stays the same from
// option to option is kept: an attempt changes the devices in place and puts
// back only its own on a failure, the hosts' summed loads are summed again
// only where a device changed, and the devices stay ordered by load in a set
// (torchrec heapifies them again after every host-level option), which a
// device too full for any device shard still to place leaves for good.
//
// The options of every table are laid out flat (see replica.py's
// _NativeOptions): per option its kind, dependency key, first shard and
// shard count, total storage; per shard its slot among the distinct values
// (`ShardValues`), and per distinct value its perf parts (in the order
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
#include <limits>
#include <queue>
#include <set>
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
using Ordered = std::set<Entry>;  // the same order as Heap, with entries updated in place

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
  const int64_t* slot;    // per shard, its row in the distinct values below
  const double* parts;    // per distinct value, [kParts]
  const int64_t* need;    // per distinct value, [kStorage]
  int64_t host_size, num_hosts, tie_modulus;
  Devices dev;
  int64_t* ranks;  // the result, per chosen shard
  // Each host's summed load (valid where not stale), the hosts in (sum,
  // host) order as of the last sort, and every device in (perf total, rank %
  // tie_modulus, rank) order with its key as entered.
  std::vector<double> host_sum;
  std::vector<char> host_stale;
  std::vector<int64_t> host_order;
  Ordered by_load;
  std::vector<double> entered;
  // Per axis, the least any device shard still to place needs; a device
  // with less left on some axis can hold none of them (left only falls) and
  // leaves by_load for good (retired): tight plans would scan it per shard.
  Storage least_need{};
  std::vector<char> retired;

  const int64_t* shard_need(int64_t o, int64_t j) const { return need + slot[first[o] + j] * kStorage; }
  const double* shard_parts(int64_t o, int64_t j) const { return parts + slot[first[o] + j] * kParts; }

  void start() {
    const auto world = static_cast<int64_t>(dev.load.size());
    host_sum.assign(num_hosts, 0.0);
    host_stale.assign(num_hosts, 1);
    host_order.resize(num_hosts);
    for (int64_t h = 0; h < num_hosts; ++h) host_order[h] = h;
    by_load.clear();
    entered.resize(world);
    retired.assign(world, 0);
    for (int64_t r = 0; r < world; ++r) {
      entered[r] = total_of(dev.load[r]);
      by_load.emplace(entered[r], r % tie_modulus, r);
    }
  }

  // After device r's load changed: its host's sum and its place in by_load.
  void moved(int64_t r) {
    host_stale[r / host_size] = 1;
    const double now = total_of(dev.load[r]);
    if (now == entered[r] || retired[r]) return;
    by_load.erase(Entry(entered[r], r % tie_modulus, r));
    by_load.emplace(now, r % tie_modulus, r);
    entered[r] = now;
  }

  // Device r takes shard j of option o.
  void put(int64_t o, int64_t j, int64_t r, int64_t out) {
    take(dev.left[r], shard_need(o, j));
    add(dev.load[r], shard_parts(o, j));
    moved(r);
    ranks[out + j] = r;
  }

  // The devices' state, to put back if an attempt fails.
  struct Saved {
    std::vector<int64_t> devices;
    std::vector<Storage> left;
    std::vector<Parts> load;
  };
  Saved save(const std::vector<int64_t>& devices) const {
    Saved saved{devices, {}, {}};
    for (const int64_t r : devices) {
      saved.left.push_back(dev.left[r]);
      saved.load.push_back(dev.load[r]);
    }
    return saved;
  }
  void restore(const Saved& saved) {
    for (size_t i = saved.devices.size(); i-- > 0;) {  // backwards: a device listed twice gets its first state
      const int64_t r = saved.devices[i];
      dev.left[r] = saved.left[i];
      dev.load[r] = saved.load[i];
    }
    for (const int64_t r : saved.devices) moved(r);
  }

  // Shard j on devices[j] (torchrec's _uniform_partition); on a failure the
  // devices may be changed (the caller puts them back).
  bool uniform(int64_t o, const std::vector<int64_t>& devices, int64_t out) {
    if (shards[o] != static_cast<int64_t>(devices.size())) return false;
    for (int64_t j = 0; j < shards[o]; ++j) {
      if (!holds(dev.left[devices[j]], shard_need(o, j))) return false;
      put(o, j, devices[j], out);
    }
    return true;
  }

  // Each shard on the least loaded device that holds it, over every device
  // (torchrec's _device_partition): the first such in by_load's order.
  bool device(int64_t o, int64_t out) {
    for (int64_t j = 0; j < shards[o]; ++j) {
      auto it = by_load.begin();
      while (it != by_load.end() && !holds(dev.left[std::get<2>(*it)], shard_need(o, j))) {
        const int64_t r = std::get<2>(*it);
        if (holds(dev.left[r], least_need.data())) {
          ++it;
        } else {
          retired[r] = 1;
          it = by_load.erase(it);
        }
      }
      if (it == by_load.end()) return false;
      put(o, j, std::get<2>(*it), out);
    }
    return true;
  }

  // The same within one host, on a heap of its devices (ties by rank % host size).
  bool device_on_host(int64_t o, int64_t begin, int64_t end, int64_t out) {
    std::vector<Entry> entries, skipped;
    for (int64_t r = begin; r < end; ++r) entries.emplace_back(total_of(dev.load[r]), r % host_size, r);
    Heap heap(std::greater<Entry>(), std::move(entries));
    for (int64_t j = 0; j < shards[o]; ++j) {
      skipped.clear();
      bool placed = false;
      while (!heap.empty()) {
        const Entry top = heap.top();
        const int64_t r = std::get<2>(top);
        heap.pop();
        if (holds(dev.left[r], shard_need(o, j))) {
          put(o, j, r, out);
          heap.emplace(total_of(dev.load[r]), std::get<1>(top), r);
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

  // The hosts by summed load, stable (torchrec's _sort_devices_by_perf):
  // the same sums, each host's added device by device; an insertion sort
  // from the last order by (sum, host), which a stable sort of the hosts in
  // host order gives too.
  const std::vector<int64_t>& sorted_hosts() {
    for (int64_t h = 0; h < num_hosts; ++h) {
      if (!host_stale[h]) continue;
      double sum = 0.0;
      for (int64_t r = h * host_size; r < (h + 1) * host_size; ++r) sum += total_of(dev.load[r]);
      host_sum[h] = sum;
      host_stale[h] = 0;
    }
    const auto before = [&](int64_t a, int64_t b) {
      return host_sum[a] < host_sum[b] || (host_sum[a] == host_sum[b] && a < b);
    };
    for (int64_t i = 1; i < num_hosts; ++i) {
      const int64_t h = host_order[i];
      int64_t k = i;
      for (; k > 0 && before(h, host_order[k - 1]); --k) host_order[k] = host_order[k - 1];
      host_order[k] = h;
    }
    return host_order;
  }

  // torchrec's _cohost_partition for a group of one option.
  bool cohost(int64_t o, bool row_wise, const int64_t* total_storage, int64_t out) {
    const std::vector<int64_t> hosts = sorted_hosts();  // a copy: placing re-sorts
    for (const int64_t h : hosts) {
      const int64_t begin = h * host_size, end = begin + host_size;
      Storage have{0, 0, 0};
      for (int64_t r = begin; r < end; ++r) {
        for (int64_t i = 0; i < kStorage; ++i) have[i] += dev.left[r][i];
      }
      if (!holds(have, total_storage)) continue;
      std::vector<int64_t> devices(host_size);
      for (int64_t i = 0; i < host_size; ++i) devices[i] = begin + i;
      const Saved saved = save(devices);
      if (row_wise ? uniform(o, devices, out) : device_on_host(o, begin, end, out)) return true;
      restore(saved);
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
      const Saved saved = save(devices);
      if (uniform(o, devices, out)) return true;
      restore(saved);
    }
    return false;
  }
};

// Returns (status, loads, ranks, rating): status 1 placed, 0 not placed, -1 a
// plan this op does not model (left to Python); loads per rank (placed only:
// the sums plus the kernel calls' cost); every chosen shard's rank in plan
// order, -1 where none was set; the rating (placed only, else 0).
std::tuple<int64_t, at::Tensor, at::Tensor, double> greedy_place_cpu(
    const at::Tensor& choice, const at::Tensor& kind, const at::Tensor& key, const at::Tensor& first_shard,
    const at::Tensor& num_shards, const at::Tensor& total_storage, const at::Tensor& slots,
    const at::Tensor& parts, const at::Tensor& totals, const at::Tensor& storage, const at::Tensor& device_storage,
    const at::Tensor& device_parts, int64_t local_world_size, int64_t host_size, const at::Tensor& shard_group,
    const at::Tensor& option_pair, const at::Tensor& pair_ms, double kernel_call_ms) {
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
  EMBNB_CHECK(parts.size(0) == totals.size(0) && storage.size(0) == totals.size(0), "greedy_place: parts (",
              parts.size(0), " rows), totals (", totals.size(0), ") and storage (", storage.size(0),
              ") must hold the same distinct values");
  EMBNB_CHECK(host_size >= 1 && world % host_size == 0, "greedy_place: host_size ", host_size,
              " must be >= 1 and divide the ", world, " devices");
  const int64_t* group_of = data<int64_t>(shard_group, at::kLong, 1, "shard_group");
  const int64_t* pair_of = data<int64_t>(option_pair, at::kLong, 1, "option_pair");
  const double* ms_of_pair = data<double>(pair_ms, at::kDouble, 1, "pair_ms");
  EMBNB_CHECK(kernel_call_ms == 0.0 || shard_group.numel() == slots.numel(), "greedy_place: shard_group (",
              shard_group.numel(), ") must hold a group per shard (", slots.numel(), ") where kernel_call_ms (",
              kernel_call_ms, ") is not 0");
  EMBNB_CHECK(pair_ms.numel() == 0 || option_pair.numel() == num_options, "greedy_place: option_pair (",
              option_pair.numel(), ") must hold a pair per option (", num_options, ") where pair_ms is given");
  Placer placer{data<int64_t>(first_shard, at::kLong, 1, "first_shard"),
                data<int64_t>(num_shards, at::kLong, 1, "num_shards"),
                data<int64_t>(slots, at::kLong, 1, "slots"),
                data<double>(parts, at::kDouble, 2, "parts"),
                data<int64_t>(storage, at::kLong, 2, "storage"),
                host_size,
                world / host_size,
                local_world_size,
                {std::vector<Storage>(world), std::vector<Parts>(world)},
                nullptr};
  const int64_t* option_shards = placer.shards;

  const auto none = [] { return at::empty({0}, at::TensorOptions().dtype(at::kDouble)); };
  const auto unmodelled = [&] { return std::make_tuple(int64_t{-1}, none(), at::empty({0}, at::kLong), 0.0); };
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
  placer.start();
  const auto not_placed = [&] { return std::make_tuple(int64_t{0}, none(), ranks_out, 0.0); };

  // 1. Uniform options in plan order.
  std::vector<int64_t> rest, everyone(world);
  for (int64_t r = 0; r < world; ++r) everyone[r] = r;
  for (int64_t t = 0; t < num_tables; ++t) {
    if (option_kind[chosen[t]] != kUniform) {
      rest.push_back(t);
    } else if (!placer.uniform(chosen[t], everyone, out_at[t])) {
      return not_placed();
    }
  }

  // 2. The rest, largest total storage first (stable, as Python's sorted).
  const auto storage_of = [&](int64_t t) {
    const int64_t* s = option_storage + chosen[t] * kStorage;
    return std::make_tuple(s[0], s[1], s[2]);
  };
  std::stable_sort(rest.begin(), rest.end(), [&](int64_t a, int64_t b) { return storage_of(a) > storage_of(b); });
  // Per axis, the least need of the device shards from each place in `rest` on.
  std::vector<Storage> least_from(rest.size() + 1);
  least_from.back().fill(std::numeric_limits<int64_t>::max());
  for (size_t i = rest.size(); i-- > 0;) {
    least_from[i] = least_from[i + 1];
    const int64_t o = chosen[rest[i]];
    if (option_kind[o] != kDevice) continue;
    for (int64_t j = 0; j < option_shards[o]; ++j) {
      for (int64_t a = 0; a < kStorage; ++a) {
        least_from[i][a] = std::min(least_from[i][a], placer.shard_need(o, j)[a]);
      }
    }
  }
  for (size_t i = 0; i < rest.size(); ++i) {
    const int64_t t = rest[i], o = chosen[t], k = option_kind[o];
    placer.least_need = least_from[i];
    const bool placed = k == kDevice ? placer.device(o, out_at[t])
                        : k == kGrid ? placer.grid(o, out_at[t])
                                     : placer.cohost(o, k == kHostRow, option_storage + o * kStorage, out_at[t]);
    if (!placed) return not_placed();
  }

  // 3. NoopPerfModel: per rank, the totals added in plan order.
  const int64_t* ranks = placer.ranks;
  at::Tensor loads_out = at::zeros({world}, at::TensorOptions().dtype(at::kDouble));
  double* loads = loads_out.data_ptr<double>();
  for (int64_t t = 0; t < num_tables; ++t) {
    const int64_t o = chosen[t];
    for (int64_t j = 0; j < option_shards[o]; ++j) {
      loads[ranks[out_at[t] + j]] += shard_total[placer.slot[placer.first[o] + j]];
    }
  }
  // KernelCallPerfModel: each rank's distinct groups, then the plan's distinct pairs in id order.
  if (kernel_call_ms != 0.0) {
    int64_t num_groups = 1;
    for (int64_t i = 0; i < shard_group.numel(); ++i) num_groups = std::max(num_groups, group_of[i] + 1);
    std::vector<int64_t> pairs;
    for (int64_t t = 0; t < num_tables; ++t) {
      const int64_t o = chosen[t];
      for (int64_t j = 0; j < option_shards[o]; ++j) {
        pairs.push_back(ranks[out_at[t] + j] * num_groups + group_of[placer.first[o] + j]);
      }
    }
    std::sort(pairs.begin(), pairs.end());
    pairs.erase(std::unique(pairs.begin(), pairs.end()), pairs.end());
    std::vector<int64_t> calls(world, 0);
    for (const int64_t pair : pairs) ++calls[pair / num_groups];
    for (int64_t r = 0; r < world; ++r) {
      // volatile: the product rounded on its own, as Python and numpy round it (no fused multiply-add)
      const volatile double cost = kernel_call_ms * static_cast<double>(calls[r]);
      loads[r] += cost;
    }
  }
  double rating = *std::max_element(loads, loads + world);
  if (pair_ms.numel() > 0) {
    std::vector<int64_t> present;
    for (int64_t t = 0; t < num_tables; ++t) present.push_back(pair_of[chosen[t]]);
    std::sort(present.begin(), present.end());
    present.erase(std::unique(present.begin(), present.end()), present.end());
    double fixed = 0.0;
    for (const int64_t pair : present) fixed += ms_of_pair[pair];
    rating += fixed;
  }
  return {1, loads_out, ranks_out, rating};
}

}  // namespace
}  // namespace embnb

TORCH_LIBRARY_FRAGMENT(embnb, m) {
  m.def(
      "greedy_place(Tensor choice, Tensor kind, Tensor key, Tensor first_shard, Tensor num_shards, "
      "Tensor total_storage, Tensor slots, Tensor parts, Tensor totals, Tensor storage, Tensor device_storage, "
      "Tensor device_parts, int local_world_size, int host_size, Tensor shard_group, Tensor option_pair, "
      "Tensor pair_ms, float kernel_call_ms) -> (int status, Tensor loads, Tensor ranks, float rating)");
}

TORCH_LIBRARY_IMPL(embnb, CPU, m) { m.impl("greedy_place", &embnb::greedy_place_cpu); }
