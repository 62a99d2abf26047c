// src/meshtrain/kernels/cpu/threads.cpp
//
// Compute threads of this process. Debian's oneDNN is built on the OpenMP runtime
// (DNNL_CPU_RUNTIME == DNNL_RUNTIME_OMP in dnnl_config.h, libdnnl links libgomp), so one
// omp_set_num_threads governs both our loops and the GEMMs.
#include <omp.h>

#include "meshtrain/core/error.h"
#include "meshtrain/kernels/kernels.h"

namespace meshtrain::kernels {

void set_num_threads(int threads) {
  MT_CHECK(threads >= 1, "set_num_threads({}): need at least one thread", threads);
  // omp_set_num_threads sets the calling thread's ICV only; the training loop calls kernels
  // from the thread that configured them, which is what we rely on.
  omp_set_num_threads(threads);
}

int num_threads() { return omp_get_max_threads(); }

}  // namespace meshtrain::kernels
