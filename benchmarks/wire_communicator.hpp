// The wire: what the network itself allows, measured beside the backends.
//
// `ddp-bench collectives --impls tcp-wire,...` runs this "implementation":
// plain TCP sockets between every pair of ranks (the mesh of
// framework/comm/links.hpp, Nagle off), driven by one poll() loop per rank,
// moving exactly the bytes of the bandwidth-optimal algorithm of each
// operation and doing nothing else:
// - allreduce: a ring of 2(n-1) steps; each step sends one block (N/n
//   bytes) to the right while it receives one from the left;
// - reduce_scatter: the first n-1 of those steps;
// - allgather: a ring of n-1 steps of one input each;
// - broadcast: the root sends the whole message to every rank at once;
// - alltoall: every rank sends block j to rank j, all pairs at once;
// - gather / scatter: every rank sends to the root / the root to every
//   rank, at once;
// - sendrecv: rank 0 sends to the last rank, which sends it back.
// Both directions of a step run concurrently. There is no arithmetic, no
// worker thread, no pipelining of a reduction, no check that the ranks
// called the same operation and no message framing: for allreduce and
// reduce_scatter the result is not the sum (computes() is false, and
// --verify skips those points), for the others it is right.
//
// Over loopback its busbw is the ceiling that the kernel's two copies per
// byte and these cores put on any TCP implementation; on a simulated
// cluster, the shaped links'. A backend's busbw divided by the wire's, in
// the same run, says how much of the path it uses.
#pragma once

#include <memory>

#include "benchmarks/collective_impls.hpp"

namespace ddp::bench {

std::unique_ptr<Communicator> makeWireCommunicator(const Rendezvous& rendezvous);

}  // namespace ddp::bench
