// Configure-time check (benchmarks/CMakeLists.txt): does LibTorch's own
// c10d::ProcessGroupGloo compile and link here, with the calls that
// benchmarks/collective_impls.cpp makes? PyTorch's wheels, for one, ship
// its header without the Gloo headers that it includes. Never run.
#ifndef USE_C10D_GLOO
#define USE_C10D_GLOO 1
#endif
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <chrono>
#include <string>
#include <vector>

static int useEveryCall() {
  const std::chrono::milliseconds timeout(1000);
  c10d::TCPStoreOptions storeOptions;
  storeOptions.isServer = true;
  storeOptions.port = 0;
  storeOptions.numWorkers = 1;
  storeOptions.waitWorkers = false;
  storeOptions.timeout = timeout;
  auto store = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", storeOptions);
  int port = store->getPort();
  c10::intrusive_ptr<c10d::Store> base = store;

  auto options = c10d::ProcessGroupGloo::Options::create(timeout);
  options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
  auto group = c10::make_intrusive<c10d::ProcessGroupGloo>(base, 0, 1, options);

  std::vector<at::Tensor> tensors{at::zeros({4})};
  std::vector<std::vector<at::Tensor>> lists{{at::zeros({4})}};
  c10d::BroadcastOptions broadcastOptions;
  broadcastOptions.rootRank = 0;
  c10::intrusive_ptr<c10d::Work> work = group->allreduce(tensors);
  work->wait();
  group->broadcast(tensors, broadcastOptions)->wait();
  group->allgather(lists, tensors)->wait();
  try {
    group->reduce_scatter(tensors, lists)->wait();
  } catch (const c10::Error& e) {
    port += static_cast<int>(std::string(e.what_without_backtrace()).size());
  }
  group->barrier()->wait();
  return port;
}

int main(int argc, char**) { return argc > 1000 ? useEveryCall() : 0; }
