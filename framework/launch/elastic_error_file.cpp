#include "framework/launch/elastic_error_file.hpp"

#include <nlohmann/json.hpp>

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <stdexcept>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <iostream>

namespace ddp {

void recordFailureForTorchrun(const std::string& kind, const std::string& line) {
  const char* path = std::getenv("TORCHELASTIC_ERROR_FILE");
  if (path == nullptr || *path == '\0') return;
  const std::string target = path;
  const std::string temporary = target + ".tmp." + std::to_string(::getpid());
  try {
    nlohmann::json data = {
        {"message",
         {{"message", kind + ": " + line},
          {"extraInfo", {{"py_callstack", line}, {"timestamp", std::to_string(std::time(nullptr))}}}}}};
    // Bytes that are not UTF-8 (a file name) are replaced, not refused; and
    // the file appears whole or not at all: torchrun cannot parse half of one.
    const std::string text = data.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
    {
      std::ofstream out(temporary, std::ios::trunc);
      out << text;
      out.flush();
      if (!out) throw std::runtime_error(std::strerror(errno));
    }
    if (std::rename(temporary.c_str(), target.c_str()) != 0) throw std::runtime_error(std::strerror(errno));
  } catch (const std::exception& e) {
    std::remove(temporary.c_str());
    std::cerr << "cannot write TORCHELASTIC_ERROR_FILE " << target << ": " << e.what() << "\n";
  }
}

}  // namespace ddp
