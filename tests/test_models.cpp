// The cnn and gpt models (plugins/models/): shapes and parameter counts
// against their closed forms, the causal mask, their usage errors, dropout
// in train and eval mode, the forward pass against a plain PyTorch model
// (tests/reference/models_reference.py), batch norm buffers and a tied
// weight under DDP.
#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <catch2/catch.hpp>
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "framework/core/errors.hpp"
#include "framework/experiment/plugin_registry.hpp"
#include "framework/launch/spawn.hpp"
#include "framework/parallel/ddp.hpp"
#include "framework/parallel/fsdp_strategy.hpp"
#include "framework/parallel/strategy.hpp"
#include "plugins/builtin.hpp"
#include "tests/plugin_params.hpp"
#include "tests/test_support.hpp"

using namespace ddp;
using Catch::Matchers::Contains;
using Catch::Matchers::StartsWith;
using ddp::test::joinErrors;
using ddp::test::paramsFor;
using ddp::test::usageErrorOf;
using ddp::test::runRanks;
using ddp::test::borrow;
using ddp::test::maxAbsDiff;

namespace {

const PluginSpec& modelSpec(const std::string& name) { return builtinPlugins().get(PluginKind::Model, name); }

ModelPtr makeCnn(const Json& values, std::vector<int64_t> sampleShape, int64_t classes) {
  ModelContext context;
  context.sampleShape = std::move(sampleShape);
  context.numClasses = classes;
  context.numFeatures = 1;
  for (int64_t d : context.sampleShape) context.numFeatures *= d;
  return modelSpec("cnn").model(paramsFor(modelSpec("cnn"), values), context);
}

// A token dataset's context: windows of `window` tokens, ids in [0, vocab).
ModelPtr makeGpt(const Json& values, int64_t vocab, int64_t window) {
  ModelContext context;
  context.sampleShape = {window};
  context.numFeatures = window;
  context.numClasses = vocab;
  context.vocabSize = vocab;
  return modelSpec("gpt").model(paramsFor(modelSpec("gpt"), values), context);
}

int64_t parameterCount(torch::nn::Module& model) {
  int64_t n = 0;
  for (const auto& p : model.parameters()) n += p.numel();
  return n;
}

// gpt.hpp's closed form.
int64_t gptCount(int64_t V, int64_t T, int64_t L, int64_t C, bool bias, bool tied) {
  const int64_t perLayer = bias ? 12 * C * C + 13 * C : 12 * C * C + 2 * C;
  return V * C + T * C + L * perLayer + (bias ? 2 * C : C) + (tied ? 0 : V * C);
}

at::Tensor tokens(int64_t batch, int64_t T, int64_t vocab, uint64_t seed) {
  torch::manual_seed(seed);
  return torch::randint(vocab, {batch, T}, torch::kLong);
}

}  // namespace

TEST_CASE("model cnn: output shape and parameter count against the closed form", "[models]") {
  torch::manual_seed(0);
  SECTION("digits-like [1, 8, 8], defaults: two blocks with batch norm, max pooling") {
    auto model = makeCnn(Json::object(), {1, 8, 8}, 10);
    CHECK(model->forward(torch::randn({5, 1, 8, 8})).sizes() == at::IntArrayRef{5, 10});
    // conv 1->16 3x3 (no bias) + bn 2*16; conv 16->32 + bn 2*32; 8x8 -> 4x4 -> 2x2: head 32*2*2 -> 10.
    CHECK(parameterCount(*model) == (1 * 16 * 9 + 2 * 16) + (16 * 32 * 9 + 2 * 32) + (32 * 2 * 2 * 10 + 10));
    CHECK(parameterCount(*model) == 6138);
    std::set<std::string> buffers;
    for (const auto& b : model->named_buffers()) buffers.insert(b.key());
    CHECK(buffers == std::set<std::string>{"blocks.0.bn.running_mean", "blocks.0.bn.running_var",
                                           "blocks.0.bn.num_batches_tracked", "blocks.1.bn.running_mean",
                                           "blocks.1.bn.running_var", "blocks.1.bn.num_batches_tracked"});
    CHECK(model->named_parameters().contains("head.weight"));
    CHECK_FALSE(model->named_parameters().contains("blocks.0.conv.bias"));
  }
  SECTION("[3, 5, 7], no batch norm, kernel 5, avg pooling skipped at 1x1, a hidden layer") {
    auto model = makeCnn({{"channels", {4, 6, 8}},
                          {"kernel_size", 5},
                          {"batch_norm", false},
                          {"pool", "avg"},
                          {"activation", "tanh"},
                          {"hidden", 12}},
                         {3, 5, 7}, 3);
    CHECK(model->forward(torch::randn({2, 3, 5, 7})).sizes() == at::IntArrayRef{2, 3});
    // 5x7 -> 2x3 -> 1x1 -> (1x1, no pooling); convs with biases; 8 -> 12 -> 3.
    CHECK(parameterCount(*model) ==
          (3 * 4 * 25 + 4) + (4 * 6 * 25 + 6) + (6 * 8 * 25 + 8) + (8 * 12 + 12) + (12 * 3 + 3));
    CHECK(model->named_buffers().size() == 0);
    CHECK(model->named_parameters().contains("hidden.weight"));
  }
  SECTION("a 2-D sample shape [6, 6] is one channel; no pooling keeps the map") {
    auto model = makeCnn({{"channels", {5}}, {"kernel_size", 1}, {"pool", "none"}, {"activation", "gelu"}}, {6, 6}, 4);
    CHECK(model->forward(torch::randn({3, 6, 6})).sizes() == at::IntArrayRef{3, 4});
    CHECK(parameterCount(*model) == (1 * 5 * 1 + 2 * 5) + (5 * 36 * 4 + 4));
  }
}

