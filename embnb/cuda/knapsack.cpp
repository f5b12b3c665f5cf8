// torch.ops.embnb.knapsack_step and knapsack_run: the DP proposer's knapsack
// on one memory axis, one table at a time or every table in one call; the
// native twin of embnb/planner/knapsack.py (Knapsack.add_table on one axis).
// It keeps exactly the numpy version's states: the same float sums (state +
// option, in double), the same bins (floor(memory / bin_size)), the same
// winner per bin (the least perf; on a tie the first in (option, state)
// order) and the same dominance rule (a bin is kept if its perf beats every
// bin below it). numpy needs a dozen passes and temporaries per table, and
// a call per table; this is one pass over (option, state), from the states
// an option moves into the bins, and one over the bins, and one call per
// run. Both passes are cut into chunks of bins that torch's intra-op
// threads claim (chunks.h: no thread waits for one the OS has descheduled;
// each chunk makes its bins' updates in the same order: the same winners;
// each keeps its own bins, then the chunks below decide which of them stay:
// the same kept bins), and a run's trace goes to a workspace the caller
// passes from run to run.
//
// knapsack_step's result: (cells, option, state, perf, memory, least): per
// kept bin, its index, the option (an index into `weights`) and previous
// state that won it, its perf and exact memory; `least` is every bin's least
// perf (inf: unreached), dominated or not. knapsack_run returns the frontier
// traced back from the last table's states (see there).
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include "checks.h"
#include "chunks.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <optional>
#include <tuple>
#include <vector>

