// The built-in GPT (gpt.hpp): token and position embeddings, pre-norm
// transformer blocks with causal self-attention, a language-model head.
#include "plugins/models/gpt.hpp"

#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>

#include <cmath>
#include <limits>

#include "plugins/common.hpp"

namespace ddp::plugins {

namespace {

struct GptConfig {
  int64_t vocab = 0;
  int64_t blockSize = 0;
  int64_t nLayer = 0;
  int64_t nHead = 0;
  int64_t nEmbd = 0;
  double dropout = 0;
  bool bias = true;
  bool tieWeights = true;
};

// LayerNorm over the last dimension with an optional bias
// (torch::nn::LayerNorm has both or neither).
class LayerNormImpl : public torch::nn::Module {
 public:
  LayerNormImpl(int64_t width, bool bias) : width_(width) {
    weight_ = register_parameter("weight", torch::ones({width}));
    if (bias) bias_ = register_parameter("bias", torch::zeros({width}));
  }
  at::Tensor forward(const at::Tensor& x) { return torch::layer_norm(x, {width_}, weight_, bias_, 1e-5); }

 private:
  int64_t width_;
  at::Tensor weight_, bias_;  // bias_ undefined without "bias"
};
TORCH_MODULE(LayerNorm);

torch::nn::Linear linear(int64_t in, int64_t out, bool bias) {
  return torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(bias));
}

// Multi-head causal self-attention, written out.
class CausalSelfAttentionImpl : public torch::nn::Module {
 public:
  explicit CausalSelfAttentionImpl(const GptConfig& config) : nHead_(config.nHead), dropout_(config.dropout) {
    c_attn_ = register_module("c_attn", linear(config.nEmbd, 3 * config.nEmbd, config.bias));
    c_proj_ = register_module("c_proj", linear(config.nEmbd, config.nEmbd, config.bias));
  }

  at::Tensor forward(const at::Tensor& x) {
    const int64_t B = x.size(0), T = x.size(1), C = x.size(2), D = C / nHead_;
    // [B, T, 3C] -> q, k, v, each [B, n_head, T, D].
    const auto qkv = c_attn_->forward(x).split(C, /*dim=*/2);
    const at::Tensor q = qkv[0].view({B, T, nHead_, D}).transpose(1, 2);
    const at::Tensor k = qkv[1].view({B, T, nHead_, D}).transpose(1, 2);
    const at::Tensor v = qkv[2].view({B, T, nHead_, D}).transpose(1, 2);

    // Scores [B, n_head, T, T]; position t attends to positions <= t.
    at::Tensor att = q.matmul(k.transpose(-2, -1)) * (1.0 / std::sqrt(static_cast<double>(D)));
    const at::Tensor future = torch::ones({T, T}, x.options().dtype(torch::kBool)).triu(/*diagonal=*/1);
    att = att.masked_fill(future, -std::numeric_limits<double>::infinity());
    att = torch::softmax(att, /*dim=*/-1);
    att = torch::dropout(att, dropout_, is_training());

    // Heads side by side again: [B, T, C].
    const at::Tensor y = att.matmul(v).transpose(1, 2).contiguous().view({B, T, C});
    return torch::dropout(c_proj_->forward(y), dropout_, is_training());
  }

 private:
  int64_t nHead_;
  double dropout_;
  torch::nn::Linear c_attn_{nullptr}, c_proj_{nullptr};
};
TORCH_MODULE(CausalSelfAttention);

// Position-wise MLP: C -> 4C -> GELU -> C -> dropout.
class FeedForwardImpl : public torch::nn::Module {
 public:
  explicit FeedForwardImpl(const GptConfig& config) : dropout_(config.dropout) {
    c_fc_ = register_module("c_fc", linear(config.nEmbd, 4 * config.nEmbd, config.bias));
    c_proj_ = register_module("c_proj", linear(4 * config.nEmbd, config.nEmbd, config.bias));
  }

  at::Tensor forward(const at::Tensor& x) {
    return torch::dropout(c_proj_->forward(torch::gelu(c_fc_->forward(x))), dropout_, is_training());
  }

 private:
  double dropout_;
  torch::nn::Linear c_fc_{nullptr}, c_proj_{nullptr};
};
TORCH_MODULE(FeedForward);

// x + attn(ln_1(x)), then x + mlp(ln_2(x)).
class BlockImpl : public torch::nn::Module {
 public:
  explicit BlockImpl(const GptConfig& config) {
    ln_1_ = register_module("ln_1", LayerNorm(config.nEmbd, config.bias));
    attn_ = register_module("attn", CausalSelfAttention(config));
    ln_2_ = register_module("ln_2", LayerNorm(config.nEmbd, config.bias));
    mlp_ = register_module("mlp", FeedForward(config));
  }

  at::Tensor forward(at::Tensor x) {
    x = x + attn_->forward(ln_1_->forward(x));
    return x + mlp_->forward(ln_2_->forward(x));
  }

 private:
  LayerNorm ln_1_{nullptr}, ln_2_{nullptr};
  CausalSelfAttention attn_{nullptr};
  FeedForward mlp_{nullptr};
};
TORCH_MODULE(Block);

bool endsWith(const std::string& text, const std::string& tail) {
  return text.size() >= tail.size() && text.compare(text.size() - tail.size(), tail.size(), tail) == 0;
}

class Gpt : public Model {
 public:
  explicit Gpt(const GptConfig& config) : config_(config) {
    wte_ = register_module("wte", torch::nn::Embedding(config.vocab, config.nEmbd));
    wpe_ = register_module("wpe", torch::nn::Embedding(config.blockSize, config.nEmbd));
    blocks_ = register_module("blocks", torch::nn::ModuleList());
    for (int64_t i = 0; i < config.nLayer; ++i) {
      Block block(config);
      blocks_->push_back(block);
      typedBlocks_.push_back(block);
    }
    ln_f_ = register_module("ln_f", LayerNorm(config.nEmbd, config.bias));
    if (!config.tieWeights) lm_head_ = register_module("lm_head", linear(config.nEmbd, config.vocab, false));
    initialise();
  }

