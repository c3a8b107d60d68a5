// Precompiled for the training layer (ddp_train, ddp_plugins, ddp-run): ATen,
// the Module and Optimizer bases and archives, json and fmt; not all of
// torch/torch.h, whose PCH costs every file that loads it ~5 s (this one
// ~2.5 s). A file that needs a module kind (Linear, Conv2d, ...) or the
// functional API includes its header itself.
#pragma once
#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>
#include <torch/serialize/archive.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <chrono>
#include <memory>
#include <string>
#include <vector>
