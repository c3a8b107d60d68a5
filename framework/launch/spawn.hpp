// Starting child processes: the one fork/exec that the launcher, ddp-bench
// and the multi-process tests share.
//
// Contract
// - spawnProcess() executes `program` (a path, not searched in PATH; empty:
//   argv[0]) with argv, and the given environment or, when none is given,
//   this process's. "/proc/self/exe" starts a copy of the running program.
//   Everything the child needs is prepared before fork(), so the child runs
//   only async-signal-safe calls until exec (the parent may have threads).
// - captureOutput: the child's stdout and stderr go to one pipe whose read
//   end (non-blocking, close-on-exec) is ChildProcess::outputFd; the caller
//   closes it. Otherwise the child inherits both.
// - ownProcessGroup: the child leads a new process group, so one kill(-pid)
//   reaches whatever it starts in turn. Both parent and child set the group,
//   so it exists when spawnProcess() returns.
// - dieWithParent: the child gets deathSignal (default SIGKILL) when the
//   spawning thread ends (PR_SET_PDEATHSIG; the process's main thread lives
//   as long as the process); a parent that died before the child could ask
//   for that is noticed, and the child exits 127 instead of running
//   orphaned. deathSignal starts with its default action and unblocked in
//   the child, so it ends the child unless the program itself handles it.
// - Signals: the child starts with the default action for every signal the
//   parent handles (so no parent handler runs in it, even before exec), and
//   with the parent's ignored signals and signal mask otherwise.
// - A child that cannot exec prints "cannot start <path>: <reason>" to its
//   stderr and exits 127. fork() or pipe() failures throw std::runtime_error.
// - inProcessEntry (optional) saves the child from loading the program
//   again: when it is set, `program` is this very executable and this
//   process runs a single thread, the child does not exec. It does what
//   exec would have done (the environment replaced, every close-on-exec
//   descriptor closed, the signal state above) and then calls
//   inProcessEntry(argv) in the copy of this process that fork() made, and
//   exits with what it returns, its streams flushed and its static objects
//   left as they are (they are the parent's, shared copy-on-write:
//   destroying them would copy pages only to free them). A LibTorch
//   program spends about 0.8 s of CPU loading before main; the copy pays
//   none of it. The entry re-reads whatever the program had read from its
//   environment before main (OMP_NUM_THREADS, say), because that was read
//   by the parent. With more than one thread (a thread might hold a lock
//   that the copy would wait on for ever; OpenBLAS's idle pool is stopped
//   first, as its own fork handler would), or with DDP_SPAWN=exec, the
//   child execs as always. ChildProcess::inProcess tells which happened.
// - runProcess() spawns with captureOutput, reads the output until the child
//   closes it, and reaps the child: a program run to its end, as popen()
//   would, but with no shell between (arguments are passed as they are).
#pragma once

#include <signal.h>
#include <sys/types.h>

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "framework/launch/rank_env.hpp"

namespace ddp {

struct SpawnOptions {
  std::vector<std::string> argv;  // argv[0]: the program's name (its path, unless `program` is set)
  std::string program;            // the file executed; empty: argv[0]
  std::optional<EnvMap> environment;
  bool captureOutput = false;
  bool ownProcessGroup = false;
  bool dieWithParent = false;
  int deathSignal = SIGKILL;  // with dieWithParent
  std::function<int(const std::vector<std::string>& argv)> inProcessEntry;
  // inProcessEntry runs `program`'s own main, linked into this process
  // though this is another executable (the tests run ddp-run so): a copy
  // may stand for `program`, not only for "/proc/self/exe".
  bool entryRunsProgram = false;
};

struct ChildProcess {
  pid_t pid = -1;
  int outputFd = -1;  // with captureOutput
  bool inProcess = false;  // the child runs inProcessEntry (no exec)
};

// The number of threads this process runs (/proc/self/task); 0 if unknown.
int threadCount();

// Calls a main(argc, argv) with `argv` (an inProcessEntry's arguments).
int callMain(int (*main)(int, char**), const std::vector<std::string>& argv);

ChildProcess spawnProcess(const SpawnOptions& options);

struct FinishedProcess {
  int status = 0;      // as waitpid() gives it: see describeExitStatus
  std::string output;  // stdout and stderr together
  bool inProcess = false;  // the child ran inProcessEntry
};

// Runs the program to its end (captureOutput is implied) and returns its
// wait status and output.
FinishedProcess runProcess(SpawnOptions options);

// "exited with code 3", "killed by signal 9 (Killed)": a waitpid() status.
std::string describeExitStatus(int status);

}  // namespace ddp
