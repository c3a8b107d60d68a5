// Compute threads per rank: ATen's intra-op pool and the BLAS library's own.
//
// ATen's at::set_num_threads sets OpenMP's (and MKL's) thread count, but
// OpenBLAS built on pthreads (Debian's libopenblas0-pthread, the one that
// makes LibTorch's CPU matmuls fast) keeps a pool of its own, sized to the
// machine's cores when it loads and read from OPENBLAS_NUM_THREADS only
// then. Two ranks on a 2-core host, each told to use 1 thread, then still
// run 2 BLAS threads each, 4 on 2 cores, and OpenBLAS's threads spin while
// they wait: the matmul-heavy gpt step at world size 2 was 1.2-1.4x
// PyTorch's, even with no communication at all (docs/performance.md,
// "The gpt step at world size 2", issue 44).
//
// Contract
// - setComputeThreads(n) sets ATen's intra-op threads to n and, when the
//   process has OpenBLAS (found by its symbol openblas_set_num_threads),
//   OpenBLAS's pool to n too. n < 1 is taken as 1.
// - blasThreads() is OpenBLAS's pool size, or -1 when the process has no
//   OpenBLAS (another BLAS, or a static one whose symbols are hidden).
// - stopBlasThreads() ends OpenBLAS's worker threads now, as OpenBLAS's
//   own fork handler does before every fork(); its next call starts them
//   again. The launcher calls it so that it is single-threaded when it
//   starts a rank as a copy of itself (launch/spawn.hpp). Nothing happens
//   without OpenBLAS.
// - Process-wide: ddp-run's ranks, ddp-bench's workers and the Trainer
//   (training.threads) call it wherever they set ATen's count.
#pragma once

namespace ddp {

void setComputeThreads(int threads);
int blasThreads();
void stopBlasThreads();

}  // namespace ddp
