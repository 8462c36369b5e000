// lltm-cpu's fused pointwise passes alone, one instruction set's build
// (pointwise_<isa>.cpp, compiled beside this with -DISA=<its namespace>):
// nanoseconds per element of each pass over `rows` x `state_size` on one
// thread, the fastest of `reps` calls.  Built and run by pointwise_pass.py.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <type_traits>
#include <vector>

#include "pointwise.h"

namespace {

using lltm_cpu::opmath_type;

template <typename T>
std::vector<T> random_values(int64_t count, std::mt19937& generator) {
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<T> values(count);
  for (T& value : values) {
    value = static_cast<T>(normal(generator));
  }
  return values;
}

// The fastest of `reps` calls of `pass`, each after `prepare` (untimed),
// which restores what the pass updates in place, so that every call starts
// from the same values.
template <typename Prepare, typename Pass>
double best_ns_per_element(int reps, int64_t elements, const Prepare& prepare, const Pass& pass) {
  double best = 1e30;
  for (int rep = 0; rep <= reps; ++rep) {  // the first call touches the memory, and is not counted
    prepare();
    const auto start = std::chrono::steady_clock::now();
    pass();
    const double ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - start).count();
    best = rep == 0 ? best : std::min(best, ns);
  }
  return best / static_cast<double>(elements);
}

template <typename T>
void run(const char* dtype, int64_t rows, int64_t S, int reps) {
  using acc_t = opmath_type<T>;
  std::mt19937 generator(0);
  const int64_t n = rows * S;
  const auto gates_in = random_values<T>(3 * n, generator), bias = random_values<T>(3 * S, generator);
  const auto cell_in = random_values<acc_t>(n, generator), product = random_values<acc_t>(3 * n, generator);
  const auto grad_h_in = random_values<acc_t>(n, generator), grad_cell_in = random_values<acc_t>(n, generator);
  const auto saved_gates = random_values<T>(3 * n, generator), saved_tanh = random_values<T>(n, generator);
  const auto grad_output = random_values<T>(n, generator);
  // A cell state far below zero, as an LLTM's can drift to (no forget gate
  // bounds it): tanh's exp(2c) then falls below FLT_MIN.
  std::vector<acc_t> cell_far_below(cell_in);
  for (acc_t& value : cell_far_below) {
    value = value - acc_t(60);
  }
  std::vector<T> gates(3 * n), output(n), tanh_cell(n), grad_gates(3 * n), grad_bias(3 * S), new_cell(n);
  std::vector<acc_t> cell(n), grad_h(n), grad_cell(n), bias_sum(3 * S);
  const auto report = [&](const char* pass, double ns) { std::printf("%s %s %.3f\n", pass, dtype, ns); };
  const auto sequence_forward = [&](const std::vector<acc_t>& cell_from, bool saving) {
    return best_ns_per_element(
        reps, n,
        [&] {
          std::copy(gates_in.begin(), gates_in.end(), gates.begin());
          std::copy(cell_from.begin(), cell_from.end(), cell.begin());
        },
        [&] {
          lltm_cpu::ISA::sequence_forward_step(lltm_cpu::SequenceForwardStep<T>{
              gates.data(), bias.data(), product.data(), cell.data(), nullptr, output.data(),
              saving ? tanh_cell.data() : nullptr, nullptr, 0, rows, S, 0, S});
        });
  };

  report("sequence_forward_inference", sequence_forward(cell_in, false));
  report("sequence_forward_saving", sequence_forward(cell_in, true));
  report("sequence_forward_saving,cell<-44", sequence_forward(cell_far_below, true));
  report("sequence_backward", best_ns_per_element(
                                  reps, n,
                                  [&] {
                                    std::copy(grad_h_in.begin(), grad_h_in.end(), grad_h.begin());
                                    std::copy(grad_cell_in.begin(), grad_cell_in.end(), grad_cell.begin());
                                  },
                                  [&] {
                                    lltm_cpu::ISA::sequence_backward_step(lltm_cpu::SequenceBackwardStep<T>{
                                        grad_output.data(), S, false, grad_h.data(), grad_cell.data(),
                                        saved_gates.data(), saved_tanh.data(), grad_gates.data(), bias_sum.data(),
                                        nullptr, 0, rows, S, 0, S});
                                  }));
  if constexpr (std::is_same_v<T, acc_t>) {  // the cell's passes, in float32 (they take their state in T)
    report("cell_forward", best_ns_per_element(
                               reps, n, [&] { std::copy(gates_in.begin(), gates_in.end(), gates.begin()); },
                               [&] {
                                 lltm_cpu::ISA::forward_pointwise(
                                     lltm_cpu::ForwardPointers<T>{gates.data(), bias.data(), cell_in.data(),
                                                                  output.data(), new_cell.data(), tanh_cell.data(),
                                                                  rows, S},
                                     0, S);
                               }));
    report("cell_backward", best_ns_per_element(
                                reps, n, [] {},
                                [&] {
                                  lltm_cpu::ISA::backward_pointwise(
                                      lltm_cpu::BackwardPointers<T>{grad_h_in.data(), grad_cell_in.data(),
                                                                    saved_gates.data(), saved_tanh.data(),
                                                                    grad_gates.data(), grad_bias.data(),
                                                                    new_cell.data(), rows, S},
                                      0, S);
                                }));
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s ROWS STATE_SIZE REPS\n", argv[0]);
    return 2;
  }
  const int64_t rows = std::atoll(argv[1]), S = std::atoll(argv[2]);
  const int reps = std::atoi(argv[3]);
  run<float>("float32", rows, S, reps);
  run<c10::BFloat16>("bfloat16", rows, S, reps);
  return 0;
}
