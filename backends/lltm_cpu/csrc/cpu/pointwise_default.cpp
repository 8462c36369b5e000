// The pointwise passes for any CPU: at::vec's portable implementation,
// compiled with the baseline flags only.
#define CPU_CAPABILITY DEFAULT
#include "pointwise_impl.h"
