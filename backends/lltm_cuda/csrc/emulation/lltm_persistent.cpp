// The emulated build compiles lltm-cuda's own CUDA sources as C++ (setup.py defines
// LLTM_CUDA_EMULATE): this file is only the way in for a C++ compiler, which goes by the suffix.
#include "../cuda/lltm_persistent.cu"
