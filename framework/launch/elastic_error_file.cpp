#include "framework/launch/elastic_error_file.hpp"

#include <nlohmann/json.hpp>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <iostream>

namespace ddp {

void recordFailureForTorchrun(const std::string& kind, const std::string& line) {
  const char* path = std::getenv("TORCHELASTIC_ERROR_FILE");
  if (path == nullptr || *path == '\0') return;
  try {
    nlohmann::json data = {
        {"message",
         {{"message", kind + ": " + line},
          {"extraInfo", {{"py_callstack", line}, {"timestamp", std::to_string(std::time(nullptr))}}}}}};
    std::ofstream out(path, std::ios::trunc);
    out << data.dump() << "\n";
    out.flush();
    if (!out) std::cerr << "cannot write TORCHELASTIC_ERROR_FILE " << path << ": " << std::strerror(errno) << "\n";
  } catch (const std::exception& e) {
    std::cerr << "cannot write TORCHELASTIC_ERROR_FILE " << path << ": " << e.what() << "\n";
  }
}

}  // namespace ddp
