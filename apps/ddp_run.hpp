// ddp-run's main(), for a program that links ddp-run's objects and runs it
// without exec: the test suite starts ddp-run as a copy of itself (fork, no
// exec), as ddp-run starts its own ranks, and so skips loading LibTorch
// again (tests/test_support.hpp, runDdpRun).
//
// Contract
// - ddpRunMain(argc, argv) is ddp-run's main: the same arguments, output
//   and exit code.
// - Where ddp-run starts a copy of itself by exec ("/proc/self/exe": ranks
//   of an elastic node 0, DDP_SPAWN=exec, a launcher with threads), the
//   program that embeds it must run ddpRunMain when so started; the tests'
//   main does when DDP_TESTS_RUN_AS=ddp-run is set, and the copy that
//   runDdpRun makes sets it for what it starts.
#pragma once

int ddpRunMain(int argc, char** argv);
