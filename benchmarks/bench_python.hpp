// Running the Python references (benchmarks/reference/*.py) from ddp-bench:
// whether python3 can import torch, and a script's JSON lines. Shared by
// the subcommands that compare against PyTorch so that each reports a
// missing torch the same way.
#pragma once

#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <vector>

namespace ddp::bench {

// std::nullopt when `python3 -c "import torch"` works; otherwise why not, for
// the "skipping torch-python: <reason>" line.
std::optional<std::string> pythonTorchUnavailable();

// The interpreter pythonTorchUnavailable() found (shell-quoted).
std::string pythonCommand();
// The same, for a reference whose every rank computes on `threads` threads
// (torch.set_num_threads): OpenBLAS's own pool sized alike through
// OPENBLAS_NUM_THREADS, unless the user set it, as our workers size theirs
// (framework/core/compute_threads.hpp), so both sides get the same cores.
std::string pythonCommandForThreads(int threads);

// Runs `command` through the shell and returns every stdout line that parses
// as a JSON object (the references print one per measurement, among any
// other output). Throws BenchError when the command fails.
std::vector<nlohmann::json> runJsonLines(const std::string& command);

// Quotes `text` for /bin/sh.
std::string shellQuote(const std::string& text);

}  // namespace ddp::bench
