// torch.ops.embnb.karmarkar_karp: Karmarkar-Karp (largest differencing) for
// k parts, optionally followed by swap refinement; the native twin of
// embnb/balancing/partition.py (_kk_sets, _refine, _best_swap, _heaviest_first). It
// returns exactly the Python version's partition: every tie is broken the
// same way (states by (bottom - top, -top, id), sets by a stable sort on
// decreasing (sum, item count), swaps by (|diff - gap/2|, a, b)) and every float sum is
// formed in the same order. Torch ops called from Python run without the
// GIL, so a training loop's Python keeps running while this works in a
// background thread.
//
// Result: (order, sizes), int64: the sample indices of part 0 (ascending),
// then part 1, ...; sizes[p] = samples in part p (padding items dropped).
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include "checks.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <queue>
#include <tuple>
#include <vector>

namespace embnb {
namespace {

// Sets live in a pool; a set's items are a linked list (head, tail, next),
// so merging two sets is O(1). Empty sets have head == -1.
struct SetPool {
  std::vector<double> sum;
  std::vector<int64_t> count;  // items in the set: breaks ties of equal sums
  std::vector<int64_t> head, tail;
  std::vector<int64_t> next;  // per item

  int64_t make(double value, int64_t item) {
    sum.push_back(value);
    count.push_back(item < 0 ? 0 : 1);
    head.push_back(item);
    tail.push_back(item);
    return static_cast<int64_t>(sum.size()) - 1;
  }
  // Set a sorts before set b: larger sum, then more items (as verl's KK), so
  // that sets of equal sum pair their items with the emptier sets and no part
  // ends empty while there are at least as many items as parts.
  bool before(int64_t a, int64_t b) const {
    return sum[a] > sum[b] || (sum[a] == sum[b] && count[a] > count[b]);
  }
  void absorb(int64_t s, int64_t t) {  // s <- s + t
    sum[s] = sum[s] + sum[t];
    count[s] += count[t];
    if (head[t] < 0) return;
    if (head[s] < 0) {
      head[s] = head[t];
    } else {
      next[tail[s]] = head[t];
    }
    tail[s] = tail[t];
  }
};

// A state's k sets sit in `slots[state * k ...]`; the heap holds keys only.
struct HeapEntry {
  double spread_key;  // bottom - top: the most negative (largest spread) first
  double top_key;     // -top: then the largest top set
  int64_t id;         // then the older state
  int64_t slot;       // where its sets are
};

struct PopsFirst {  // std::priority_queue keeps the "largest": invert
  bool operator()(const HeapEntry& x, const HeapEntry& y) const {
    return std::tie(x.spread_key, x.top_key, x.id) > std::tie(y.spread_key, y.top_key, y.id);
  }
};

// Stable sort by decreasing (sum, count) (as Python's sort(reverse=True)):
// insertion sort for the usual small k, no allocation.
void sort_sets(const SetPool& pool, int64_t* sets, int64_t k) {
  if (k > 64) {
    std::stable_sort(sets, sets + k, [&](int64_t a, int64_t b) { return pool.before(a, b); });
    return;
  }
  for (int64_t i = 1; i < k; ++i) {
    const int64_t s = sets[i];
    int64_t j = i;
    while (j > 0 && pool.before(s, sets[j - 1])) {
      sets[j] = sets[j - 1];
      --j;
    }
    sets[j] = s;
  }
}

HeapEntry make_entry(const SetPool& pool, int64_t* sets, int64_t k, int64_t id, int64_t slot) {
  sort_sets(pool, sets, k);
  const double top = pool.sum[sets[0]], bottom = pool.sum[sets[k - 1]];
  return HeapEntry{bottom - top, -top, id, slot};
}

// Karmarkar-Karp on the padded weights (items >= num_real are padding): the
// final state's parts, in its order.
std::vector<std::vector<int64_t>> kk_parts(const std::vector<double>& w, int64_t k, bool equal_size,
                                           int64_t num_real) {
  const int64_t n = static_cast<int64_t>(w.size());
  const int64_t pads = n - num_real;
  // Sorted by (weight, is real, index): padding before real zeros, so it all
  // lands in the first state, one per set. The key ranks padding 0..pads-1
  // and real items pads.. in index order.
  std::vector<std::pair<double, int64_t>> by_weight(n);
  for (int64_t i = 0; i < n; ++i) by_weight[i] = {w[i], i < num_real ? i + pads : i - num_real};
  std::sort(by_weight.begin(), by_weight.end());
  std::vector<int64_t> order(n);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t key = by_weight[i].second;
    order[i] = key < pads ? key + num_real : key - pads;
  }
  const int64_t group = equal_size ? k : 1;
  const int64_t num_states = n / group;
  SetPool pool;
  pool.next.assign(n, -1);
  pool.sum.reserve(num_states * k);
  pool.count.reserve(num_states * k);
  pool.head.reserve(num_states * k);
  pool.tail.reserve(num_states * k);
  std::vector<int64_t> slots(num_states * k);
  std::vector<HeapEntry> entries;
  entries.reserve(num_states);
  for (int64_t id = 0; id < num_states; ++id) {
    int64_t* sets = &slots[id * k];
    for (int64_t j = 0; j < k; ++j) {
      sets[j] = j < group ? pool.make(w[order[id * group + j]], order[id * group + j]) : pool.make(0.0, -1);
    }
    entries.push_back(make_entry(pool, sets, k, id, id));
  }
  std::priority_queue<HeapEntry, std::vector<HeapEntry>, PopsFirst> heap(PopsFirst{}, std::move(entries));
  int64_t next_id = num_states;
  while (heap.size() > 1) {
    const HeapEntry first = heap.top();
    heap.pop();
    const HeapEntry second = heap.top();
    heap.pop();
    int64_t* a = &slots[first.slot * k];
    const int64_t* b = &slots[second.slot * k];
    for (int64_t i = 0; i < k; ++i) pool.absorb(a[i], b[k - 1 - i]);
    heap.push(make_entry(pool, a, k, next_id++, first.slot));
  }
  const int64_t* last = &slots[heap.top().slot * k];
  std::vector<std::vector<int64_t>> parts(k);
  for (int64_t p = 0; p < k; ++p) {
    for (int64_t item = pool.head[last[p]]; item >= 0;
         item = item == pool.tail[last[p]] ? -1 : pool.next[item]) {
      parts[p].push_back(item);
    }
  }
  return parts;
}

struct Swap {
  double distance;
  int64_t a, b;
  bool operator<(const Swap& o) const { return std::tie(distance, a, b) < std::tie(o.distance, o.a, o.b); }
};

// A part's items sorted by (weight, index), with their weights alongside;
// a swap moves one item out and one in, keeping the order.
struct SortedPart {
  std::vector<int64_t> items;
  std::vector<double> weights;