TEST_CASE("model gpt: logits shape and parameter count against the closed form", "[models]") {
  torch::manual_seed(0);
  SECTION("biases, tied head") {
    auto model = makeGpt({{"n_layer", 2}, {"n_head", 2}, {"n_embd", 16}}, 11, 8);
    CHECK(model->forward(tokens(3, 8, 11, 1)).sizes() == at::IntArrayRef{3, 8, 11});
    CHECK(model->forward(tokens(3, 5, 11, 1)).sizes() == at::IntArrayRef{3, 5, 11});  // shorter than block_size
    CHECK(parameterCount(*model) == gptCount(11, 8, 2, 16, true, true));
    CHECK(parameterCount(*model) == 6896);  // the formula itself, by hand
    CHECK_FALSE(model->named_parameters().contains("lm_head.weight"));
    // Tied: one tensor, registered once, so an optimizer steps it once.
    std::set<const void*> distinct;
    for (const auto& p : model->parameters()) distinct.insert(p.unsafeGetTensorImpl());
    CHECK(distinct.size() == model->parameters().size());
    CHECK(model->named_buffers().size() == 0);  // the causal mask is no buffer
  }
  SECTION("no biases, untied head, block_size larger than the windows") {
    auto model = makeGpt(
        {{"n_layer", 1}, {"n_head", 4}, {"n_embd", 8}, {"bias", false}, {"tie_weights", false}, {"block_size", 6}}, 7,
        5);
    CHECK(model->forward(tokens(2, 6, 7, 2)).sizes() == at::IntArrayRef{2, 6, 7});
    CHECK(parameterCount(*model) == gptCount(7, 6, 1, 8, false, false));
    CHECK(model->named_parameters()["lm_head.weight"].sizes() == at::IntArrayRef{7, 8});
    for (const auto& item : model->named_parameters()) CHECK_FALSE(Catch::endsWith(item.key(), ".bias"));
  }
  SECTION("defaults: 4 layers, 4 heads, 128 wide, block_size from the windows; GPT-2 initialisation") {
    auto model = makeGpt(Json::object(), 65, 32);
    CHECK(model->forward(tokens(2, 32, 65, 3)).sizes() == at::IntArrayRef{2, 32, 65});
    CHECK(parameterCount(*model) == gptCount(65, 32, 4, 128, true, true));
    auto params = model->named_parameters();
    CHECK(params["wpe.weight"].sizes() == at::IntArrayRef{32, 128});
    const double residualStd = params["blocks.0.mlp.c_proj.weight"].std().item<double>();
    CHECK(residualStd == Approx(0.02 / std::sqrt(8.0)).epsilon(0.05));
    CHECK(params["blocks.0.attn.c_attn.weight"].std().item<double>() == Approx(0.02).epsilon(0.05));
    CHECK(params["wte.weight"].std().item<double>() == Approx(0.02).epsilon(0.05));
    CHECK(params["blocks.3.attn.c_attn.bias"].abs().max().item<double>() == 0);
    CHECK(params["blocks.3.ln_2.weight"].eq(1).all().item<bool>());
    // From the global seed: the same seed builds the same model.
    torch::manual_seed(5);
    auto a = makeGpt(Json::object(), 65, 32);
    torch::manual_seed(5);
    auto b = makeGpt(Json::object(), 65, 32);
    for (const auto& item : a->named_parameters()) {
      CHECK(at::equal(item.value(), b->named_parameters()[item.key()]));
    }
  }
}

