// torch.ops.embnb.knapsack_step and knapsack_run: the DP proposer's knapsack
// on one memory axis, one table at a time or every table in one call; the
// native twin of embnb/planner/knapsack.py (Knapsack._add_table_on_one_axis).
// It keeps exactly the numpy version's states: the same float sums (state +
// option, in double), the same bins (floor(memory / bin_size)), the same
// winner per bin (the least perf; on a tie the first in (option, state)
// order) and the same dominance rule (a bin is kept if its perf beats every
// bin below it). numpy needs a dozen passes and temporaries per table, and
// a call per table; this is one pass over (option, state), stopping where an
// option's moved states leave the bins, and one over the bins, and one call
// per run.
//
// knapsack_step's result: (cells, option, state, perf, memory, least): per
// kept bin, its index, the option (an index into `weights`) and previous
// state that won it, its perf and exact memory; `least` is every bin's least
// perf (inf: unreached), dominated or not. knapsack_run returns the frontier
// traced back from the last table's states (see there).
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include "checks.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <tuple>
#include <vector>

namespace embnb {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// The knapsack's states: per kept bin, its exact memory and perf.
struct States {
  std::vector<double> memory, perf;
};

// Each bin's winner, reused across tables (sized to the bins once), and
// each state's bin and total under the option being added (scratch).
struct Bins {
  std::vector<double> perf, memory, total_of;
  std::vector<int64_t> option, state, cell_of;
  explicit Bins(int64_t n) : perf(n), memory(n), option(n), state(n) {}
};

// One table: every (option, state) moved into its bin; each bin keeps the
// least perf (the first in (option, state) order on a tie); a bin is kept
// if its perf beats every bin below it. Kept bins go to `cells`, their
// winning option (its index in the table's row, via `option_ids`) and
// previous state to `options` and `states`, the new states to `next`.
void step(const States& now, const double* weight, const double* option_perf, const int64_t* option_ids,
          int64_t num_options, double capacity, double bin_size, int64_t num_bins, Bins& bins,
          std::vector<int64_t>& cells, std::vector<int32_t>& options, std::vector<int32_t>& states,
          States& next) {
  std::fill(bins.perf.begin(), bins.perf.end(), kInf);
  const auto num_states = static_cast<int64_t>(now.memory.size());
  const double* memory = now.memory.data();
  const double* perf = now.perf.data();
  bins.cell_of.resize(num_states);
  bins.total_of.resize(num_states);
  for (int64_t o = 0; o < num_options; ++o) {
    // First each state's bin and total, without touching the bins (a loop
    // the compiler can keep in registers), then the updates: about 15% faster
    // than both in one loop. The states come in bin order, so their memory
    // rises: the first state past the capacity or the last bin ends the pass.
    int64_t reached = 0;
    for (; reached < num_states; ++reached) {
      const double moved = memory[reached] + weight[o];
      // floor(q) < num_bins iff q < num_bins; q >= 0, so truncation is floor
      // (and needs no libm call).
      const double q = moved / bin_size;
      if (!(moved <= capacity) || !(q < static_cast<double>(num_bins))) break;
      bins.cell_of[reached] = static_cast<int64_t>(q);
      bins.total_of[reached] = perf[reached] + option_perf[o];
    }
    for (int64_t s = 0; s < reached; ++s) {
      const int64_t cell = bins.cell_of[s];
      const double total = bins.total_of[s];
      // Strictly less: the first of equal perfs stays. Written without a
      // branch (which bin wins is not predictable).
      const bool better = total < bins.perf[cell];
      bins.perf[cell] = better ? total : bins.perf[cell];
      bins.option[cell] = better ? option_ids[o] : bins.option[cell];
      bins.state[cell] = better ? s : bins.state[cell];
      bins.memory[cell] = better ? memory[s] + weight[o] : bins.memory[cell];
    }
  }
  next.memory.clear();
  next.perf.clear();
  double below = kInf;  // the least perf of the bins below
  for (int64_t c = 0; c < num_bins; ++c) {
    if (bins.perf[c] < below) {
      below = bins.perf[c];
      cells.push_back(c);
      options.push_back(static_cast<int32_t>(bins.option[c]));
      states.push_back(static_cast<int32_t>(bins.state[c]));
      next.memory.push_back(bins.memory[c]);
      next.perf.push_back(bins.perf[c]);
    }
  }
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
  std::vector<int64_t> ids(weights.numel());
  std::iota(ids.begin(), ids.end(), 0);
  Bins bins(num_bins);
  std::vector<int64_t> cells;
  std::vector<int32_t> options, states;
  States next;
  step(now, weights_c.data_ptr<double>(), perfs_c.data_ptr<double>(), ids.data(), weights.numel(), capacity,
       bin_size, num_bins, bins, cells, options, states, next);
  return {longs(cells), longs(options), longs(states), doubles(next.perf), doubles(next.memory),
          doubles(bins.perf, num_bins)};
}

using Run = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>;

// Writes each final state's option per table into `frontier` [states,
// tables], from the largest memory (the last bin) down. Rows are traced in
// blocks, table by table from the last: a block's rows stay in cache while
// each table's column is written, and each step's winners are read where
// they lie together (a row at a time would read them scattered; a table at a
// time would write each row a byte apart).
template <typename Out>
void trace_back(const std::vector<int32_t>& options, const std::vector<int32_t>& states,
                const std::vector<int64_t>& offsets, int64_t num_tables, int64_t num_states, Out* frontier) {
  constexpr int64_t kBlock = 64;
  std::vector<int64_t> state(kBlock);
  for (int64_t first = 0; first < num_states; first += kBlock) {
    const int64_t rows = std::min(kBlock, num_states - first);
    for (int64_t row = 0; row < rows; ++row) state[row] = num_states - 1 - (first + row);
    for (int64_t t = num_tables - 1; t >= 0; --t) {
      const int32_t* option = options.data() + offsets[t];
      const int32_t* previous = states.data() + offsets[t];
      Out* out = frontier + first * num_tables + t;
      for (int64_t row = 0; row < rows; ++row) {
        out[row * num_tables] = static_cast<Out>(option[state[row]]);
        state[row] = previous[state[row]];
      }
    }
  }
}

// Every table in order from the empty plan: weights and perfs are
// [tables, options], inf perf where an option is not allowed. Returns the
// frontier (each final state's option per table, [states, tables], from the
// largest memory down, as Knapsack.frontier orders it; uint8 where options
// fit a byte, else int32: the frontier is states x tables), and the final
// states' bins, perfs and memories (in bin order) and the last table's least
// perf per bin. Each step's winners stay here, only to trace the frontier
// back.
Run knapsack_run_cpu(const at::Tensor& weights, const at::Tensor& perfs, double capacity, double bin_size,
                     int64_t num_bins) {
  check_vector(weights, 2, "weights");
  check_vector(perfs, 2, "perfs");
  EMBNB_CHECK(weights.sizes() == perfs.sizes(), "knapsack: weights ", weights.sizes(), " and perfs ",
              perfs.sizes(), " differ in shape");
  check_bins(bin_size, num_bins);
  const at::Tensor weights_c = weights.contiguous(), perfs_c = perfs.contiguous();
  const int64_t num_tables = weights.size(0), width = weights.size(1);
  const double* weight = weights_c.data_ptr<double>();
  const double* perf = perfs_c.data_ptr<double>();
  States now{{0.0}, {0.0}}, next;
  Bins bins(num_bins);
  std::vector<int64_t> cells, offsets{0};
  std::vector<int32_t> options, states;  // per step: 32 bits hold any option or bin
  std::vector<double> allowed_weight, allowed_perf;
  std::vector<int64_t> allowed_ids;
  for (int64_t t = 0; t < num_tables; ++t) {
    allowed_weight.clear();
    allowed_perf.clear();
    allowed_ids.clear();
    for (int64_t o = 0; o < width; ++o) {
      const double p = perf[t * width + o];
      if (std::isfinite(p)) {
        allowed_weight.push_back(weight[t * width + o]);
        allowed_perf.push_back(p);
        allowed_ids.push_back(o);
      }
    }
    cells.clear();  // only the last table's bins are returned
    step(now, allowed_weight.data(), allowed_perf.data(), allowed_ids.data(),
         static_cast<int64_t>(allowed_ids.size()), capacity, bin_size, num_bins, bins, cells, options, states,
         next);
    std::swap(now, next);
    offsets.push_back(static_cast<int64_t>(options.size()));
  }
  const auto num_states = static_cast<int64_t>(now.perf.size());
  const bool bytes = width <= 256;
  at::Tensor frontier =
      at::empty({num_states, num_tables}, at::TensorOptions().dtype(bytes ? at::kByte : at::kInt));
  if (bytes) {
    trace_back(options, states, offsets, num_tables, num_states, frontier.data_ptr<uint8_t>());
  } else {
    trace_back(options, states, offsets, num_tables, num_states, frontier.data_ptr<int32_t>());
  }
  return {frontier, longs(cells), doubles(now.perf), doubles(now.memory),
          doubles(bins.perf, num_tables ? num_bins : 0)};
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
      "knapsack_run(Tensor weights, Tensor perfs, float capacity, float bin_size, int num_bins) -> "
      "(Tensor frontier, Tensor cells, Tensor perf, Tensor memory, Tensor least)");
}

TORCH_LIBRARY_IMPL(embnb, CPU, m) {
  m.impl("knapsack_step", &embnb::knapsack_step_cpu);
  m.impl("knapsack_run", &embnb::knapsack_run_cpu);
}