  static bool before(const std::vector<double>& w, int64_t a, int64_t b) {
    return w[a] < w[b] || (w[a] == w[b] && a < b);
  }
  void build(const std::vector<double>& w, const std::vector<int64_t>& part, int64_t num_real) {
    items.clear();
    for (int64_t i : part) {
      if (i < num_real) items.push_back(i);  // padding never moves
    }
    std::sort(items.begin(), items.end(), [&](int64_t a, int64_t b) { return before(w, a, b); });
    weights.resize(items.size());
    for (size_t j = 0; j < items.size(); ++j) weights[j] = w[items[j]];
  }
  void replace(const std::vector<double>& w, int64_t out, int64_t in) {
    auto it = std::lower_bound(items.begin(), items.end(), out,
                               [&](int64_t a, int64_t b) { return before(w, a, b); });
    weights.erase(weights.begin() + (it - items.begin()));
    items.erase(it);
    it = std::lower_bound(items.begin(), items.end(), in,
                          [&](int64_t a, int64_t b) { return before(w, a, b); });
    weights.insert(weights.begin() + (it - items.begin()), w[in]);
    items.insert(it, in);
  }
};

// As balancer._best_swap: 0 < w[a] - w[b] < gap, closest to gap / 2; ties
// by lower a, then lower b (the first of b's run of equal weights). Heavy
// items come by increasing weight, so the insertion point of
// x = w[a] - gap / 2 in the light part only moves right: one pass.
bool best_swap(const std::vector<double>& w, const SortedPart& heavy, const SortedPart& light,
               double gap, Swap& best) {
  const double target = gap * 0.5;
  const std::vector<double>& lw = light.weights;
  const int64_t size = static_cast<int64_t>(lw.size());
  bool found = false;
  int64_t pos = 0;  // first light weight >= x (bisect_left)
  for (int64_t a : heavy.items) {
    const double wa = w[a];
    const double x = wa - target;
    while (pos < size && lw[pos] < x) ++pos;
    for (int64_t j : {pos, pos - 1}) {
      if (j < 0 || j >= size) continue;
      const double wb = lw[j];
      const double diff = wa - wb;
      if (!(0 < diff && diff < gap)) continue;
      const double distance = std::abs(diff - target);
      // b is only needed when (distance, a) ties or beats the best so far.
      if (found && (distance > best.distance || (distance == best.distance && a > best.a))) continue;
      const int64_t b = light.items[std::lower_bound(lw.begin(), lw.begin() + j + 1, wb) - lw.begin()];
      const Swap candidate{distance, a, b};
      if (!found || candidate < best) {
        best = candidate;
        found = true;
      }
    }
  }
  return found;
}

// As balancer._refine: swap between the heaviest part and the lightest part
// that admits a swap, until none does or max_swaps rounds ran.
void refine(const std::vector<double>& w, std::vector<std::vector<int64_t>>& parts, int64_t max_swaps,
            int64_t num_real) {
  const int64_t k = static_cast<int64_t>(parts.size());
  std::vector<double> loads(k, 0.0);
  std::vector<SortedPart> sorted(k);
  for (int64_t p = 0; p < k; ++p) {
    std::sort(parts[p].begin(), parts[p].end());
    for (int64_t i : parts[p]) loads[p] = loads[p] + w[i];
    sorted[p].build(w, parts[p], num_real);
  }
  std::vector<int64_t> by_load(k);
  for (int64_t round = 0; round < max_swaps; ++round) {
    int64_t heavy = 0;
    for (int64_t p = 1; p < k; ++p) {
      if (loads[p] > loads[heavy]) heavy = p;
    }
    std::iota(by_load.begin(), by_load.end(), 0);
    std::sort(by_load.begin(), by_load.end(), [&](int64_t a, int64_t b) {
      return loads[a] < loads[b] || (loads[a] == loads[b] && a < b);
    });
    Swap swap{0.0, -1, -1};
    int64_t light = -1;
    for (int64_t p : by_load) {
      if (p == heavy) continue;
      if (best_swap(w, sorted[heavy], sorted[p], loads[heavy] - loads[p], swap)) {
        light = p;
        break;
      }
    }
    if (light < 0) break;
    sorted[heavy].replace(w, swap.a, swap.b);
    sorted[light].replace(w, swap.b, swap.a);
    *std::find(parts[heavy].begin(), parts[heavy].end(), swap.a) = swap.b;
    *std::find(parts[light].begin(), parts[light].end(), swap.b) = swap.a;
    loads[heavy] = loads[heavy] - w[swap.a] + w[swap.b];
    loads[light] = loads[light] - w[swap.b] + w[swap.a];
  }
  for (auto& part : parts) std::sort(part.begin(), part.end());
}

// As balancer._heaviest_first: parts by decreasing load, ties by position.
void heaviest_first(const std::vector<double>& w, std::vector<std::vector<int64_t>>& parts) {
  const int64_t k = static_cast<int64_t>(parts.size());
  std::vector<double> loads(k, 0.0);
  for (int64_t p = 0; p < k; ++p) {
    for (int64_t i : parts[p]) loads[p] = loads[p] + w[i];
  }
  std::vector<int64_t> order(k);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    return loads[a] > loads[b] || (loads[a] == loads[b] && a < b);
  });
  std::vector<std::vector<int64_t>> sorted;
  for (int64_t p : order) sorted.push_back(std::move(parts[p]));
  parts = std::move(sorted);
}