TEST_CASE("model gpt: the output at position t does not depend on tokens after t", "[models]") {
  torch::manual_seed(0);
  const int64_t V = 11, T = 8;
  auto model = makeGpt({{"n_layer", 2}, {"n_head", 2}, {"n_embd", 16}, {"dropout", 0.0}}, V, T);
  model->eval();
  torch::NoGradGuard noGrad;
  const at::Tensor ids = tokens(3, T, V, 7);
  const at::Tensor logits = model->forward(ids);
  for (int64_t t : {0, 3, 6}) {
    INFO("tokens after position " << t << " changed");
    at::Tensor changed = ids.clone();
    changed.slice(1, t + 1).copy_((ids.slice(1, t + 1) + 1) % V);
    const at::Tensor other = model->forward(changed);
    CHECK(maxAbsDiff(logits.slice(1, 0, t + 1), other.slice(1, 0, t + 1)) <= 1e-6);
    CHECK(maxAbsDiff(logits.slice(1, t + 1), other.slice(1, t + 1)) > 1e-3);
  }
}

TEST_CASE("models cnn and gpt: usage errors name the problem and the fix", "[models]") {
  // cnn
  const std::string table = usageErrorOf([] { makeCnn(Json::object(), {13}, 3); });
  CHECK_THAT(table, StartsWith("model cnn: needs image samples of shape [C, H, W] or [H, W]"));
  CHECK_THAT(table, Contains("[13]"));
  CHECK_THAT(table, Contains("HINT:"));
  const std::string regression = usageErrorOf([] { makeCnn(Json::object(), {1, 8, 8}, 0); });
  CHECK_THAT(regression, Contains("the dataset has no classes"));
  CHECK_THAT(regression, Contains("HINT:"));
  const std::string tooSmall = usageErrorOf([] { makeCnn({{"channels", {4, 4}}}, {1, 2, 8}, 3); });
  CHECK_THAT(tooSmall, StartsWith("model.pool: block 1 gets a 1x4 map, which 2x2 pooling would make empty"));
  CHECK_THAT(tooSmall, Contains("HINT:"));
  CHECK_NOTHROW(makeCnn({{"channels", {4, 4}}, {"pool", "none"}}, {1, 2, 8}, 3));
  CHECK_THAT(usageErrorOf([] {
               makeCnn({{"kernel_size", 4}}, {1, 8, 8}, 3);
             }),
             StartsWith("model.kernel_size: 4 is even"));
  CHECK_THAT(usageErrorOf([] { makeCnn({{"dropout", 1.0}}, {1, 8, 8}, 3); }), StartsWith("model.dropout: must be < 1"));
  auto cnn = makeCnn(Json::object(), {1, 8, 8}, 10);
  CHECK(usageErrorOf([&] {
          cnn->forward(torch::randn({2, 64}));
        }) == "cnn: expected input [batch, 1, 8, 8], got [2, 64]");

  // gpt
  const std::string noVocab = usageErrorOf([] {
    ModelContext context;
    context.sampleShape = {13};
    context.numClasses = 3;
    modelSpec("gpt").model(paramsFor(modelSpec("gpt")), context);
  });
  CHECK_THAT(noVocab, StartsWith("model gpt: predicts tokens, but the dataset has no vocabulary (vocab size 0)"));
  CHECK_THAT(noVocab, Contains("HINT: use a token dataset such as \"text\""));
  CHECK_THAT(usageErrorOf([] {
               makeGpt({{"n_embd", 30}, {"n_head", 4}}, 11, 8);
             }),
             StartsWith("model.n_embd: 30 is not a multiple of n_head 4"));
  CHECK_THAT(usageErrorOf([] {
               makeGpt({{"block_size", 4}}, 11, 8);
             }),
             StartsWith("model.block_size: 4 is shorter than the dataset's windows of 8 tokens"));
  auto gpt = makeGpt({{"n_layer", 1}, {"n_head", 2}, {"n_embd", 8}}, 11, 8);
  const std::string tooLong = usageErrorOf([&] { gpt->forward(tokens(2, 9, 11, 0)); });
  CHECK_THAT(tooLong, StartsWith("gpt: the input has T = 9 tokens per sample, more than block_size 8"));
  CHECK_THAT(tooLong, Contains("HINT:"));
  CHECK_THAT(usageErrorOf([&] {
               gpt->forward(torch::zeros({2, 8}));
             }),
             StartsWith("gpt: expected int64 token ids [batch, T] with 1 <= T <= 8, got Float [2, 8]"));
  CHECK_THAT(usageErrorOf([&] {
               gpt->forward(torch::full({1, 3}, 11, torch::kLong));
             }),
             StartsWith("gpt: token ids must lie in [0, 11)"));
}

