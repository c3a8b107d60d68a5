// Precompiled for the communication library: tensors (ATen) only, no
// torch::nn or autograd, so a comm source that reaches for them fails to
// compile instead of quietly depending on the training layer.
#pragma once
#include <ATen/ATen.h>
#include <fmt/format.h>
#include <chrono>
#include <memory>
#include <string>
#include <vector>
