#include "framework/comm/link_probe.hpp"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <stdexcept>
#include <thread>
#include <utility>

namespace ddp {
namespace {

constexpr int kNameWords = 16;  // a host name of up to 63 bytes, as int32 words (longer ones cut)

std::string thisHostName() {
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0 || name[0] == '\0') return "?";
  return name;
}

std::string bytesText(int64_t bytes) {
  if (bytes >= (1 << 20) && bytes % (1 << 20) == 0) return fmt::format("{} MiB", bytes >> 20);
  if (bytes >= 1024 && bytes % 1024 == 0) return fmt::format("{} KiB", bytes >> 10);
  return fmt::format("{} bytes", bytes);
}

}  // namespace

HostLinks HostLinks::grouped(std::vector<std::string> hostOfRank, int64_t bytes) {
  HostLinks links;
  links.hostOfRank = std::move(hostOfRank);
  links.bytes = bytes;
  for (size_t r = 0; r < links.hostOfRank.size(); ++r) {
    if (std::find(links.hosts.begin(), links.hosts.end(), links.hostOfRank[r]) == links.hosts.end()) {
      links.hosts.push_back(links.hostOfRank[r]);
      links.leaders.push_back(static_cast<int>(r));
    }
  }
  return links;
}

std::vector<int> HostLinks::ranksOf(int h) const {
  std::vector<int> ranks;
  for (size_t r = 0; r < hostOfRank.size(); ++r) {
    if (hostOfRank[r] == hosts.at(static_cast<size_t>(h))) ranks.push_back(static_cast<int>(r));
  }
  return ranks;
}

double HostLinks::mbitPerSecond(int e) const {
  const double s = edgeSeconds.at(static_cast<size_t>(e));
  return s > 0 ? static_cast<double>(bytes) * 8 / s / 1e6 : 0;
}

int HostLinks::slowHost(double factor, double minExtraSeconds) const {
  const int n = hostCount();
  if (n < 3 || static_cast<int>(edgeSeconds.size()) != n) return -1;
  const double fastest = *std::min_element(edgeSeconds.begin(), edgeSeconds.end());
  auto slow = [&](int e) {
    const double s = edgeSeconds[static_cast<size_t>(e)];
    return s >= factor * fastest && s - fastest >= minExtraSeconds;
  };
  int found = -1;
  for (int h = 0; h < n; ++h) {
    // Host h's way in is edge h - 1 (from the host before it), its way out edge h.
    if (!slow((h + n - 1) % n) || !slow(h)) continue;
    if (found >= 0) return -1;  // two: the links are slow, not one host
    found = h;
  }
  return found;
}

std::string HostLinks::describeSlow(int h) const {
  const int n = hostCount();
  const int in = (h + n - 1) % n, out = h;
  const auto fastest = std::min_element(edgeSeconds.begin(), edgeSeconds.end()) - edgeSeconds.begin();
  const int f = static_cast<int>(fastest);
  const double ratio = std::min(edgeSeconds[in], edgeSeconds[out]) / edgeSeconds[f];
  return fmt::format("host {} (rank{} {}): its links moved {} at {:.3g} Mbit/s in and {:.3g} Mbit/s out, {:.0f}x slower "
                     "than the fastest ({} -> {}, {:.3g} Mbit/s)",
                     hosts[h], ranksOf(h).size() == 1 ? "" : "s", fmt::join(ranksOf(h), ","), bytesText(bytes),
                     mbitPerSecond(in), mbitPerSecond(out), ratio, hosts[f], hosts[(f + 1) % n], mbitPerSecond(f));
}

std::vector<std::string> hostNames(ProcessGroup& group) {
  const int world = group.size();
  at::Tensor mine = at::zeros({kNameWords}, at::kInt);
  const std::string name = thisHostName();
  std::memcpy(mine.data_ptr(), name.data(), std::min<size_t>(name.size(), kNameWords * 4 - 1));
  std::vector<std::string> names;
  if (world == 1) return {name};
  at::Tensor all = at::zeros({world * kNameWords}, at::kInt);
  group.allgather(mine, all)->wait();
  const char* bytes = static_cast<const char*>(all.data_ptr());
  for (int r = 0; r < world; ++r) {
    const char* at = bytes + static_cast<size_t>(r) * kNameWords * 4;
    names.emplace_back(at, strnlen(at, kNameWords * 4));
  }
  return names;
}

HostLinks probeHostLinks(ProcessGroup& group, const std::vector<std::string>& hostOfRank, int64_t bytes,
                         Milliseconds timeout, int rounds) {
  HostLinks links = HostLinks::grouped(hostOfRank, bytes);
  const int n = links.hostCount();
  // NCCL has no tagged point-to-point: nothing is probed there (the same
  // on every rank: one backend).
  if (n < 2 || group.backendName() == "nccl") return links;
  const int rank = group.rank();
  // The leaders start together: a leader that came late would make the
  // edge into it, and the one out of the leader before it, look slow.
  group.barrier({timeout})->wait();
  const auto me = std::find(links.leaders.begin(), links.leaders.end(), rank);
  at::Tensor seconds = at::zeros({n}, at::kDouble);
  for (int round = 0; round < std::max(1, rounds) && me != links.leaders.end(); ++round) {
    const int h = static_cast<int>(me - links.leaders.begin());
    const int next = links.leaders[static_cast<size_t>((h + 1) % n)];
    const int prev = links.leaders[static_cast<size_t>((h + n - 1) % n)];
    at::Tensor out = at::ones({std::max<int64_t>(1, bytes / 4)}, at::kInt);
    at::Tensor in = at::empty_like(out);
    at::Tensor ackOut = at::ones({1}, at::kInt), ackIn = at::zeros({1}, at::kInt);
    const auto start = std::chrono::steady_clock::now();
    // Posted together: with 2 hosts, next and prev are the same leader.
    WorkPtr received = group.recv(in, prev, {kProbeTag, timeout});
    WorkPtr sent = group.send(out, next, {kProbeTag, timeout});
    WorkPtr acked = group.recv(ackIn, next, {kProbeTag + 1, timeout});
    WorkPtr ack;
    // This edge's time ends with next's acknowledgement, whenever prev's
    // bytes (the edge before, timed by prev) come.
    bool edgeTimed = false;
    // The operations time out by themselves; this is the backstop.
    const auto limit = start + (timeout == kUseGroupTimeout ? group.options().timeout : timeout) +
                       std::chrono::seconds(5);
    while (!edgeTimed || !ack) {
      if (std::chrono::steady_clock::now() > limit) {
        throw std::runtime_error(ack ? fmt::format("link probe: rank {} did not acknowledge rank {}'s bytes before "
                                                   "the timeout",
                                                   next, rank)
                                     : fmt::format("link probe: rank {} did not send its bytes to rank {} before the "
                                                   "timeout",
                                                   prev, rank));
      }
      if (!ack && received->isCompleted()) {
        received->wait();  // rethrows a failure
        ack = group.send(ackOut, prev, {kProbeTag + 1, timeout});
      }
      if (!edgeTimed && acked->isCompleted()) {
        acked->wait();
        const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        // The fastest round: a leader descheduled once (a busy machine) is not a slow link.
        if (round == 0 || took < seconds[h].item<double>()) seconds[h] = took;
        edgeTimed = true;
      }
      if (!edgeTimed || !ack) std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    ack->wait();
    sent->wait();
  }
  group.allreduce(seconds, {ReduceOp::Sum, timeout})->wait();
  const double* s = seconds.data_ptr<double>();
  links.edgeSeconds.assign(s, s + n);
  return links;
}

}  // namespace ddp
