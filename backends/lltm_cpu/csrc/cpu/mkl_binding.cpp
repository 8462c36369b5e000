// MKL's functions, found once per process, and MKL's per-thread thread
// count (SingleThreaded): see mkl_binding.h and blas.h.
#include "mkl_binding.h"

#include "blas.h"

namespace lltm_cpu {
namespace blas {
namespace detail {

const Mkl& mkl() {
  static const Mkl functions = [] {
    Mkl found;
    // Only a torch built with MKL (its own thread-setting entry point is
    // there): another BLAS may export sgemm_ with other integer sizes.
    if (find_symbol("MKL_Set_Num_Threads_Local") == nullptr) {
      return found;
    }
    found.sgemm = reinterpret_cast<FortranGemm>(find_symbol("sgemm_"));
    found.dgemm = reinterpret_cast<FortranGemm>(find_symbol("dgemm_"));
    found.sgemm_pack_get_size = reinterpret_cast<PackGetSize>(find_symbol("cblas_sgemm_pack_get_size"));
    found.sgemm_pack = reinterpret_cast<Pack>(find_symbol("cblas_sgemm_pack"));
    found.sgemm_compute = reinterpret_cast<Compute>(find_symbol("cblas_sgemm_compute"));
    found.gemm_bf16 = reinterpret_cast<GemmBf16>(find_symbol("cblas_gemm_bf16bf16f32"));
    found.set_num_threads_local = reinterpret_cast<SetNumThreadsLocal>(find_symbol("MKL_Set_Num_Threads_Local"));
    return found;
  }();
  return functions;
}

}  // namespace detail

SingleThreaded::SingleThreaded(bool enable) {
  const detail::SetNumThreadsLocal set = detail::mkl().set_num_threads_local;
  if (enable && set != nullptr) {
    previous_ = set(1);
    active_ = true;
  }
}

SingleThreaded::~SingleThreaded() {
  if (active_) {
    detail::mkl().set_num_threads_local(previous_);  // 0: back to MKL's global setting
  }
}

}  // namespace blas
}  // namespace lltm_cpu
