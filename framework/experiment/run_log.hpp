// RunLog: rank 0's log of a run, train.log in the run folder, echoed to
// stdout unless quiet. On other ranks (enabled = false) lines are dropped.
// failure() records why a run ended in train.log only: the program prints
// the same line to stderr itself.
#pragma once

#include <fstream>
#include <iostream>
#include <string>

namespace ddp {

class RunLog {
 public:
  RunLog(bool enabled, const std::string& runDir, bool quiet) : enabled_(enabled), quiet_(quiet) {
    if (enabled_) file_.open(runDir + "/train.log", std::ios::app);
  }
  void line(const std::string& text) {
    if (!enabled_) return;
    file_ << text << "\n";
    file_.flush();
    if (!quiet_) std::cout << text << std::endl;
  }
  void failure(const std::string& text) {
    if (!enabled_) return;
    file_ << "run failed: " << text << "\n";
    file_.flush();
  }

 private:
  bool enabled_;
  bool quiet_;
  std::ofstream file_;
};

}  // namespace ddp