  std::vector<std::shared_ptr<torch::nn::Module>> shardingUnits() override {
    std::vector<std::shared_ptr<torch::nn::Module>> units;
    for (auto& block : typedBlocks_) units.push_back(block.ptr());
    return units;
  }

  at::Tensor forward(const at::Tensor& input) override {
    checkInput(input);
    const int64_t T = input.size(1);
    const at::Tensor positions = torch::arange(T, input.options());  // [T], broadcast over the batch
    at::Tensor x = torch::dropout(wte_->forward(input) + wpe_->forward(positions), config_.dropout, is_training());
    // Each block is a unit (sharding_units.hpp); the embeddings, ln_f and
    // the head stay with the model itself.
    for (size_t i = 0; i < typedBlocks_.size(); ++i) x = runUnit(i, [&] { return typedBlocks_[i]->forward(x); });
    x = ln_f_->forward(x);
    // Tied: the head's weight is the token embedding's [vocab, n_embd].
    return config_.tieWeights ? torch::linear(x, wte_->weight) : lm_head_->forward(x);
  }

 private:
  // GPT-2's initialisation (see gpt.hpp), in registration order.
  void initialise() {
    torch::NoGradGuard noGrad;
    const double residualStd = 0.02 / std::sqrt(2.0 * static_cast<double>(config_.nLayer));
    for (auto& item : named_parameters()) {
      const std::string& name = item.key();
      at::Tensor& p = item.value();
      if (endsWith(name, ".bias")) {
        p.zero_();
      } else if (name.rfind("ln_", 0) == 0 || name.find(".ln_") != std::string::npos) {
        p.fill_(1.0);  // a LayerNorm weight
      } else if (endsWith(name, "c_proj.weight")) {
        p.normal_(0.0, residualStd);
      } else {
        p.normal_(0.0, 0.02);
      }
    }
  }

  void checkInput(const at::Tensor& input) const {
    if (input.dim() != 2 || input.scalar_type() != torch::kLong || input.size(1) < 1) {
      fail<UsageError>("gpt: expected int64 token ids [batch, T] with 1 <= T <= {}, got {} {}", config_.blockSize,
                       c10::toString(input.scalar_type()), c10::str(input.sizes()));
    }
    if (input.size(1) > config_.blockSize) {
      fail<UsageError>(
          "gpt: the input has T = {} tokens per sample, more than block_size {}. HINT: set model.block_size to at "
          "least {} (0 takes the dataset's window length), or use shorter windows",
          input.size(1), config_.blockSize, input.size(1));
    }
    if (input.numel() > 0) {
      const int64_t lo = input.min().item<int64_t>(), hi = input.max().item<int64_t>();
      if (lo < 0 || hi >= config_.vocab) {
        fail<UsageError>("gpt: token ids must lie in [0, {}) (the vocabulary), got ids from {} to {}", config_.vocab,
                         lo, hi);
      }
    }
  }

  GptConfig config_;
  torch::nn::Embedding wte_{nullptr}, wpe_{nullptr};
  torch::nn::ModuleList blocks_{nullptr};
  std::vector<Block> typedBlocks_;  // the same modules, typed, for forward()
  LayerNorm ln_f_{nullptr};
  torch::nn::Linear lm_head_{nullptr};  // untied only
};

}  // namespace

ModelPtr makeGpt(const Params& params, const ModelContext& context) {
  GptConfig config;
  config.vocab = context.vocabSize;
  if (config.vocab <= 0) {
    fail<UsageError>(
        "model gpt: predicts tokens, but the dataset has no vocabulary (vocab size 0). HINT: use a token dataset "
        "such as \"text\"");
  }
  config.nLayer = params.getInt("n_layer");
  config.nHead = params.getInt("n_head");
  config.nEmbd = params.getInt("n_embd");
  if (config.nEmbd % config.nHead != 0) {
    paramError(kModel, "n_embd",
               "{} is not a multiple of n_head {}; each head gets n_embd / n_head dimensions. HINT: e.g. n_embd {}",
               config.nEmbd, config.nHead, (config.nEmbd / config.nHead + 1) * config.nHead);
  }
  const int64_t window = context.sampleShape.empty() ? 0 : context.sampleShape[0];
  config.blockSize = params.getInt("block_size");
  if (config.blockSize == 0) {
    if (window <= 0) {
      paramError(kModel, "block_size",
                 "is 0 (take the dataset's window length), but the dataset gives none. HINT: set it, e.g. 128");
    }
    config.blockSize = window;
  } else if (window > config.blockSize && context.sampleShape.size() == 1) {
    paramError(kModel, "block_size",
               "{} is shorter than the dataset's windows of {} tokens. HINT: use 0 to take the dataset's, or at least "
               "{}",
               config.blockSize, window, window);
  }
  config.dropout = params.getDouble("dropout");
  requireBelow(kModel, "dropout", config.dropout, 1.0);
  config.bias = params.getBool("bias");
  config.tieWeights = params.getBool("tie_weights");
  return std::make_shared<Gpt>(config);
}

}  // namespace ddp::plugins
