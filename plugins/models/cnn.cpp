// The built-in CNN (cnn.hpp): torch::nn modules composed plainly.
#include "plugins/models/cnn.hpp"

#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>

#include "plugins/common.hpp"

namespace ddp::plugins {

namespace {

enum class Pool { None, Max, Avg };

at::Tensor activate(const at::Tensor& x, const std::string& activation) {
  if (activation == "relu") return torch::relu(x);
  if (activation == "gelu") return torch::gelu(x);
  return torch::tanh(x);  // the declared choices are relu, gelu, tanh
}

// conv -> (batch norm) -> activation -> (pool).
class ConvBlockImpl : public torch::nn::Module {
 public:
  ConvBlockImpl(int64_t inChannels, int64_t outChannels, int64_t kernelSize, bool batchNorm, std::string activation,
                Pool pool)
      : activation_(std::move(activation)), pool_(pool) {
    const auto options =
        torch::nn::Conv2dOptions(inChannels, outChannels, kernelSize).padding(kernelSize / 2).bias(!batchNorm);
    conv_ = register_module("conv", torch::nn::Conv2d(options));
    if (batchNorm) bn_ = register_module("bn", torch::nn::BatchNorm2d(outChannels));
  }

  at::Tensor forward(at::Tensor x) {
    x = conv_->forward(x);
    if (bn_) x = bn_->forward(x);
    x = activate(x, activation_);
    if (pool_ == Pool::Max) x = torch::max_pool2d(x, {2, 2}, {2, 2});
    if (pool_ == Pool::Avg) x = torch::avg_pool2d(x, {2, 2}, {2, 2});
    return x;
  }

 private:
  std::string activation_;
  Pool pool_;  // None for a block whose map is already 1x1
  torch::nn::Conv2d conv_{nullptr};
  torch::nn::BatchNorm2d bn_{nullptr};
};
TORCH_MODULE(ConvBlock);

struct CnnShape {
  int64_t channels = 1, height = 0, width = 0;
};

class Cnn : public Model {
 public:
  Cnn(const CnnShape& input, bool flatInput, const std::vector<int64_t>& channels, int64_t kernelSize, bool batchNorm,
      const std::string& activation, Pool pool, double dropout, int64_t hidden, int64_t classes)
      : input_(input), flatInput_(flatInput), activation_(activation), dropout_(dropout) {
    blocks_ = register_module("blocks", torch::nn::ModuleList());
    int64_t c = input.channels, h = input.height, w = input.width;
    for (size_t i = 0; i < channels.size(); ++i) {
      Pool blockPool = pool;
      if (pool != Pool::None) {
        if (h == 1 && w == 1) {
          blockPool = Pool::None;  // nothing left to pool
        } else if (h < 2 || w < 2) {
          paramError(kModel, "pool",
                     "block {} gets a {}x{} map, which 2x2 pooling would make empty. HINT: use fewer \"channels\" "
                     "entries or \"pool\": \"none\"",
                     i, h, w);
        } else {
          h /= 2;
          w /= 2;
        }
      }
      ConvBlock block(c, channels[i], kernelSize, batchNorm, activation, blockPool);
      blocks_->push_back(block);
      typedBlocks_.push_back(block);
      c = channels[i];
    }
    const int64_t features = c * h * w;
    if (hidden > 0) {
      hidden_ = register_module("hidden", torch::nn::Linear(features, hidden));
      head_ = register_module("head", torch::nn::Linear(hidden, classes));
    } else {
      head_ = register_module("head", torch::nn::Linear(features, classes));
    }
  }

