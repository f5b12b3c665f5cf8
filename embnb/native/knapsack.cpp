// torch.ops.embnb.knapsack_step: one table added to the DP proposer's
// knapsack on one memory axis; the native twin of
// embnb/planner/knapsack.py (Knapsack._add_table_on_one_axis). It keeps
// exactly the numpy version's states: the same float sums (state + option,
// in double), the same bins (floor(memory / bin_size)), the same winner per
// bin (the least perf; on a tie the first in (option, state) order) and the
// same dominance rule (a bin is kept if its perf beats every bin below it).
// numpy needs a dozen passes and temporaries per table; this is one pass
// over (option, state) and one over the bins.
//
// Result: (cells, option, state, perf, memory, least): per kept bin, its
// index, the option (an index into `weights`) and previous state that won
// it, its perf and exact memory; `least` is every bin's least perf (inf:
// unreached), dominated or not.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <tuple>
#include <vector>

namespace embnb {
namespace {

using Step = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>;

Step knapsack_step_cpu(const at::Tensor& memory, const at::Tensor& perf, const at::Tensor& weights,
                       const at::Tensor& perfs, double capacity, double bin_size, int64_t num_bins) {
  for (const auto* t : {&memory, &perf, &weights, &perfs}) {
    TORCH_CHECK(t->dim() == 1 && t->scalar_type() == at::kDouble && t->device().is_cpu(),
                "knapsack_step takes 1-D float64 CPU tensors, got ", t->sizes(), " ", t->scalar_type());
  }
  TORCH_CHECK(memory.numel() == perf.numel(), "knapsack_step: ", memory.numel(), " state memories but ",
              perf.numel(), " state perfs");
  TORCH_CHECK(weights.numel() == perfs.numel(), "knapsack_step: ", weights.numel(), " option weights but ",
              perfs.numel(), " option perfs");
  TORCH_CHECK(num_bins >= 1 && bin_size > 0, "knapsack_step: num_bins must be >= 1 and bin_size > 0, got ",
              num_bins, " and ", bin_size);
  const at::Tensor mem_c = memory.contiguous(), perf_c = perf.contiguous();
  const at::Tensor weights_c = weights.contiguous(), perfs_c = perfs.contiguous();
  const double* mem = mem_c.data_ptr<double>();
  const double* state_perf = perf_c.data_ptr<double>();
  const double* weight = weights_c.data_ptr<double>();
  const double* option_perf = perfs_c.data_ptr<double>();
  const int64_t num_states = memory.numel(), num_options = weights.numel();

  at::Tensor least = at::full({num_bins}, std::numeric_limits<double>::infinity(), memory.options());
  double* bin_perf = least.data_ptr<double>();
  std::vector<int64_t> win_option(num_bins), win_state(num_bins);
  std::vector<double> win_memory(num_bins);
  for (int64_t o = 0; o < num_options; ++o) {
    for (int64_t s = 0; s < num_states; ++s) {
      const double moved = mem[s] + weight[o];
      if (!(moved <= capacity)) continue;
      const double bin = std::floor(moved / bin_size);
      if (!(bin < static_cast<double>(num_bins))) continue;
      const int64_t cell = static_cast<int64_t>(bin);
      const double total = state_perf[s] + option_perf[o];
      if (total < bin_perf[cell]) {  // strictly less: the first of equal perfs stays
        bin_perf[cell] = total;
        win_option[cell] = o;
        win_state[cell] = s;
        win_memory[cell] = moved;
      }
    }
  }
  std::vector<int64_t> kept;
  double below = std::numeric_limits<double>::infinity();  // least perf of the bins below
  for (int64_t c = 0; c < num_bins; ++c) {
    if (bin_perf[c] < below) kept.push_back(c);
    if (bin_perf[c] < below) below = bin_perf[c];
  }
  const auto k = static_cast<int64_t>(kept.size());
  at::Tensor cells = at::empty({k}, memory.options().dtype(at::kLong));
  at::Tensor options = at::empty({k}, cells.options());
  at::Tensor states = at::empty({k}, cells.options());
  at::Tensor perf_out = at::empty({k}, memory.options());
  at::Tensor memory_out = at::empty({k}, memory.options());
  int64_t* cell_p = cells.data_ptr<int64_t>();
  int64_t* option_p = options.data_ptr<int64_t>();
  int64_t* state_p = states.data_ptr<int64_t>();
  double* perf_p = perf_out.data_ptr<double>();
  double* memory_p = memory_out.data_ptr<double>();
  for (int64_t i = 0; i < k; ++i) {
    const int64_t c = kept[i];
    cell_p[i] = c;
    option_p[i] = win_option[c];
    state_p[i] = win_state[c];
    perf_p[i] = bin_perf[c];
    memory_p[i] = win_memory[c];
  }
  return {cells, options, states, perf_out, memory_out, least};
}

}  // namespace
}  // namespace embnb

// Each source registers its own ops with TORCH_LIBRARY_FRAGMENT (see loader.py).
TORCH_LIBRARY_FRAGMENT(embnb, m) {
  m.def(
      "knapsack_step(Tensor memory, Tensor perf, Tensor weights, Tensor perfs, float capacity, "
      "float bin_size, int num_bins) -> (Tensor cells, Tensor option, Tensor state, Tensor perf, "
      "Tensor memory, Tensor least)");
}

TORCH_LIBRARY_IMPL(embnb, CPU, m) {
  m.impl("knapsack_step", &embnb::knapsack_step_cpu);
}