std::tuple<at::Tensor, at::Tensor> karmarkar_karp_cpu(const at::Tensor& workloads, int64_t num_parts,
                                                      bool equal_size, bool refine_swaps) {
  EMBNB_CHECK_VALUE(workloads.dim() == 1, "workloads must be 1-D, got shape ", workloads.sizes());
  EMBNB_CHECK_VALUE(workloads.scalar_type() == at::kDouble, "workloads must be float64, got ",
                   workloads.scalar_type());
  EMBNB_CHECK_VALUE(num_parts >= 1, "num_parts must be >= 1, got ", num_parts);
  const int64_t n = workloads.numel();
  EMBNB_CHECK_VALUE(n >= 1, "workloads is empty: there is no batch to partition");
  const at::Tensor contiguous = workloads.contiguous();
  const double* data = contiguous.data_ptr<double>();
  std::vector<double> w(data, data + n);
  for (int64_t i = 0; i < n; ++i) {
    EMBNB_CHECK_VALUE(std::isfinite(w[i]) && w[i] >= 0, "workloads must be finite and >= 0; workloads[",
                      i, "] = ", w[i]);
  }
  if (equal_size) w.resize(n + (num_parts - n % num_parts) % num_parts, 0.0);  // zero-workload padding
  auto parts = kk_parts(w, num_parts, equal_size, n);
  if (refine_swaps) {
    refine(w, parts, 4 * static_cast<int64_t>(w.size()), n);
    heaviest_first(w, parts);
  }
  // Items grouped by part, ascending within a part; padding dropped.
  at::Tensor order = at::empty({n}, workloads.options().dtype(at::kLong).device(at::kCPU));
  at::Tensor sizes = at::empty({num_parts}, order.options());
  int64_t* out = order.data_ptr<int64_t>();
  int64_t* size = sizes.data_ptr<int64_t>();
  int64_t filled = 0;
  for (int64_t p = 0; p < num_parts; ++p) {
    std::sort(parts[p].begin(), parts[p].end());
    const int64_t start = filled;
    for (int64_t i : parts[p]) {
      if (i < n) out[filled++] = i;
    }
    size[p] = filled - start;
  }
  return {order, sizes};
}

}  // namespace
}  // namespace embnb

// Each source registers its own ops with TORCH_LIBRARY_FRAGMENT (see loader.py).
TORCH_LIBRARY_FRAGMENT(embnb, m) {
  m.def(
      "karmarkar_karp(Tensor workloads, int num_parts, bool equal_size=True, bool refine=False)"
      " -> (Tensor order, Tensor sizes)");
}

TORCH_LIBRARY_IMPL(embnb, CPU, m) {
  m.impl("karmarkar_karp", &embnb::karmarkar_karp_cpu);
}