namespace embnb {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr int64_t kMaxTraced = int64_t{1} << 32;  // a step's winners, as state * width + option, in 32 bits

// The knapsack's states: per kept bin, its exact memory and perf.
struct States {
  std::vector<double> memory, perf;
};

// Each bin's least perf and its winner (the option, in the high 32 bits, and
// the state), reused across tables (sized to the bins once); per worker,
// each state's bin and total under the option being added, and the states
// of each option that land in the chunk at hand (scratch).
//
// `kept`: per chunk of bins, from the chunk's first bin on, its bins that
// beat every bin below them within the chunk (in bin order, their perfs
// falling); the step keeps the ones among them that also beat every bin of
// the chunks below.
struct Bins {
  std::vector<double> perf;
  std::vector<int64_t> winner;
  std::vector<int32_t> kept;
  struct Scratch {
    std::vector<int32_t> cell_of;
    std::vector<double> total_of;
    std::vector<std::pair<int64_t, int64_t>> span;  // each option's states that land in a chunk
  };
  std::vector<Scratch> workers;
  Bins(int64_t n, int num_workers) : perf(n), winner(n), kept(n), workers(num_workers) {}
};

// The first of the states (their memory rising) that, moved by `weight`,
// lands in bin `cell` or above or leaves the capacity; states from there on
// all do (the moved memory and its bin rise with the state).
int64_t first_at_or_above(const double* memory, int64_t num_states, double weight, double capacity,
                          double bin_size, double cell) {
  int64_t lo = 0, hi = num_states;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    const double moved = memory[mid] + weight;
    if (moved <= capacity && moved / bin_size < cell) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return lo;
}

// The (option, state) updates of bins [first_bin, last_bin), in (option,
// state) order: each bin keeps the least perf, the first on a tie. `span`
// holds each option's states that land there.
void scatter(const double* memory, const double* perf, const double* weight, const double* option_perf,
             const std::vector<std::pair<int64_t, int64_t>>& span, int64_t first_bin, int64_t last_bin,
             double bin_size, Bins& bins, Bins::Scratch& scratch) {
  std::fill(bins.perf.begin() + first_bin, bins.perf.begin() + last_bin, kInf);
  double* bin_perf = bins.perf.data();
  int64_t* winner = bins.winner.data();
  for (size_t o = 0; o < span.size(); ++o) {
    const auto [begin, end] = span[o];
    const double w = weight[o], p = option_perf[o];
    scratch.cell_of.resize(end - begin);
    scratch.total_of.resize(end - begin);
    int32_t* cell_of = scratch.cell_of.data() - begin;
    double* total_of = scratch.total_of.data() - begin;
    // Each state's bin and total first (a loop with no branch, which the
    // compiler vectorizes), then the updates. q >= 0, so truncation is
    // floor (and needs no libm call); bins < 2**31 fit 32 bits.
    for (int64_t s = begin; s < end; ++s) {
      cell_of[s] = static_cast<int32_t>((memory[s] + w) / bin_size);
      total_of[s] = perf[s] + p;
    }
    const int64_t option_bits = static_cast<int64_t>(o) << 32;
    for (int64_t s = begin; s < end; ++s) {
      const int32_t cell = cell_of[s];
      const double total = total_of[s], least = bin_perf[cell];
      // Strictly less: the first of equal perfs stays. A min and a mask,
      // not a branch: which bin wins is not predictable.
      const int64_t wins = -static_cast<int64_t>(total < least);  // all ones where it wins
      bin_perf[cell] = std::min(least, total);
      winner[cell] ^= (winner[cell] ^ (option_bits | s)) & wins;
    }
  }
}

// The bins in [first_bin, last_bin) that beat every bin below them in that
// range, written to bins.kept from first_bin on; returns how many. Compacted
// without a branch (about half the bins are kept, unpredictably): each is
// written, then counted if kept.
int64_t keep_within(Bins& bins, int64_t first_bin, int64_t last_bin) {
  const double* perf = bins.perf.data();
  int32_t* kept = bins.kept.data() + first_bin;
  int64_t count = 0;
  double least = kInf;
  for (int64_t c = first_bin; c < last_bin; ++c) {
    kept[count] = static_cast<int32_t>(c);
    count += perf[c] < least;
    least = std::min(least, perf[c]);
  }
  return count;
}

// One table: every (option, state) moved into its bin; each bin keeps the
// least perf (the first in (option, state) order on a tie); a bin is kept
// if its perf beats every bin below it. Returns how many are kept: their
// bins go to `cells`, their new states to `next`, and, per kept bin, its
// previous state * `width` + the winning option's index in the table's row
// (`option_ids`) to `trace` (room for num_bins).
//
// The bins are cut into chunks (`chunks` shares them among threads; each
// chunk makes its bins' updates in (option, state) order: the same winners
// as one pass), cut where the states stand, so each holds about as many.
int64_t step(const States& now, const double* weight, const double* option_perf, const int64_t* option_ids,
             int64_t num_options, int64_t width, double capacity, double bin_size, int64_t num_bins, Bins& bins,
             Chunks& chunks, std::vector<int64_t>& cells, uint32_t* trace, States& next) {
  const auto num_states = static_cast<int64_t>(now.memory.size());
  const double* memory = now.memory.data();
  const double* perf = now.perf.data();
  // A chunk per 4096 updates at most, up to 4 per worker.
  const int64_t updates = num_options * num_states;
  const int64_t num_chunks = std::max<int64_t>(1, std::min<int64_t>(4 * chunks.workers(), updates / 4096));
  std::vector<int64_t> bounds{0};
  for (int64_t k = 1; k < num_chunks; ++k) {
    const auto cell = static_cast<int64_t>(memory[k * num_states / num_chunks] / bin_size);
    bounds.push_back(std::clamp(cell, bounds.back(), num_bins));
  }
  bounds.push_back(num_bins);
  std::vector<int64_t> num_kept_within(num_chunks);
  chunks.run(num_chunks, [&](int64_t chunk, int worker) {
    auto& span = bins.workers[worker].span;
    span.resize(num_options);
    for (int64_t o = 0; o < num_options; ++o) {
      auto first = [&](int64_t cell) {
        return first_at_or_above(memory, num_states, weight[o], capacity, bin_size, static_cast<double>(cell));
      };
      span[o] = {first(bounds[chunk]), first(bounds[chunk + 1])};
    }
    scatter(memory, perf, weight, option_perf, span, bounds[chunk], bounds[chunk + 1], bin_size, bins,
            bins.workers[worker]);
    num_kept_within[chunk] = keep_within(bins, bounds[chunk], bounds[chunk + 1]);
  });
  // A bin is kept if it beats every bin below it: within its chunk, and the
  // least of the chunks below. The chunk's bins kept within it fall in perf,
  // so those that also beat the chunks below are the last of them.
  std::vector<int64_t> first_kept(num_chunks), offset(num_chunks + 1, 0);
  double least_below = kInf;  // the least perf of the chunks below
  for (int64_t chunk = 0; chunk < num_chunks; ++chunk) {
    const int32_t* kept = bins.kept.data() + bounds[chunk];
    const int64_t count = num_kept_within[chunk];
    first_kept[chunk] = std::partition_point(kept, kept + count, [&](int32_t c) {
                          return !(bins.perf[c] < least_below);
                        }) - kept;
    offset[chunk + 1] = offset[chunk] + count - first_kept[chunk];
    if (count > 0) least_below = std::min(least_below, bins.perf[kept[count - 1]]);
  }
  const int64_t num_kept = offset[num_chunks];
  cells.resize(num_kept);
  next.memory.resize(num_kept);
  next.perf.resize(num_kept);
  chunks.run(num_chunks, [&](int64_t chunk, int) {
    const int32_t* kept = bins.kept.data() + bounds[chunk];
    for (int64_t i = first_kept[chunk], k = offset[chunk]; i < num_kept_within[chunk]; ++i, ++k) {
      const int64_t c = kept[i], o = bins.winner[c] >> 32, s = bins.winner[c] & 0xffffffff;
      cells[k] = c;
      trace[k] = static_cast<uint32_t>(s * width + option_ids[o]);
      next.memory[k] = memory[s] + weight[o];
      next.perf[k] = bins.perf[c];
    }
  });
  return num_kept;
}

void check_vector(const at::Tensor& t, int64_t dim, const char* what) {
  EMBNB_CHECK(t.dim() == dim && t.scalar_type() == at::kDouble && t.device().is_cpu(), "knapsack: ", what,
              " must be a ", dim, "-D float64 CPU tensor, got ", t.sizes(), " ", t.scalar_type());
}

void check_bins(double bin_size, int64_t num_bins) {
  EMBNB_CHECK(num_bins >= 1 && num_bins <= std::numeric_limits<int32_t>::max() && bin_size > 0,
              "knapsack: num_bins must be in [1, 2**31) and bin_size > 0, got ", num_bins, " and ", bin_size);
}

template <typename Int>
at::Tensor longs(const std::vector<Int>& values) {
  at::Tensor out = at::empty({static_cast<int64_t>(values.size())}, at::TensorOptions().dtype(at::kLong));
  std::copy(values.begin(), values.end(), out.data_ptr<int64_t>());
  return out;
}

at::Tensor doubles(const std::vector<double>& values) {
  at::Tensor out = at::empty({static_cast<int64_t>(values.size())}, at::TensorOptions().dtype(at::kDouble));
  std::copy(values.begin(), values.end(), out.data_ptr<double>());
  return out;
}

at::Tensor doubles(const std::vector<double>& values, int64_t n) {
  return doubles(std::vector<double>(values.begin(), values.begin() + n));
}

using Step = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>;

// One table added to the states (memory, perf); options are the table's
// allowed ones (weights, perfs), their indices in the result are 0..n-1.
Step knapsack_step_cpu(const at::Tensor& memory, const at::Tensor& perf, const at::Tensor& weights,
                       const at::Tensor& perfs, double capacity, double bin_size, int64_t num_bins) {
  check_vector(memory, 1, "memory");
  check_vector(perf, 1, "perf");
  check_vector(weights, 1, "weights");
  check_vector(perfs, 1, "perfs");
  EMBNB_CHECK(memory.numel() == perf.numel(), "knapsack: ", memory.numel(), " state memories but ",
              perf.numel(), " state perfs");
  EMBNB_CHECK(weights.numel() == perfs.numel(), "knapsack: ", weights.numel(), " option weights but ",
              perfs.numel(), " option perfs");
  check_bins(bin_size, num_bins);
  const at::Tensor mem_c = memory.contiguous(), perf_c = perf.contiguous();
  const double* state_memory = mem_c.data_ptr<double>();
  for (int64_t s = 1; s < memory.numel(); ++s) {  // step's passes stop at the first state past the bins
    EMBNB_CHECK(state_memory[s - 1] <= state_memory[s], "knapsack: the states' memory must rise (a step's kept ",
                "bins are in bin order); state ", s, " has ", state_memory[s], " after ", state_memory[s - 1]);
  }
  const at::Tensor weights_c = weights.contiguous(), perfs_c = perfs.contiguous();
  States now{std::vector<double>(mem_c.data_ptr<double>(), mem_c.data_ptr<double>() + mem_c.numel()),
             std::vector<double>(perf_c.data_ptr<double>(), perf_c.data_ptr<double>() + perf_c.numel())};
  const int64_t width = weights.numel(), stride = std::max<int64_t>(width, 1);
  EMBNB_CHECK(memory.numel() * stride <= kMaxTraced, "knapsack: ", memory.numel(), " states x ", width,
              " options must be at most 2**32 (a step's winners are traced in 32 bits)");
  std::vector<int64_t> ids(width);
  std::iota(ids.begin(), ids.end(), 0);
  Bins bins(num_bins, 1);
  Chunks alone(0);  // one table: not worth a thread
  std::vector<int64_t> cells;
  std::vector<uint32_t> trace(num_bins);
  States next;
  const int64_t num_kept = step(now, weights_c.data_ptr<double>(), perfs_c.data_ptr<double>(), ids.data(), width, stride,
                                capacity, bin_size, num_bins, bins, alone, cells,
                                trace.data(), next);
  std::vector<int64_t> options(num_kept), states(num_kept);
  for (int64_t k = 0; k < num_kept; ++k) {
    states[k] = trace[k] / stride;
    options[k] = trace[k] % stride;
  }
  return {longs(cells), longs(options), longs(states), doubles(next.perf), doubles(next.memory),
          doubles(bins.perf, num_bins)};
}

using Run = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>;

// Writes each final state's option per table into `frontier` [states,
// tables], from the largest memory (the last bin) down; `trace` holds each
// step's previous state * width + option per kept bin, table t's from
// offsets[t]. Rows are traced in blocks, table by table from the last: a
// block's rows stay in cache while each table's column is written, and each
// step's winners are read where they lie together (a row at a time would
// read them scattered; a table at a time would write each row a byte
// apart). Blocks are independent: `chunks` shares them among threads.
template <typename Out>
void trace_back(const uint32_t* trace, const std::vector<int64_t>& offsets, int64_t width, int64_t num_tables,
                int64_t num_states, Chunks& chunks, Out* frontier) {
  constexpr int64_t kBlock = 64;
  chunks.run((num_states + kBlock - 1) / kBlock, [&](int64_t block, int) {
    int64_t state[kBlock];
    const int64_t first = block * kBlock, rows = std::min(kBlock, num_states - first);
    for (int64_t row = 0; row < rows; ++row) state[row] = num_states - 1 - (first + row);
    for (int64_t t = num_tables - 1; t >= 0; --t) {
      const uint32_t* step = trace + offsets[t];
      Out* out = frontier + first * num_tables + t;
      for (int64_t row = 0; row < rows; ++row) {
        const uint32_t entry = step[state[row]];
        out[row * num_tables] = static_cast<Out>(entry % width);
        state[row] = entry / width;
      }
    }
  });
}

// Every table in order from the empty plan: weights and perfs are
// [tables, options], inf perf where an option is not allowed. Returns the
// frontier (each final state's option per table, [states, tables], from the
// largest memory down, as Knapsack.frontier orders it; uint8 where options
// fit a byte, else int32: the frontier is states x tables), and the final
// states' bins, perfs and memories (in bin order) and the last table's least
// perf per bin. Each step's winners are kept in `workspace` (int32, grown
// as needed), only to trace the frontier back: a caller that runs the
// knapsack again passes the same one, and its memory is not allocated (and
// faulted in) again, most of a run's time otherwise.
Run knapsack_run_cpu(const at::Tensor& weights, const at::Tensor& perfs, double capacity, double bin_size,
                     int64_t num_bins, const std::optional<at::Tensor>& workspace) {
  check_vector(weights, 2, "weights");
  check_vector(perfs, 2, "perfs");
  EMBNB_CHECK(weights.sizes() == perfs.sizes(), "knapsack: weights ", weights.sizes(), " and perfs ",
              perfs.sizes(), " differ in shape");
  check_bins(bin_size, num_bins);
  const at::Tensor weights_c = weights.contiguous(), perfs_c = perfs.contiguous();
  const int64_t num_tables = weights.size(0), width = std::max<int64_t>(weights.size(1), 1);
  EMBNB_CHECK(num_bins * width <= kMaxTraced, "knapsack: num_bins x options per table must be at most 2**32 ",
              "(a step's winners are traced in 32 bits), got ", num_bins, " x ", width);
  at::Tensor trace = workspace.has_value() ? *workspace : at::empty({0}, at::TensorOptions().dtype(at::kInt));
  EMBNB_CHECK(trace.dim() == 1 && trace.scalar_type() == at::kInt && trace.device().is_cpu() &&
                  trace.is_contiguous(),
              "knapsack: workspace must be a contiguous 1-D int32 CPU tensor, got ", trace.sizes(), " ",
              trace.scalar_type());
  const double* weight = weights_c.data_ptr<double>();
  const double* perf = perfs_c.data_ptr<double>();
  States now{{0.0}, {0.0}}, next;
  // Helpers for torch's other intra-op threads.
  Chunks chunks(std::max(0, at::get_num_threads() - 1));
  Bins bins(num_bins, chunks.workers());
  std::vector<int64_t> cells, offsets{0};
  std::vector<double> allowed_weight, allowed_perf;
  std::vector<int64_t> allowed_ids;
  for (int64_t t = 0; t < num_tables; ++t) {
    allowed_weight.clear();
    allowed_perf.clear();
    allowed_ids.clear();
    for (int64_t o = 0; o < weights.size(1); ++o) {
      const double p = perf[t * weights.size(1) + o];
      if (std::isfinite(p)) {
        allowed_weight.push_back(weight[t * weights.size(1) + o]);
        allowed_perf.push_back(p);
        allowed_ids.push_back(o);
      }
    }
    const int64_t used = offsets.back();
    if (trace.numel() < used + num_bins) {  // room for every bin; resize_ keeps what is traced
      trace.resize_({std::max(used + num_bins, trace.numel() + trace.numel() / 2)});
    }
    const int64_t num_kept = step(now, allowed_weight.data(), allowed_perf.data(), allowed_ids.data(),
                                  static_cast<int64_t>(allowed_ids.size()), width, capacity, bin_size, num_bins,
                                  bins, chunks, cells, reinterpret_cast<uint32_t*>(trace.data_ptr<int32_t>()) + used,
                                  next);
    std::swap(now, next);
    offsets.push_back(used + num_kept);
  }
  const auto num_states = static_cast<int64_t>(now.perf.size());
  const bool bytes = weights.size(1) <= 256;
  at::Tensor frontier =
      at::empty({num_states, num_tables}, at::TensorOptions().dtype(bytes ? at::kByte : at::kInt));
  const auto* traced = reinterpret_cast<const uint32_t*>(trace.data_ptr<int32_t>());
  if (bytes) {
    trace_back(traced, offsets, width, num_tables, num_states, chunks, frontier.data_ptr<uint8_t>());
  } else {
    trace_back(traced, offsets, width, num_tables, num_states, chunks, frontier.data_ptr<int32_t>());
  }
  return {frontier, longs(cells), doubles(now.perf), doubles(now.memory),
          num_tables ? doubles(bins.perf, num_bins) : doubles({})};
}

}  // namespace
}  // namespace embnb

// Each source registers its own ops with TORCH_LIBRARY_FRAGMENT (see loader.py).
TORCH_LIBRARY_FRAGMENT(embnb, m) {
  m.def(
      "knapsack_step(Tensor memory, Tensor perf, Tensor weights, Tensor perfs, float capacity, "
      "float bin_size, int num_bins) -> (Tensor cells, Tensor option, Tensor state, Tensor perf, "
      "Tensor memory, Tensor least)");
  m.def(
      "knapsack_run(Tensor weights, Tensor perfs, float capacity, float bin_size, int num_bins, "
      "Tensor(a!)? workspace=None) -> "
      "(Tensor frontier, Tensor cells, Tensor perf, Tensor memory, Tensor least)");
}

TORCH_LIBRARY_IMPL(embnb, CPU, m) {
  m.impl("knapsack_step", &embnb::knapsack_step_cpu);
  m.impl("knapsack_run", &embnb::knapsack_run_cpu);
}
