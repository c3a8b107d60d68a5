#include "framework/launch/spawn.hpp"

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <dirent.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <stdexcept>

#include "framework/core/compute_threads.hpp"
#include "framework/core/errors.hpp"
#include "framework/core/system.hpp"

namespace ddp {

namespace {

// What exec does to descriptors: those marked close-on-exec go. Runs in
// the child of a single-threaded parent, so allocating is safe.
void closeCloseOnExecDescriptors() {
  DIR* dir = ::opendir("/proc/self/fd");
  if (dir == nullptr) return;
  const int own = ::dirfd(dir);
  std::vector<int> closing;
  while (const dirent* entry = ::readdir(dir)) {
    if (entry->d_name[0] < '0' || entry->d_name[0] > '9') continue;
    const int fd = std::atoi(entry->d_name);
    if (fd == own) continue;
    const int flags = ::fcntl(fd, F_GETFD);
    if (flags >= 0 && (flags & FD_CLOEXEC) != 0) closing.push_back(fd);
  }
  ::closedir(dir);
  for (int fd : closing) ::close(fd);
}

// The child may skip exec only for this very program, from a process with
// one thread (no other thread can hold a lock the copy would need).
bool mayRunInProcess(const SpawnOptions& options, const std::string& program) {
  if (!options.inProcessEntry) return false;
  if (const char* mode = std::getenv("DDP_SPAWN"); mode != nullptr && std::string(mode) == "exec") return false;
  if (program != "/proc/self/exe" && !options.entryRunsProgram) {
    std::error_code ec;
    const auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
    if (ec || std::filesystem::weakly_canonical(program, ec) != self) return false;
  }
  if (threadCount() == 1) return true;
  // OpenBLAS's idle pool is the usual other thread; its fork handler would
  // end it anyway.
  stopBlasThreads();
  return threadCount() == 1;
}

}  // namespace

int threadCount() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("Threads:", 0) == 0) return std::atoi(line.c_str() + 8);
  }
  return 0;
}

int callMain(int (*main)(int, char**), const std::vector<std::string>& argv) {
  std::vector<std::string> copy = argv;  // main may modify its arguments
  std::vector<char*> pointers;
  for (auto& a : copy) pointers.push_back(a.data());
  pointers.push_back(nullptr);
  return main(static_cast<int>(copy.size()), pointers.data());
}