TEST_CASE("models cnn and gpt: dropout acts in train mode only", "[models]") {
  torch::manual_seed(0);
  auto cnn = makeCnn({{"dropout", 0.5}, {"hidden", 16}}, {1, 8, 8}, 10);
  auto gpt = makeGpt({{"n_layer", 1}, {"n_head", 2}, {"n_embd", 16}, {"dropout", 0.1}}, 11, 8);
  const at::Tensor images = torch::randn({8, 1, 8, 8});
  const at::Tensor ids = tokens(4, 8, 11, 1);
  auto check = [](const std::string& name, Model& model, const at::Tensor& input) {
    INFO(name);
    model.train();
    CHECK(maxAbsDiff(model.forward(input), model.forward(input)) > 1e-4);
    model.eval();
    CHECK(at::equal(model.forward(input), model.forward(input)));
  };
  check("cnn", *cnn, images);
  check("gpt", *gpt, ids);
}

namespace {

namespace fs = std::filesystem;

// A folder for one reference case: the model's tensors as raw files, and a
// manifest models_reference.py reads (see there).
void writeCase(const fs::path& folder, const std::string& kind, const Json& config, torch::nn::Module& model,
               const at::Tensor& input, const at::Tensor& targets, const std::vector<std::string>& modes) {
  fs::create_directories(folder);
  Json tensors = Json::array();
  auto write = [&](const std::string& name, const at::Tensor& value) {
    const at::Tensor t = value.contiguous();
    std::ofstream out(folder / (name + ".bin"), std::ios::binary);
    out.write(static_cast<const char*>(t.data_ptr()), static_cast<std::streamsize>(t.numel() * t.element_size()));
    REQUIRE(out.good());
    tensors.push_back(
        {{"name", name}, {"dtype", t.scalar_type() == torch::kLong ? "int64" : "float32"}, {"shape", t.sizes().vec()}});
  };
  for (const auto& item : model.named_parameters()) write(item.key(), item.value().detach());
  for (const auto& item : model.named_buffers()) write(item.key(), item.value());
  write("input", input);
  if (targets.defined()) write("targets", targets);
  std::ofstream(folder / "manifest.json")
      << Json{{"model", kind}, {"config", config}, {"tensors", tensors}, {"outputs", modes}}.dump(1);
}

at::Tensor readOutput(const fs::path& file, at::IntArrayRef shape) {
  at::Tensor out = torch::empty(shape, torch::kFloat);
  std::ifstream in(file, std::ios::binary);
  in.read(static_cast<char*>(out.data_ptr()), static_cast<std::streamsize>(out.numel() * sizeof(float)));
  if (!in || in.peek() != std::char_traits<char>::eof()) {
    throw std::runtime_error("reference output " + file.string() + " is missing or not " + c10::str(shape));
  }
  return out;
}

// Fixed, non-trivial values everywhere (biases and LayerNorm weights
// included, which the initialisation leaves at 0 and 1), and batch norm
// statistics that are not the identity.
void scramble(torch::nn::Module& model, uint64_t seed) {
  torch::NoGradGuard noGrad;
  torch::manual_seed(seed);
  for (auto& p : model.parameters()) p.copy_(torch::randn(p.sizes()) * 0.3);
  for (auto& item : model.named_buffers()) {
    if (Catch::endsWith(item.key(), "running_mean")) item.value().copy_(torch::randn(item.value().sizes()) * 0.2);
    if (Catch::endsWith(item.key(), "running_var")) item.value().copy_(torch::rand(item.value().sizes()) + 0.5);
  }
}


}  // namespace

