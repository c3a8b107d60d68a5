// RunLog: rank 0's log of a run, train.log in the run folder, echoed to
// stdout unless quiet. On other ranks (enabled = false) lines are dropped.
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

 private:
  bool enabled_;
  bool quiet_;
  std::ofstream file_;
};

}  // namespace ddp
