// Precompiled for every target: LibTorch's headers cost ~20 s per file otherwise.
#pragma once
#include <torch/torch.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <chrono>
#include <memory>
#include <string>
#include <vector>
