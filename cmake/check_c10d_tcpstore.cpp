// Compiled by CMake (CMakeLists.txt) to learn whether LibTorch's
// c10d::TCPStore client can be used here: framework/store/c10d_client_store.cpp
// needs exactly these calls.
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

int main() {
  c10d::TCPStoreOptions options;
  options.port = 1;
  options.isServer = false;
  options.waitWorkers = false;
  options.timeout = std::chrono::milliseconds(1);
  try {
    c10d::TCPStore store("127.0.0.1", options);
    store.set("k", std::vector<uint8_t>{1});
    store.wait({"k"}, std::chrono::milliseconds(1));
    return static_cast<int>(store.get("k").size() + store.add("n", 1) + store.check({"k"}));
  } catch (const c10::Error&) {
    return 1;
  }
}