  at::Tensor forward(const at::Tensor& input) override {
    at::Tensor x = input;
    const bool shaped = flatInput_ ? input.dim() == 3 && input.size(1) == input_.height && input.size(2) == input_.width
                                   : input.dim() == 4 && input.size(1) == input_.channels &&
                                         input.size(2) == input_.height && input.size(3) == input_.width;
    if (!shaped) {
      fail<UsageError>("cnn: expected input [batch, {}{}, {}], got {}",
                       flatInput_ ? "" : std::to_string(input_.channels) + ", ", input_.height, input_.width,
                       c10::str(input.sizes()));
    }
    if (flatInput_) x = x.unsqueeze(1);  // [B, H, W] -> [B, 1, H, W]
    // Units (sharding_units.hpp): each conv block, the hidden layer, the head.
    size_t unit = 0;
    for (auto& block : typedBlocks_) x = runUnit(unit++, [&] { return block->forward(x); });
    x = x.flatten(1);
    x = torch::dropout(x, dropout_, is_training());
    if (hidden_) x = activate(runUnit(unit++, [&] { return hidden_->forward(x); }), activation_);
    return runUnit(unit, [&] { return head_->forward(x); });
  }

  std::vector<std::shared_ptr<torch::nn::Module>> shardingUnits() override {
    std::vector<std::shared_ptr<torch::nn::Module>> units;
    for (auto& block : typedBlocks_) units.push_back(block.ptr());
    if (hidden_) units.push_back(hidden_.ptr());
    units.push_back(head_.ptr());
    return units;
  }

 private:
  CnnShape input_;
  bool flatInput_;  // samples are [H, W]
  std::string activation_;
  double dropout_;
  torch::nn::ModuleList blocks_{nullptr};
  std::vector<ConvBlock> typedBlocks_;  // the same modules, typed, for forward()
  torch::nn::Linear hidden_{nullptr};
  torch::nn::Linear head_{nullptr};
};

Pool poolFromName(const std::string& name) {
  if (name == "max") return Pool::Max;
  if (name == "avg") return Pool::Avg;
  return Pool::None;
}

}  // namespace

ModelPtr makeCnn(const Params& params, const ModelContext& context) {
  const auto& shape = context.sampleShape;
  if (shape.size() != 2 && shape.size() != 3) {
    fail<UsageError>(
        "model cnn: needs image samples of shape [C, H, W] or [H, W], but the dataset's samples have shape {}. HINT: "
        "use an image dataset such as \"digits\" or \"npy\" with images, or model \"mlp\" for tables",
        c10::str(at::IntArrayRef(shape)));
  }
  if (context.numClasses <= 0) {
    fail<UsageError>(
        "model cnn: classifies images, but the dataset has no classes (a regression target). HINT: use a "
        "classification dataset, or model \"mlp\" for regression");
  }
  CnnShape input;
  if (shape.size() == 3) input.channels = shape[0];
  input.height = shape[shape.size() - 2];
  input.width = shape[shape.size() - 1];
  if (input.channels < 1 || input.height < 1 || input.width < 1) {
    fail<UsageError>("model cnn: the dataset's sample shape {} has an empty dimension",
                     c10::str(at::IntArrayRef(shape)));
  }

  const auto channels = params.getIntList("channels");
  if (channels.empty()) paramError(kModel, "channels", "needs at least one block, e.g. [16, 32]");
  for (size_t i = 0; i < channels.size(); ++i) {
    if (channels[i] < 1) paramError(kModel, "channels", "entry {} is {}; each must be >= 1", i, channels[i]);
  }
  const int64_t kernelSize = params.getInt("kernel_size");
  if (kernelSize % 2 == 0) {
    paramError(kModel, "kernel_size", "{} is even; \"same\" padding needs an odd size. HINT: use {} or {}", kernelSize,
               kernelSize - 1, kernelSize + 1);
  }
  const double dropout = params.getDouble("dropout");
  requireBelow(kModel, "dropout", dropout, 1.0);
  return std::make_shared<Cnn>(input, shape.size() == 2, channels, kernelSize, params.getBool("batch_norm"),
                               params.getString("activation"), poolFromName(params.getString("pool")), dropout,
                               params.getInt("hidden"), context.numClasses);
}

}  // namespace ddp::plugins
