// The Trainer's elastic recovery (trainer.hpp, launch/elastic.hpp): when a
// collective fails because a rank is gone, or ranks wait to join, the
// members agree on a new membership, form its group, take the state of the
// member that got furthest (one broadcast of a serialized model and
// optimizer, as a checkpoint holds them, without a file), build the
// strategy again, and go on with the rest of the epoch dealt over the new
// world.
#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/serialize.h>

#include <algorithm>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "framework/comm/link_probe.hpp"
#include "framework/core/errors.hpp"
#include "framework/core/log.hpp"
#include "framework/experiment/callbacks/fault_injection.hpp"
#include "framework/experiment/trainer_impl.hpp"

namespace ddp {

namespace {

// For the tests: DDP_FAULT_RECOVERY=ID kills rank id ID in its first
// recovery (generation 1), once the new membership is decided, before the
// group forms: a failure during the recovery itself. "ID:synced" kills it
// later, once the group formed and the state is synced: the window between
// the recovery and the next step. "ID:host" (with either) kills its whole
// host (fault_injection.hpp's killThisHost).
void recoveryFault(int id, int64_t generation, bool synced) {
  const char* f = std::getenv("DDP_FAULT_RECOVERY");
  if (f == nullptr || std::atoi(f) != id || generation != 1 || std::getenv("DDP_ELASTIC_JOIN") != nullptr) return;
  if ((std::strstr(f, ":synced") != nullptr) != synced) return;
  if (std::strstr(f, ":host") != nullptr) killThisHost();
  ::raise(SIGKILL);
}

// A broken group is dropped off the critical path: its destructor may wait
// for its worker to notice the failure.
void retire(ProcessGroupPtr group) {
  if (!group) return;
  std::thread([g = std::move(group)]() mutable { g.reset(); }).detach();
}

std::string idsText(const std::vector<int>& ids) { return ids.empty() ? "none" : fmt::format("{}", fmt::join(ids, ",")); }

// Whether a collective's failure was a timeout (the backends' and Work's
// words for it), not a closed connection or an abort. (Ranks of one failed
// collective see either: those whose peer gave up first see it closed.
// Hence the rendezvous decides, from every member's report.)
bool timedOut(const std::string& why) {
  return why.find("before the timeout") != std::string::npos || why.find("timed out") != std::string::npos ||
         why.find("not completed after waiting") != std::string::npos;
}

// What the recovery probe sends over each link between hosts.
constexpr int64_t kRecoveryProbeBytes = 256 * 1024;
// Timeouts in a row at one step, every member alive, before the job stops.
constexpr int kMaxTimeoutsAtStep = 3;

}  // namespace

bool Trainer::recoverable(const std::exception& e) const {
  if (!impl_->rendezvous) return false;
  return dynamic_cast<const UsageError*>(&e) == nullptr && dynamic_cast<const NonFiniteLossError*>(&e) == nullptr &&
         dynamic_cast<const ElasticExcluded*>(&e) == nullptr &&
         dynamic_cast<const ElasticBelowMinimum*>(&e) == nullptr && dynamic_cast<const ElasticStalled*>(&e) == nullptr;
}

bool Trainer::recover(const std::string& why) { return reconfigure(why, /*broken=*/true); }

void Trainer::admitJoiners() { reconfigure("a rank asks to join", /*broken=*/false); }

bool Trainer::reconfigure(const std::string& why, bool broken) {
  Impl& s = *impl_;
  const auto start = trainer_detail::Clock::now();
  const ElasticMembership before = s.membership;
  // A save in the background: one with a lost rank can no longer complete
  // (rank 0 drops it: the previous checkpoint stays the newest); one when
  // ranks join completes first.
  if (s.asyncWriter) {
    if (broken) {
      s.asyncWriter->cancel();
    } else {
      s.asyncWriter->wait();
    }
  }
  if (broken) logInfo("elastic: a collective failed ({}); leaving generation {}", why, before.generation);
  // The optimizer comes back whole; the strategy, its gradient buckets and
  // the old group go.
  std::unique_ptr<torch::optim::Optimizer> optimizer = s.strategy->releaseOptimizer();
  s.strategy.reset();
  for (auto& p : s.model->parameters()) p.mutable_grad() = at::Tensor();
  retire(std::move(s.group));
  // What sent this rank to the rendezvous: the collective's failure, then
  // each failed attempt's.
  std::string failure = broken ? why : std::string();
  for (int attempt = 1;; ++attempt) {
    try {
      // Everyone came back, one after a timeout: nobody is gone, someone is
      // slow. The coordinator decides (membership.probeLinks), so every
      // member probes in formGroup, or none.
      s.membership = s.rendezvous->next(s.membership, s.steps, timedOut(failure));
      recoveryFault(s.rendezvous->id(), s.membership.generation, /*synced=*/false);
      if (s.membership.belowMinimum) {
        // Below --min-ranks: the member with the state saves it, all stop.
        const std::vector<int>& ids = s.membership.ids;
        if (s.rendezvous->id() == s.membership.sourceId) {
          const int64_t batch = std::max<int64_t>(1, s.consumed / config_.training.batchSize);
          s.releasedOptimizer = optimizer.get();
          s.writesAlone = true;
          writeCheckpoint(s.epoch, batch, {});
          s.log->setEnabled(true);
          s.log->line(fmt::format("elastic: {} rank(s) left (ids {}), fewer than --min-ranks {}; saved {}/checkpoints/"
                                  "{}; stopping",
                                  ids.size(), idsText(ids), options_.minRanks, options_.runDir,
                                  checkpointFileName(s.epoch, batch)));
        }
        s.rendezvous->finish();  // a joiner that waits is told at once: nothing to rejoin
        fail<ElasticBelowMinimum>(
            "elastic: {} rank(s) left (ids {}), fewer than --min-ranks {}; the job stops with a checkpoint of step {}. "
            "HINT: --resume continues from it",
            ids.size(), idsText(ids), options_.minRanks, s.membership.sourceSteps);
      }
      formGroup(*optimizer);
      // Inside the retry: DDP's construction allocates its buckets
      // collectively (gloo: in shared memory, through the store). A rank
      // lost then sends the members on to the next generation; the
      // optimizer comes back from a strategy that could not be built.
      makeStrategy(optimizer, /*statesEqual=*/true);
      break;
    } catch (const std::exception& e) {
      // !optimizer: a strategy that took it and then failed to build (one
      // whose factory takes the context by value) left nothing to retry with.
      if (!recoverable(e) || attempt >= 10 || !optimizer) throw;
      // Another rank lost while this generation formed: the next one.
      logInfo("elastic: generation {} failed while forming ({}); trying the next", s.membership.generation,
              errorLine(e));
      failure = errorLine(e);
      retire(std::move(s.group));
    }
  }
  shardData();
  s.log->setEnabled(isWriter());
  ++s.recoveries;
  std::vector<int> lost, joined;
  for (int id : before.ids) {
    if (s.membership.rankOf(id) < 0) lost.push_back(id);
  }
  for (int id : s.membership.ids) {
    if (before.rankOf(id) < 0) joined.push_back(id);
  }
  const double seconds = std::chrono::duration<double>(trainer_detail::Clock::now() - start).count();
  std::string cause = why.size() > 160 ? why.substr(0, 157) + "..." : why;
  s.log->line(fmt::format("elastic: generation {}: {}{}world {} -> {} (rank ids {}); state of rank id {} at step {}, "
                          "epoch {}; {} in {:.3f} s{}",
                          s.membership.generation, lost.empty() ? "" : fmt::format("lost rank id(s) {}; ", idsText(lost)),
                          joined.empty() ? "" : fmt::format("rank id(s) {} joined; ", idsText(joined)),
                          before.world(), s.membership.world(), idsText(s.membership.ids), s.membership.sourceId,
                          s.steps, s.epoch + 1, broken ? "recovered" : "reconfigured", seconds,
                          broken ? fmt::format(" (after: {})", cause) : ""));
  // The writer lost after the last epoch's end callbacks, before it wrote
  // that epoch's records (frozen, or its host gone, while the others went
  // on into the next epoch): this rank, the writer now, writes them.
  // Records are not the group's business: a disk that refuses them here
  // costs the records, not a recovery.
  const bool tookOver = before.rankOf(s.rendezvous->id()) != 0 && isWriter();
  if (tookOver && s.lastEpochEnd) {
    try {
      EpochEnd end{*s.lastEpochEnd, s.lastEpochEvaluated, s.lastEpochLast};
      writeTakenOverRecords(end, s.callbacks.size());
    } catch (const std::exception& e) {
      logWarn("elastic: the records of epoch {} the lost writer had not written could not be written: {}",
              s.lastEpochEnd->epoch, errorLine(e));
    }
  }
  return tookOver;
}

bool Trainer::awaitJoinRequest(std::chrono::milliseconds timeout, int64_t count) {
  Impl& s = *impl_;
  if (!s.rendezvous) return false;
  const auto deadline = trainer_detail::Clock::now() + timeout;
  while (s.rendezvous->joinsPending() < count) {
    if (trainer_detail::Clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  s.lastJoinPoll = {};  // the step's agreement asks the store again
  return true;
}

void Trainer::joinRunningJob(std::unique_ptr<torch::optim::Optimizer> optimizer) {
  Impl& s = *impl_;
  const auto start = trainer_detail::Clock::now();
  // join() returns only a membership this rank was admitted to, or throws
  // (ElasticExcluded: not admitted, with the reason); only once admitted
  // may a failure while the group forms send it on to the next generation,
  // as any member.
  s.membership = s.rendezvous->join();
  for (int attempt = 1;; ++attempt) {
    try {
      if (attempt > 1) s.membership = s.rendezvous->next(s.membership, s.steps);
      if (s.membership.belowMinimum) fail<ElasticBelowMinimum>("elastic: the job went below --min-ranks while this rank joined");
      formGroup(*optimizer);
      makeStrategy(optimizer, /*statesEqual=*/true);  // inside the retry, as in reconfigure
      break;
    } catch (const std::exception& e) {
      // !optimizer: a strategy that took it and then failed to build (one
      // whose factory takes the context by value) left nothing to retry with.
      if (!recoverable(e) || attempt >= 10 || !optimizer) throw;
      retire(std::move(s.group));
    }
  }
  s.startEpoch = s.epoch;
  shardData();
  s.log->setEnabled(isWriter());
  s.log->line(fmt::format("elastic: rank id {} joined generation {} as rank {} of {} at step {}, epoch {}, in {:.3f} s",
                          s.rendezvous->id(), s.membership.generation, rank(), worldSize(), s.steps, s.epoch + 1,
                          std::chrono::duration<double>(trainer_detail::Clock::now() - start).count()));
}

// Once every member of the decided membership is ready: its group, over
// the generation's store, then the state of the member it names.
void Trainer::formGroup(torch::optim::Optimizer& optimizer) {
  Impl& s = *impl_;
  s.rendezvous->awaitMembers(s.membership);
  s.group = dist_.backends->create(dist_.backend, s.rendezvous->groupStore(s.membership.generation),
                                   s.membership.rankOf(s.rendezvous->id()), s.membership.world(), dist_.groupOptions);
  if (s.membership.probeLinks) leaveOutSlowHost(optimizer);
  syncState(optimizer);
  recoveryFault(s.rendezvous->id(), s.membership.generation, /*synced=*/true);
}

// After a collective timed out with every member alive: the links between
// the hosts, measured (comm/link_probe.hpp). A host both of whose links
// stand out is left out: its ranks stop, the others go on to the next
// generation without them. Where none does, the same step may time out
// kMaxTimeoutsAtStep times before the job stops, rather than loop.
void Trainer::leaveOutSlowHost(torch::optim::Optimizer& optimizer) {
  Impl& s = *impl_;
  const double timeoutS = std::chrono::duration<double>(dist_.groupOptions.timeout).count();
  // Two rounds, the fastest of each edge: one look decides for good here.
  const HostLinks links = probeHostLinks(group(), hostNames(group()), kRecoveryProbeBytes, kUseGroupTimeout, 2);
  int slow = links.slowHost();
  std::vector<int> ids;
  if (slow >= 0) {
    for (int r : links.ranksOf(slow)) ids.push_back(s.membership.ids.at(static_cast<size_t>(r)));
    // Rank id 0 serving the job's store (srun, mpirun: no launcher above
    // it, no etcd): leaving it out would end the job for everyone.
    if (dist_.storeServedByRank0 && std::find(ids.begin(), ids.end(), 0) != ids.end()) {
      logWarn("elastic: the probe found {}, but rank id 0 there serves the job's store: it stays",
              links.describeSlow(slow));
      slow = -1;
    }
  }
  if (slow >= 0) {
    const std::vector<int> ranks = links.ranksOf(slow);
    const std::string what = fmt::format(
        "a collective of step {} took longer than distributed.timeout_s ({} s) with every rank alive, and the probe "
        "of the links between hosts found {}",
        s.membership.sourceSteps + 1, timeoutS, links.describeSlow(slow));
    if (std::find(ranks.begin(), ranks.end(), rank()) != ranks.end()) {
      fail<ElasticSlowHost>("elastic: rank id {} is left out: {}. HINT: a larger distributed.timeout_s keeps a slow "
                            "host in the job",
                            s.rendezvous->id(), what);
    }
    // On every survivor's console (train.log's writer may be on the slow
    // host; the next generation's writer then says why in its line).
    if (isWriter()) {
      s.log->line(fmt::format("elastic: leaving out rank id(s) {}: {}", idsText(ids), what));
    } else {
      logWarn("elastic: leaving out rank id(s) {}: {}", idsText(ids), what);
    }
    fail<CollectiveError>("rank id(s) {} left out for a slow link", idsText(ids));
  }
  if (s.membership.timeoutsAtStep < kMaxTimeoutsAtStep) return;
  // Stop, as below --min-ranks: the member with the furthest state saves it.
  std::string saved;
  if (s.rendezvous->id() == s.membership.sourceId) {
    const int64_t batch = std::max<int64_t>(1, s.consumed / config_.training.batchSize);
    s.releasedOptimizer = &optimizer;
    s.writesAlone = true;
    writeCheckpoint(s.epoch, batch, {});
    saved = fmt::format("; saved {}/checkpoints/{}", options_.runDir, checkpointFileName(s.epoch, batch));
  }
  const std::string message = fmt::format(
      "elastic: a collective of step {} timed out {} times in a row with every rank alive (ids {}), and no host's "
      "link stood out ({}){}. HINT: --resume with a larger distributed.timeout_s (now {} s), or look for a rank that "
      "is slow to compute",
      s.membership.sourceSteps + 1, s.membership.timeoutsAtStep, idsText(s.membership.ids),
      links.hostCount() < 2 ? std::string("all ranks on one host")
                            : links.hostCount() == 2 ? std::string("2 hosts: the one link between them cannot be "
                                                                   "blamed on either")
                                                     : fmt::format("{} hosts", links.hostCount()),
      saved, timeoutS);
  if (!saved.empty()) {
    s.log->setEnabled(true);
    s.log->line(message);
  }
  s.rendezvous->finish();  // a joiner that waits is told at once: nothing to rejoin
  throw ElasticStalled(message);
}

// One broadcast of the counters (epoch, steps, samples read, payload
// bytes), one of the payload: the model and optimizer as a checkpoint holds
// them, and the RNG.
void Trainer::syncState(torch::optim::Optimizer& optimizer) {
  Impl& s = *impl_;
  const int source = s.membership.rankOf(s.membership.sourceId);
  const bool mine = rank() == source;
  std::string payload;
  if (mine) {
    torch::serialize::OutputArchive archive;
    saveModelAndOptimizer(archive, *s.model, optimizer);
    archive.write("rng", at::detail::getDefaultCPUGenerator().get_state());
    archive.save_to([&](const void* data, size_t n) -> size_t {
      payload.append(static_cast<const char*>(data), n);
      return n;
    });
  }
  at::Tensor header = at::zeros({4}, at::kLong);
  if (mine) {
    int64_t* h = header.data_ptr<int64_t>();
    h[0] = s.epoch;
    h[1] = s.steps;
    h[2] = s.consumed;
    h[3] = static_cast<int64_t>(payload.size());
  }
  BroadcastOptions from;
  from.root = source;
  if (worldSize() > 1) group().broadcast(header, from)->wait();
  const int64_t* h = header.data_ptr<int64_t>();
  // As int32 words (the backends reduce no bytes; a broadcast of words moves them the same).
  const int64_t words = (h[3] + 3) / 4;
  at::Tensor bytes = at::zeros({words}, at::kInt);
  if (mine) std::memcpy(bytes.data_ptr(), payload.data(), payload.size());
  if (worldSize() > 1) group().broadcast(bytes, from)->wait();
  if (!mine) {
    torch::serialize::InputArchive archive;
    archive.load_from(static_cast<const char*>(bytes.data_ptr()), static_cast<size_t>(h[3]), s.device);
    loadModelAndOptimizer(archive, *s.model, optimizer);
    at::Tensor rng;
    archive.read("rng", rng);
    at::Generator generator = at::detail::getDefaultCPUGenerator();
    generator.set_state(rng.to(at::kCPU));
    s.epoch = h[0];
    s.steps = h[1];
    s.consumed = h[2];
  }
}

}  // namespace ddp
