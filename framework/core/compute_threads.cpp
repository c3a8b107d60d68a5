#include "framework/core/compute_threads.hpp"

#include <ATen/Parallel.h>
#include <dlfcn.h>

#include <algorithm>

namespace ddp {
namespace {

using SetThreads = void (*)(int);
using GetThreads = int (*)();

template <typename F>
F openblasSymbol(const char* name) {
  return reinterpret_cast<F>(::dlsym(RTLD_DEFAULT, name));
}

}  // namespace

void setComputeThreads(int threads) {
  threads = std::max(1, threads);
  at::set_num_threads(threads);
  if (auto set = openblasSymbol<SetThreads>("openblas_set_num_threads")) set(threads);
}

int blasThreads() {
  auto get = openblasSymbol<GetThreads>("openblas_get_num_threads");
  return get ? get() : -1;
}

void stopBlasThreads() {
  using Shutdown = int (*)();
  if (auto shutdown = openblasSymbol<Shutdown>("blas_thread_shutdown_")) shutdown();
}

}  // namespace ddp
