// The pointwise passes for any CPU: vec.h's portable vectors,
// compiled with the baseline flags only.
#define CPU_CAPABILITY DEFAULT
#include "pointwise_impl.h"
