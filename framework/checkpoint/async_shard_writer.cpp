#include "framework/checkpoint/async_shard_writer.hpp"

#include <sys/stat.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <atomic>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <stdexcept>
#include <thread>

#include "framework/checkpoint/sharded_checkpoint.hpp"
#include "framework/core/errors.hpp"

namespace ddp {

namespace {

bool exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

std::string firstLine(const std::string& text) { return text.substr(0, text.find('\n')); }

}  // namespace

struct AsyncShardWriter::Impl {
  std::thread thread;
  mutable std::mutex mutex;
  std::condition_variable wake;
  bool running = false;
  bool cancelled = false;
  std::string error;  // of the save that ran last; reported once
  std::string dir;
  double seconds = 0;

  void run(const std::string& dir, int rank, int world, const std::string& saveId,
           const std::vector<StateSlice>& slices, const nlohmann::json& meta, std::chrono::milliseconds timeout,
           const std::function<bool()>& stillCurrent) {
    const auto started = std::chrono::steady_clock::now();
    std::string failure;
    try {
      writeShardFile(dir, rank, saveId, slices);
    } catch (const std::exception& e) {
      failure = firstLine(e.what());
      std::ofstream marker(dir + "/" + shardFailureFileName(rank, saveId));
      marker << failure << "\n";
    }
    bool indexed = false;
    if (failure.empty() && rank == 0) failure = finish(dir, world, saveId, meta, timeout, stillCurrent, indexed);
    std::lock_guard<std::mutex> lock(mutex);
    if (!failure.empty() && !cancelled) {
      error = fmt::format("checkpoint (written in the background): {}", failure);
    }
    if (rank == 0 && !indexed) removeShardSave(dir, saveId);  // no index, no checkpoint: its files go too
    seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    running = false;
  }

  // Rank 0: every rank's file (or its failure), then the index.
  std::string finish(const std::string& dir, int world, const std::string& saveId, const nlohmann::json& meta,
                     std::chrono::milliseconds timeout, const std::function<bool()>& stillCurrent, bool& indexed) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      std::vector<int> missing;
      for (int r = 1; r < world; ++r) {
        if (exists(dir + "/" + shardFailureFileName(r, saveId))) {
          std::ifstream marker(dir + "/" + shardFailureFileName(r, saveId));
          std::string why;
          std::getline(marker, why);
          return fmt::format("rank {} could not write its shard of {}: {}", r, dir, why);
        }
        if (!exists(dir + "/" + shardFileName(r, saveId))) missing.push_back(r);
      }
      if (missing.empty()) break;
      std::unique_lock<std::mutex> lock(mutex);
      if (cancelled) return "";
      if (std::chrono::steady_clock::now() >= deadline) {
        return fmt::format("the shards of rank(s) {} did not reach {} within {} s", fmt::join(missing, ","), dir,
                           timeout.count() / 1000);
      }
      wake.wait_for(lock, std::chrono::milliseconds(20));
    }
    try {
      writeShardIndex(dir, world, saveId, meta, stillCurrent);
      indexed = true;
    } catch (const std::exception& e) {
      return firstLine(e.what());
    }
    return "";
  }

  void join() {
    if (thread.joinable()) thread.join();
  }

  void rethrow() {
    std::string failure;
    {
      std::lock_guard<std::mutex> lock(mutex);
      failure = std::exchange(error, "");
    }
    if (!failure.empty()) throw std::runtime_error(failure);
  }
};

AsyncShardWriter::AsyncShardWriter() : impl_(std::make_unique<Impl>()) {}

AsyncShardWriter::~AsyncShardWriter() {
  try {
    cancel();
  } catch (...) {
  }
}

void AsyncShardWriter::start(const std::string& dir, int rank, int world, const std::string& saveId,
                             std::vector<StateSlice> slices, nlohmann::json meta, std::chrono::milliseconds timeout,
                             std::function<bool()> stillCurrent) {
  wait();
  {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    impl_->running = true;
    impl_->cancelled = false;
    impl_->dir = dir;
  }
  impl_->thread = std::thread([this, dir, rank, world, saveId, slices = std::move(slices), meta = std::move(meta),
                               timeout, stillCurrent = std::move(stillCurrent)] {
    impl_->run(dir, rank, world, saveId, slices, meta, timeout, stillCurrent);
  });
}

bool AsyncShardWriter::busy() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return impl_->running;
}

void AsyncShardWriter::check() {
  bool done;
  {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    done = !impl_->running;
  }
  if (done) {
    impl_->join();
    impl_->rethrow();
  }
}

void AsyncShardWriter::wait() {
  impl_->join();
  impl_->rethrow();
}

void AsyncShardWriter::cancel() {
  {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    impl_->cancelled = true;
  }
  impl_->wake.notify_all();
  impl_->join();
  std::lock_guard<std::mutex> lock(impl_->mutex);
  impl_->error.clear();
}

std::string AsyncShardWriter::lastDir() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return impl_->dir;
}

double AsyncShardWriter::lastWriteSeconds() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return impl_->seconds;
}

}  // namespace ddp
