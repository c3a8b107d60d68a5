// RunLog: rank 0's log of a run, train.log in the run folder, echoed to
// stdout unless quiet. On other ranks (enabled = false) lines are dropped.
// failure() records why a run ended in train.log only: the program prints
// the same line to stderr itself.
// Each line is one whole record (AppendFile): a disk that refuses it ends
// the run with "cannot write .../train.log: No space left on device".
#pragma once

#include <iostream>
#include <string>

#include "framework/core/append_file.hpp"

namespace ddp {

class RunLog {
 public:
  RunLog(bool enabled, const std::string& runDir, bool quiet) : runDir_(runDir), quiet_(quiet) {
    setEnabled(enabled);
  }
  // Elastic runs: the rank that becomes rank 0 after a rank left takes
  // over the log (appending).
  void setEnabled(bool enabled) {
    if (enabled && !file_.isOpen()) file_.open(runDir_ + "/train.log");
    enabled_ = enabled;
  }
  void line(const std::string& text) {
    if (!enabled_) return;
    if (!quiet_) std::cout << text << std::endl;
    file_.append(text + "\n");
  }
  void failure(const std::string& text) {
    if (!enabled_) return;
    file_.append("run failed: " + text + "\n");
  }

 private:
  std::string runDir_;
  bool enabled_ = false;
  bool quiet_;
  AppendFile file_;
};

}  // namespace ddp