ChildProcess spawnProcess(const SpawnOptions& options) {
  DDP_CHECK(!options.argv.empty(), "spawnProcess needs a program");
  // Everything the child touches is built here, before fork().
  std::vector<std::string> args = options.argv;
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::vector<std::string> envStrings;
  std::vector<char*> envp;
  if (options.environment) {
    for (const auto& kv : *options.environment) envStrings.push_back(kv.first + "=" + kv.second);
    for (auto& s : envStrings) envp.push_back(s.data());
    envp.push_back(nullptr);
  }
  const std::string program = options.program.empty() ? args[0] : options.program;
  const std::string cannotStart = fmt::format("cannot start {}: ", program);
  const bool inProcess = mayRunInProcess(options, program);
  // Nothing buffered in this process may be written twice, by the copy too.
  std::cout.flush();
  std::cerr.flush();
  std::fflush(nullptr);

  int pipeFds[2] = {-1, -1};
  if (options.captureOutput && ::pipe2(pipeFds, O_CLOEXEC) != 0) {
    fail<std::runtime_error>("spawn {}: pipe: {}", program, errnoText(errno));
  }
  // No signal handler of the parent may run in the child: every signal is
  // blocked across fork(), and the child resets the handled ones to their
  // default action before it restores the mask (posix_spawn does the same).
  sigset_t blockAll, parentMask, childMask;
  sigfillset(&blockAll);
  ::pthread_sigmask(SIG_SETMASK, &blockAll, &parentMask);
  childMask = parentMask;
  if (options.dieWithParent) sigdelset(&childMask, options.deathSignal);
  struct sigaction defaultAction {};
  defaultAction.sa_handler = SIG_DFL;
  sigemptyset(&defaultAction.sa_mask);

  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid != 0) ::pthread_sigmask(SIG_SETMASK, &parentMask, nullptr);
  if (pid < 0) {
    const int err = errno;
    if (options.captureOutput) {
      ::close(pipeFds[0]);
      ::close(pipeFds[1]);
    }
    fail<std::runtime_error>("spawn {}: fork: {}", program, errnoText(err));
  }
  if (pid == 0) {
    for (int s = 1; s < NSIG; ++s) {
      struct sigaction current {};
      if (::sigaction(s, nullptr, &current) != 0) continue;
      const bool handled = (current.sa_flags & SA_SIGINFO) != 0 ||
                           (current.sa_handler != SIG_DFL && current.sa_handler != SIG_IGN);
      if (handled || (options.dieWithParent && s == options.deathSignal)) ::sigaction(s, &defaultAction, nullptr);
    }
    if (options.ownProcessGroup) ::setpgid(0, 0);
    if (options.dieWithParent) {
      ::prctl(PR_SET_PDEATHSIG, options.deathSignal);
      if (::getppid() != parent) ::_exit(127);  // the parent died before prctl
    }
    if (options.captureOutput) {
      ::dup2(pipeFds[1], STDOUT_FILENO);
      ::dup2(pipeFds[1], STDERR_FILENO);
    }
    ::sigprocmask(SIG_SETMASK, &childMask, nullptr);
    if (inProcess) {
      closeCloseOnExecDescriptors();
      if (options.environment) environ = envp.data();  // lives until exit: this frame never returns
      int code = 1;
      try {
        code = options.inProcessEntry(args);
      } catch (const std::exception& e) {
        std::cerr << program << ": " << e.what() << std::endl;
      } catch (...) {
        std::cerr << program << ": an unknown exception" << std::endl;
      }
      // The static objects are the launcher's, shared copy-on-write:
      // destroying them would copy hundreds of pages only to free them
      // (0.4 s of CPU a rank). The streams are flushed, as exit() would.
      std::cout.flush();
      std::cerr.flush();
      std::fflush(nullptr);
      ::_exit(code);
    }
    if (options.environment) {
      ::execve(program.c_str(), argv.data(), envp.data());
    } else {
      ::execv(program.c_str(), argv.data());
    }
    const char* reason = ::strerror(errno);
    (void)!::write(STDERR_FILENO, cannotStart.data(), cannotStart.size());
    (void)!::write(STDERR_FILENO, reason, std::strlen(reason));
    (void)!::write(STDERR_FILENO, "\n", 1);
    ::_exit(127);
  }
  // The child does the same: whichever runs first, a kill(-pid) that
  // follows this call reaches the group.
  if (options.ownProcessGroup) ::setpgid(pid, pid);
  ChildProcess child;
  child.pid = pid;
  child.inProcess = inProcess;
  if (options.captureOutput) {
    ::close(pipeFds[1]);
    ::fcntl(pipeFds[0], F_SETFL, O_NONBLOCK);
    child.outputFd = pipeFds[0];
  }
  return child;
}

FinishedProcess runProcess(SpawnOptions options) {
  options.captureOutput = true;
  const ChildProcess child = spawnProcess(options);
  FinishedProcess finished;
  finished.inProcess = child.inProcess;
  char buffer[65536];
  for (;;) {
    const ssize_t n = ::read(child.outputFd, buffer, sizeof(buffer));
    if (n > 0) {
      finished.output.append(buffer, static_cast<size_t>(n));
    } else if (n == 0) {
      break;
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
      pollfd readable{child.outputFd, POLLIN, 0};
      ::poll(&readable, 1, -1);
    } else if (errno != EINTR) {
      break;
    }
  }
  ::close(child.outputFd);
  while (::waitpid(child.pid, &finished.status, 0) < 0 && errno == EINTR) {
  }
  return finished;
}

std::string describeExitStatus(int status) {
  if (WIFEXITED(status)) return fmt::format("exited with code {}", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return fmt::format("killed by signal {} ({})", WTERMSIG(status), ::strsignal(WTERMSIG(status)));
  return fmt::format("ended with status {}", status);
}

}  // namespace ddp