TEST_CASE("models cnn and gpt: the forward pass and the gradients match a plain PyTorch model", "[models][solo]") {
  const std::string whyNot = ddp::test::pythonTorchUnavailable();
  if (!whyNot.empty()) {
    WARN("SKIPPED: " << whyNot);
    return;
  }
  const fs::path root = ddp::test::tempDir();
  struct RemoveAtEnd {
    fs::path path;
    ~RemoveAtEnd() {
      std::error_code ignored;
      fs::remove_all(path, ignored);
    }
  } removeAtEnd{root};
  struct Case {
    std::string name;
    ModelPtr model;
    at::Tensor input;
    at::Tensor targets;  // for "grads": the mean cross-entropy's gradients
    std::vector<std::string> modes;
  };
  std::vector<Case> cases;

  // gpt: tied with biases, and untied without; dropout 0 (the reference
  // runs eval mode only, where dropout is off anyway).
  const Json gptTied = {{"n_layer", 2}, {"n_head", 2}, {"n_embd", 16}, {"dropout", 0.0}};
  const Json gptUntied = {{"n_layer", 1},  {"n_head", 4},          {"n_embd", 8},
                          {"bias", false}, {"tie_weights", false}, {"dropout", 0.0}};
  // cnn: batch norm (running statistics in eval, batch statistics in train
  // mode) with max pooling; and without batch norm, avg pooling, a hidden layer.
  const Json cnnBn = {{"channels", {3, 5}}, {"activation", "gelu"}};
  const Json cnnPlain = {{"channels", {4, 6, 8}}, {"kernel_size", 5},     {"batch_norm", false},
                         {"pool", "avg"},         {"activation", "tanh"}, {"hidden", 12}};
  std::vector<std::pair<std::string, Json>> configs;
  auto addGpt = [&](const std::string& name, const Json& values, int64_t V, int64_t T, uint64_t seed) {
    torch::manual_seed(seed);
    Case c{name, makeGpt(values, V, T), tokens(3, T, V, seed + 1), tokens(3, T, V, seed + 3), {"eval", "grads"}};
    scramble(*c.model, seed + 2);
    Json config = paramsFor(modelSpec("gpt"), values).json();
    config["vocab"] = V;
    config["block_size"] = T;
    configs.emplace_back(name, config);
    writeCase(root / name, "gpt", config, *c.model, c.input, c.targets, c.modes);
    cases.push_back(c);
  };
  auto addCnn = [&](const std::string& name, const Json& values, std::vector<int64_t> shape, int64_t classes,
                    uint64_t seed) {
    torch::manual_seed(seed);
    std::vector<int64_t> inputShape{4};
    inputShape.insert(inputShape.end(), shape.begin(), shape.end());
    Case c{name, makeCnn(values, shape, classes), torch::randn(inputShape), torch::randint(classes, {4}, torch::kLong),
           {"eval", "train", "grads"}};
    scramble(*c.model, seed + 2);
    Json config = paramsFor(modelSpec("cnn"), values).json();
    config["sample_shape"] = shape;
    config["classes"] = classes;
    writeCase(root / name, "cnn", config, *c.model, c.input, c.targets, c.modes);
    cases.push_back(c);
  };
  addGpt("gpt_tied", gptTied, 11, 8, 10);
  addGpt("gpt_untied", gptUntied, 7, 6, 20);
  addCnn("cnn_bn", cnnBn, {2, 8, 8}, 10, 30);
  addCnn("cnn_plain", cnnPlain, {3, 5, 7}, 3, 40);

  SpawnOptions options;
  options.argv = {"/usr/bin/python3", DDP_MODELS_REFERENCE};
  for (const auto& c : cases) options.argv.push_back((root / c.name).string());
  const FinishedProcess done = runProcess(options);
  INFO(done.output);
  REQUIRE(WIFEXITED(done.status));
  REQUIRE(WEXITSTATUS(done.status) == 0);

  for (auto& c : cases) {
    for (const auto& mode : c.modes) {
      INFO(c.name << ", " << mode << " mode");
      if (mode == "grads") {
        // Our loss plugin (its own autograd node) over our model, in train
        // mode, against PyTorch's F.cross_entropy over PyTorch's model.
        c.model->train(true);
        c.model->zero_grad();
        const LossFn loss = builtinPlugins().get(PluginKind::Loss, "cross_entropy").loss(
            paramsFor(builtinPlugins().get(PluginKind::Loss, "cross_entropy")));
        loss(c.model->forward(c.input), c.targets).backward();
        for (const auto& item : c.model->named_parameters()) {
          INFO("gradient of " << item.key());
          const at::Tensor ours = item.value().grad();
          REQUIRE(ours.defined());
          const at::Tensor theirs = readOutput(root / c.name / ("grad_" + item.key() + ".bin"), ours.sizes());
          const double scale = theirs.abs().max().item<double>();
          INFO("max abs diff " << maxAbsDiff(ours, theirs) << ", gradient scale " << scale);
          CHECK(maxAbsDiff(ours, theirs) <= 1e-5 * std::max(1.0, scale));
        }
        continue;
      }
      c.model->train(mode == "train");
      at::Tensor ours;
      {
        torch::NoGradGuard noGrad;
        ours = c.model->forward(c.input);
      }
      const at::Tensor theirs = readOutput(root / c.name / ("output_" + mode + ".bin"), ours.sizes());
      const double diff = maxAbsDiff(ours, theirs);
      INFO("max abs diff " << diff << ", output scale " << theirs.abs().max().item<double>());
      CHECK(diff <= 1e-5);
      CHECK(theirs.abs().max().item<double>() > 0.1);  // not all near zero: the comparison means something
    }
  }
}

