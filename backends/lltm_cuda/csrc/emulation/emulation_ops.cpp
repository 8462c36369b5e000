// What only the emulated build has: torch.ops.lltm_cuda_emulation.*, for lltm-cuda's tests to
// look inside the emulated GPU (its settings, what it was asked) and at the host-side helpers.
#include "../cuda/lltm_common.cuh"

#ifndef LLTM_CUDA_EMULATE
#error "emulation_ops.cpp belongs to the emulated build only (setup.py defines LLTM_CUDA_EMULATE)"
#endif

#include <torch/csrc/stable/library.h>

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
int64_t vector_width(ScalarType dtype, int64_t state_size, std::vector<Tensor> buffers) {
  int64_t width = 1;
  LLTM_CUDA_DISPATCH_FLOATING(dtype, "lltm_cuda_emulation::vector_width", [&] {
    std::vector<Buffer> list;
    for (const Tensor& t : buffers) {
      list.push_back(buffer(t));
    }
    launch_pointwise<scalar_t>(1, state_size, list, [&](auto vec) { width = decltype(vec)::value; });
  });
  return width;
}

}  // namespace

STABLE_TORCH_LIBRARY(lltm_cuda_emulation, m) {
  m.def("settings() -> (int multiprocessors, int blocks_per_multiprocessor, int threads_per_block, str order, "
        "int seed)");
  m.def("counters() -> int[]");
  m.def("vector_width(ScalarType dtype, int state_size, Tensor[] buffers) -> int");
}

// CompositeExplicitAutograd: they take no tensor to dispatch on (or only CPU ones), and run anywhere.
STABLE_TORCH_LIBRARY_IMPL(lltm_cuda_emulation, CompositeExplicitAutograd, m) {
  m.impl("settings", TORCH_BOX(&settings));
  m.impl("counters", TORCH_BOX(&counters));
  m.impl("vector_width", TORCH_BOX(&vector_width));
}
