// What only the emulated build has: torch.ops.lltm_cuda_emulation.*, for lltm-cuda's tests to
// look inside the emulated GPU (its settings, what it was asked) and at the host-side helpers.
#include "../cuda/lltm_common.cuh"

#ifndef LLTM_CUDA_EMULATE
#error "emulation_ops.cpp belongs to the emulated build only (setup.py defines LLTM_CUDA_EMULATE)"
#endif

#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <torch/library.h>

#include <string>
#include <tuple>
#include <vector>

namespace {

using namespace lltm_cuda;

// The settings the launches run with (read from the LLTM_CUDA_EMULATE_* variables).
std::tuple<int64_t, int64_t, int64_t, std::string, int64_t> settings() {
  const rt::Settings& s = rt::emulation_settings();
  const char* order = s.order == rt::Order::kForward ? "forward" : s.order == rt::Order::kReverse ? "reverse" : "shuffle";
  return {s.multiprocessors, s.blocks_per_multiprocessor, s.threads_per_block, order, int64_t(s.seed)};
}

// [multiprocessor count queries, occupancy queries, launches, threads run] since the library loaded.
std::vector<int64_t> counters() {
  const rt::Counters& c = rt::counters();
  return {c.multiprocessor_queries.load(), c.occupancy_queries.load(), c.launches.load(), c.threads_run.load()};
}

// The vector width (elements of `dtype`) the pointwise kernels would take over these buffers,
// each read in vectors of its own elements (an opmath buffer is float for the half types): the
// decision launch_pointwise makes, through the same vectorizable().
int64_t vector_width(c10::ScalarType dtype, int64_t state_size, const std::vector<at::Tensor>& buffers) {
  int64_t width = 1;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, dtype, "lltm_cuda_emulation::vector_width", [&] {
    std::vector<Buffer> list;
    for (const at::Tensor& t : buffers) {
      list.push_back({t.const_data_ptr(), int(t.element_size())});
    }
    launch_pointwise<scalar_t>(1, state_size, list, [&](auto vec) { width = decltype(vec)::value; });
  });
  return width;
}

}  // namespace

TORCH_LIBRARY(lltm_cuda_emulation, m) {
  m.def("settings() -> (int multiprocessors, int blocks_per_multiprocessor, int threads_per_block, str order, "
        "int seed)", &settings);
  m.def("counters() -> int[]", &counters);
  m.def("vector_width(ScalarType dtype, int state_size, Tensor[] buffers) -> int", &vector_width);
}