namespace {


std::vector<at::Tensor> cloneAll(const std::vector<at::Tensor>& tensors) {
  std::vector<at::Tensor> out;
  for (const auto& t : tensors) out.push_back(t.detach().clone());
  return out;
}

bool skipUnlessGloo() {
  std::string whyNot;
  if (ddp::test::backendRunnable("gloo", &whyNot)) return false;
  WARN("SKIPPED: " << whyNot);
  return true;
}

}  // namespace

TEST_CASE("model cnn under DDP: every rank ends with rank 0's batch norm statistics", "[models][solo]") {
  if (skipUnlessGloo()) return;
  CHECK(DdpOptions().broadcastBuffers);  // on by default
  constexpr int kWorld = 2, kSteps = 3;
  for (const bool broadcast : {true, false}) {
    INFO("broadcastBuffers " << broadcast);
    std::vector<std::vector<at::Tensor>> buffers(kWorld), parameters(kWorld);
    auto errors = runRanks("gloo", kWorld, [&](int rank, ProcessGroup& pg) {
      auto model = makeCnn({{"channels", {4, 8}}}, {1, 8, 8}, 10);  // different weights: DDP broadcasts rank 0's
      DdpOptions options;
      options.broadcastBuffers = broadcast;
      DistributedDataParallel ddp(model, borrow(pg), options);
      torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1));
      auto gen = at::detail::createCPUGenerator(100 + rank);  // each rank its own data
      model->train();
      for (int step = 0; step < kSteps; ++step) {
        const at::Tensor x = at::randn({16, 1, 8, 8}, gen) * (1 + rank) + rank;
        const at::Tensor y = at::randint(10, {16}, gen, at::kLong);
        sgd.zero_grad();
        torch::nn::functional::cross_entropy(model->forward(x), y).backward();
        ddp.finishGradientSync();
        sgd.step();
      }
      buffers[rank] = cloneAll(model->buffers());
      parameters[rank] = cloneAll(model->parameters());
    });
    INFO(joinErrors(errors));
    REQUIRE(joinErrors(errors).empty());
    REQUIRE(buffers[0].size() == 6);  // running_mean, running_var, num_batches_tracked, for 2 blocks
    bool same = true;
    for (size_t i = 0; i < buffers[0].size(); ++i) same = same && at::equal(buffers[0][i], buffers[1][i]);
    CHECK(same == broadcast);  // without the broadcast each rank keeps its own data's statistics
    CHECK(buffers[0][2].item<int64_t>() == kSteps);
    for (size_t i = 0; i < parameters[0].size(); ++i) CHECK(at::equal(parameters[0][i], parameters[1][i]));
  }
}

