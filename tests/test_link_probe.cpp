// The probe of the links between hosts (comm/link_probe.hpp; issue 42,
// stragglers across hosts): which host it blames for given edge times, and
// the probe itself over thread ranks that count as hosts of their own.
// (Links really slowed, on the simulated cluster: tests/bench/faults_test.sh.)
#include <catch2/catch.hpp>

#include <ATen/ATen.h>

#include <algorithm>
#include <mutex>
#include <set>

#include "framework/comm/link_probe.hpp"
#include "tests/test_support.hpp"

using namespace ddp;
using Catch::Contains;

namespace {

HostLinks linksOf(std::vector<std::string> hostOfRank, std::vector<double> edges) {
  HostLinks links = HostLinks::grouped(std::move(hostOfRank), 64 * 1024);
  links.edgeSeconds = std::move(edges);
  return links;
}

}  // namespace

TEST_CASE("link probe: the host both of whose links are slow is blamed, and no other", "[link_probe]") {
  // Edge e: host e -> host e + 1. Host h's way in is edge h - 1, its way out edge h.
  const std::vector<std::string> three = {"a", "b", "c"};
  CHECK(linksOf(three, {0.001, 0.05, 0.05}).slowHost() == 2);
  CHECK(linksOf(three, {0.05, 0.001, 0.05}).slowHost() == 0);
  CHECK(linksOf(three, {0.05, 0.05, 0.001}).slowHost() == 1);
  // One slow edge: a link, not a host.
  CHECK(linksOf(three, {0.001, 0.05, 0.001}).slowHost() == -1);
  // All alike: nobody stands out.
  CHECK(linksOf(three, {0.05, 0.05, 0.05}).slowHost() == -1);
  CHECK(linksOf(three, {0.001, 0.0011, 0.0012}).slowHost() == -1);
  // 5x the fastest, but under 10 ms more: the jitter of a busy machine.
  CHECK(linksOf(three, {0.0001, 0.0005, 0.0005}).slowHost() == -1);
  CHECK(linksOf(three, {0.002, 0.011, 0.011}).slowHost() == -1);
  CHECK(linksOf(three, {0.002, 0.0125, 0.0125}).slowHost() == 2);
  // Just past the factor, and just under it.
  CHECK(linksOf(three, {0.01, 0.041, 0.041}).slowHost() == 2);
  CHECK(linksOf(three, {0.01, 0.039, 0.041}).slowHost() == -1);
  // Two hosts share their only link: nobody can be blamed.
  CHECK(linksOf({"a", "b"}, {0.001, 0.05}).slowHost() == -1);
  // Four hosts, ranks 2 and 3 on the third: that host.
  const HostLinks four = linksOf({"a", "b", "c", "c", "d"}, {0.001, 0.08, 0.06, 0.001});
  CHECK(four.slowHost() == 2);
  CHECK(four.ranksOf(2) == std::vector<int>{2, 3});
  // Two slow hosts side by side (edges 0-1, 1-2, 2-3 slow): not one host.
  CHECK(linksOf({"a", "b", "c", "d"}, {0.05, 0.05, 0.05, 0.001}).slowHost() == -1);
  // The description names the host, its ranks and the figures.
  const std::string text = four.describeSlow(2);
  CHECK_THAT(text, Contains("host c (ranks 2,3)"));
  CHECK_THAT(text, Contains("64 KiB at 6.55 Mbit/s in and 8.74 Mbit/s out, 60x slower than the fastest (a -> b, 524 Mbit/s)"));
  CHECK_THAT(linksOf(three, {0.001, 0.05, 0.05}).describeSlow(2), Contains("host c (rank 2)"));
  CHECK(four.mbitPerSecond(0) == Approx(64 * 1024 * 8 / 0.001 / 1e6));
}

TEST_CASE("link probe over thread ranks: every rank gets the same edges, one per host", "[link_probe]") {
  // Host names are given: four thread ranks count as 1, 2 or 3 hosts.
  for (const std::vector<std::string>& hostOfRank :
       std::vector<std::vector<std::string>>{{"a", "a", "a", "a"}, {"a", "a", "b", "b"}, {"a", "b", "b", "c"}}) {
    std::mutex mutex;
    std::vector<std::vector<double>> seen(hostOfRank.size());
    std::vector<std::string> names(hostOfRank.size());
    const auto errors = ddp::test::runRanks("gloo", static_cast<int>(hostOfRank.size()), [&](int r, ProcessGroup& g) {
      const HostLinks links = probeHostLinks(g, hostOfRank, 64 * 1024);
      const std::vector<std::string> real = hostNames(g);
      std::lock_guard<std::mutex> lock(mutex);
      seen[static_cast<size_t>(r)] = links.edgeSeconds;
      names[static_cast<size_t>(r)] = real.at(static_cast<size_t>(r));
      ddp::test::expectOnRank(real.size() == hostOfRank.size(), "a host name per rank");
    });
    REQUIRE(ddp::test::joinErrors(errors) == "");
    const std::set<std::string> hosts(hostOfRank.begin(), hostOfRank.end());
    INFO(hostOfRank.size() << " ranks on " << hosts.size() << " host(s)");
    if (hosts.size() == 1) {
      CHECK(seen[0].empty());
    } else {
      CHECK(seen[0].size() == hosts.size());
      for (double s : seen[0]) CHECK(s > 0);
    }
    for (const auto& s : seen) CHECK(s == seen[0]);
    // Threads of one process: one real host name, the same for each.
    for (const auto& n : names) CHECK((n == names[0] && !n.empty()));
  }
}
