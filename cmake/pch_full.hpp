// Precompiled for the tests and ddp-bench: all of LibTorch, which they use widely.
#pragma once
#include <torch/torch.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <chrono>
#include <memory>
#include <string>
#include <vector>