TEST_CASE("DDP: a parameter registered under two names is synced once, a tied gpt trains alike on every rank",
          "[models][solo]") {
  if (skipUnlessGloo()) return;
  constexpr int kWorld = 2;
  // Two modules holding one tensor, as Python's weight tying does.
  struct Shared : torch::nn::Module {
    at::Tensor w;
    std::shared_ptr<torch::nn::Module> child;
    Shared() {
      w = register_parameter("w", torch::randn({3, 4}));
      child = register_module("child", std::make_shared<torch::nn::Module>());
      child->register_parameter("w", w);
    }
    at::Tensor forward(const at::Tensor& x) { return x.matmul(w.t()).matmul(child->named_parameters()["w"]); }
  };
  std::vector<at::Tensor> grads(kWorld), localGrads(kWorld);
  std::vector<size_t> names(kWorld);
  std::vector<std::vector<at::Tensor>> gptParams(kWorld);
  auto errors = runRanks("gloo", kWorld, [&](int rank, ProcessGroup& pg) {
    auto model = std::make_shared<Shared>();
    if (model->parameters().size() != 2) throw std::runtime_error("expected LibTorch to list the shared tensor twice");
    DistributedDataParallel ddp(model, borrow(pg));
    size_t n = 0;
    for (const auto& bucket : ddp.bucketInfo()) n += bucket.parameterNames.size();
    names[rank] = n;
    const at::Tensor x = torch::full({2, 4}, 1.0 + rank);
    localGrads[rank] = torch::autograd::grad({model->forward(x).sum()}, {model->w})[0];
    model->forward(x).sum().backward();
    ddp.finishGradientSync();
    grads[rank] = model->w.grad().clone();

    // A gpt with a tied head, different data on each rank.
    auto gpt = makeGpt({{"n_layer", 1}, {"n_head", 2}, {"n_embd", 16}}, 11, 8);
    DistributedDataParallel gptDdp(gpt, borrow(pg));
    torch::optim::AdamW adam(gpt->parameters(), torch::optim::AdamWOptions(1e-2));
    auto gen = at::detail::createCPUGenerator(200 + rank);
    for (int step = 0; step < 3; ++step) {
      const at::Tensor ids = at::randint(11, {4, 8}, gen, at::kLong);
      adam.zero_grad();
      torch::nn::functional::cross_entropy(gpt->forward(ids).view({-1, 11}), ids.roll(-1, 1).reshape({-1})).backward();
      gptDdp.finishGradientSync();
      adam.step();
    }
    gptParams[rank] = cloneAll(gpt->parameters());
  });
  INFO(joinErrors(errors));
  REQUIRE(joinErrors(errors).empty());
  CHECK(names[0] == 1);  // hooked and bucketed once
  const at::Tensor average = (localGrads[0] + localGrads[1]) / 2;
  CHECK(maxAbsDiff(grads[0], average) <= 1e-5);
  CHECK(maxAbsDiff(grads[1], average) <= 1e-5);
  CHECK_FALSE(at::equal(localGrads[0], localGrads[1]));
  for (size_t i = 0; i < gptParams[0].size(); ++i) CHECK(at::equal(gptParams[0][i], gptParams[1][i]));
}

TEST_CASE("models cnn and gpt: --describe lists their parameters", "[models]") {
  const auto& registry = builtinPlugins();
  const std::string cnn = registry.describe("model.cnn");
  for (const char* expected :
       {"channels", "[16,32]", "kernel_size", "batch_norm", "relu|gelu|tanh", "max|avg|none", "dropout", "hidden"}) {
    CHECK_THAT(cnn, Contains(expected));
  }
  const std::string gpt = registry.describe("model.gpt");
  for (const char* expected :
       {"n_layer", "n_head", "n_embd", "128", "block_size", "dropout", "0.1", "bias", "tie_weights"}) {
    CHECK_THAT(gpt, Contains(expected));
  }
  const auto run = ddp::test::runDdpRun("--describe model.gpt");
  INFO(run.output);
  CHECK(run.exitCode == 0);
  CHECK_THAT(run.output, Contains("tie_weights"));
}

// Every built-in model under every strategy: after the same steps from the
// same start (Adam, 2 ranks, each its own data), the same parameters as
// DDP's. fsdp gathers each unit (an mlp layer, a cnn block, a gpt block)
// only while it runs; the root (gpt's embeddings and head, tied or not)
// stays whole.
TEST_CASE("models mlp, cnn and gpt train under ddp, zero1, zero2 and fsdp to the same parameters", "[models][zero][solo]") {
  if (skipUnlessGloo()) return;
  constexpr int kWorld = 2, kSteps = 3;
  struct Case {
    const char* name;
    std::function<ModelPtr()> make;
    std::function<std::pair<at::Tensor, at::Tensor>(at::Generator&)> batch;
    int64_t classes;
  };
  auto mlp = [] {
    ModelContext context;
    context.numFeatures = 12;
    context.numClasses = 5;
    return modelSpec("mlp").model(paramsFor(modelSpec("mlp"), {{"layers", {12, 16, 16, 5}}}), context);
  };
  const std::vector<Case> cases = {
      {"mlp", mlp,
       [](at::Generator& g) { return std::make_pair(at::randn({8, 12}, g), at::randint(5, {8}, g, at::kLong)); }, 5},
      {"cnn", [] { return makeCnn({{"channels", {4, 8}}}, {1, 8, 8}, 10); },
       [](at::Generator& g) { return std::make_pair(at::randn({8, 1, 8, 8}, g), at::randint(10, {8}, g, at::kLong)); },
       10},
      {"gpt tied", [] { return makeGpt({{"n_layer", 2}, {"n_head", 2}, {"n_embd", 16}, {"dropout", 0.0}}, 11, 8); },
       [](at::Generator& g) {
         const at::Tensor ids = at::randint(11, {4, 8}, g, at::kLong);
         return std::make_pair(ids, ids.roll(-1, 1));
       },
       11},
      {"gpt untied", [] { return makeGpt({{"n_layer", 2}, {"n_head", 2}, {"n_embd", 16}, {"dropout", 0.0}, {"tie_weights", false}},
                                      11, 8); },
       [](at::Generator& g) {
         const at::Tensor ids = at::randint(11, {4, 8}, g, at::kLong);
         return std::make_pair(ids, ids.roll(-1, 1));
       },
       11},
  };
  for (const Case& c : cases) {
    {
      INFO(c.name << ": units alone and joined up to 20 KB");
      ModelPtr model = c.make();
      const auto alone = fsdpUnitOf(*model), joined = fsdpUnitOf(*model, 20000);
      CHECK(*std::max_element(alone.begin(), alone.end()) >= 1);
      CHECK(*std::max_element(joined.begin(), joined.end()) == 0);
    }
    std::map<std::string, std::vector<at::Tensor>> finals;
    std::map<std::string, std::pair<int64_t, int64_t>> held;  // parameter bytes held, and all of them
    for (const std::string strategy :
         {"ddp", "zero1", "zero2", "fsdp", "fsdp without backward prefetch", "fsdp with units joined"}) {
      INFO(c.name << " under " << strategy);
      std::vector<std::vector<at::Tensor>> params(kWorld);
      auto errors = runRanks("gloo", kWorld, [&](int rank, ProcessGroup& pg) {
        ModelPtr model = c.make();
        ddp::test::initParameters(*model, 5);  // the global generator is shared by the rank threads
        StrategyContext context;
        context.model = model;
        context.optimizer = std::make_unique<torch::optim::Adam>(model->parameters(), torch::optim::AdamOptions(1e-2));
        context.group = ProcessGroupPtr(&pg, [](ProcessGroup*) {});
        context.ddp.bucketCapBytes = 2048;  // several buckets, some inside a unit
        context.fsdp.backwardPrefetch = strategy != "fsdp without backward prefetch";
        // Units joined until 20 KB: the gpt's two blocks (13 KB each) are
        // one group, as are all of the mlp's and the cnn's units.
        if (strategy == "fsdp with units joined") context.fsdp.unitBytes = 20000;
        auto s = builtinStrategies().create(strategy.substr(0, strategy.find(' ')), std::move(context));
        model->train();
        at::Generator gen = at::detail::createCPUGenerator(300 + rank);
        for (int step = 0; step < kSteps; ++step) {
          auto [x, y] = c.batch(gen);
          const at::Tensor out = model->forward(x);
          s->backward(torch::nn::functional::cross_entropy(out.reshape({-1, c.classes}), y.reshape({-1})), true);
          s->step();
        }
        if (rank == 0) {
          int64_t all = 0;
          for (const auto& p : model->parameters()) all += p.numel() * 4;
          held[strategy] = {s->heldBytes().parameters, all};
        }
        s->withFullParameters([&] { params[rank] = cloneAll(model->parameters()); });
      });
      INFO(joinErrors(errors));
      REQUIRE(joinErrors(errors).empty());
      for (size_t i = 0; i < params[0].size(); ++i) CHECK(at::equal(params[0][i], params[1][i]));
      finals[strategy] = params[0];
    }
    for (const std::string strategy :
         {"zero1", "zero2", "fsdp", "fsdp without backward prefetch", "fsdp with units joined"}) {
      INFO(c.name << ": " << strategy << " against ddp");
      for (size_t i = 0; i < finals["ddp"].size(); ++i) {
        const at::Tensor& want = finals["ddp"][i];
        const double scale = std::max(1.0, want.abs().max().item<double>());
        CHECK(maxAbsDiff(finals[strategy][i], want) <= 1e-5 * scale);
      }
    }
    // Between steps fsdp holds its shard, the root whole, no unit.
    INFO(c.name << ": fsdp holds " << held["fsdp"].first << " of " << held["fsdp"].second << " parameter bytes");
    CHECK(held["fsdp"].first < held["zero2"].first);
    if (std::string(c.name) != "gpt tied" && std::string(c.name) != "gpt untied") {
      CHECK(held["fsdp"].first <= held["fsdp"].second / kWorld + 64 * 4);  // no root: about half
    }
  }
}
