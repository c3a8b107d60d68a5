// Plugins: the registry (listing, describing, errors), each built-in plugin
// against its contract (datasets' splits and file errors, the MLP's shapes,
// Adam/AdamW against LibTorch's, schedulers' closed forms, losses), and
// loading an out-of-tree plugin library.
#include <torch/torch.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <numeric>
#include <optional>
#include <sstream>

#include "backends/builtin.hpp"
#include "framework/core/errors.hpp"
#include "framework/core/strings.hpp"
#include "framework/experiment/experiment_config.hpp"
#include "framework/experiment/param.hpp"
#include "framework/experiment/plugin_registry.hpp"
#include "framework/experiment/trainer.hpp"
#include "framework/store/hash_store.hpp"
#include "plugins/builtin.hpp"
#include "tests/plugin_params.hpp"
#include "tests/test_support.hpp"

using namespace ddp;
using ddp::test::tensors;
using Catch::Matchers::Contains;
using Catch::Matchers::StartsWith;
using ddp::test::paramsFor;
using ddp::test::usageErrorOf;
using ddp::test::maxAbsDiff;
using ddp::test::TempDir;

namespace {

const PluginSpec& builtin(PluginKind kind, const std::string& name) { return builtinPlugins().get(kind, name); }

DatasetSplits loadDataset(const std::string& name, const Json& values = Json::object(), uint64_t seed = 0,
                          const std::string& configDir = "") {
  const auto& spec = builtin(PluginKind::Dataset, name);
  DatasetContext context;
  context.seed = seed;
  context.configDir = configDir;
  return spec.dataset(paramsFor(spec, values), context);
}

ModelPtr makeModel(const Json& values, int64_t features, int64_t classes) {
  const auto& spec = builtin(PluginKind::Model, "mlp");
  ModelContext context;
  context.numFeatures = features;
  context.numClasses = classes;
  return spec.model(paramsFor(spec, values), context);
}

std::unique_ptr<torch::optim::Optimizer> makeOptimizer(const std::string& name, std::vector<at::Tensor> params,
                                                       const Json& values = Json::object()) {
  const auto& spec = builtin(PluginKind::Optimizer, name);
  return spec.optimizer(std::move(params), paramsFor(spec, values));
}


// A model plugin that only holds a name, for tests of the registry itself.
PluginSpec placeholderModel(const std::string& name) {
  return {name, "placeholder", {}, [](const Params&, const ModelContext&) -> ModelPtr { return nullptr; }};
}

}  // namespace

// ---- registry ----------------------------------------------------------------------

TEST_CASE("plugin registry: kinds, types and closest names", "[plugins]") {
  for (auto kind :
       {PluginKind::Dataset, PluginKind::Model, PluginKind::Optimizer, PluginKind::Scheduler, PluginKind::Loss}) {
    auto back = pluginKindFromName(pluginKindName(kind));
    REQUIRE(back.has_value());
    CHECK(*back == kind);
  }
  CHECK(std::string(pluginKindName(PluginKind::Optimizer)) == "optimizer");
  CHECK_FALSE(pluginKindFromName("optimiser").has_value());
  CHECK(std::string(paramTypeName(ParamType::IntList)) == "int list");
  CHECK(std::string(paramTypeName(ParamType::Float)) == "float");

  CHECK(closestName("mpl", {"mlp"}) == "mlp");
  // A swap of adjacent letters is one edit: nearer than two substitutions.
  CHECK(closestName("mpl", {"cnn", "gpt", "mlp"}) == "mlp");
  CHECK(closestName("adma", {"adam", "adamw", "sgd"}) == "adam");
  CHECK(closestName("cross_entropi", {"cross_entropy", "mse"}) == "cross_entropy");
  CHECK(closestName("transformer", {"mlp"}).empty());
  CHECK(closestName("x", {}).empty());
}

TEST_CASE("plugin registry: the built-ins are listed and described", "[plugins]") {
  const auto& registry = builtinPlugins();
  CHECK(registry.names(PluginKind::Dataset) == std::vector<std::string>{"csv", "digits", "npy", "synthetic", "text", "wine"});
  CHECK(registry.names(PluginKind::Model) == std::vector<std::string>{"cnn", "gpt", "mlp"});
  CHECK(registry.names(PluginKind::Optimizer) == std::vector<std::string>{"adam", "adamw", "sgd"});
  CHECK(registry.names(PluginKind::Scheduler) == std::vector<std::string>{"constant", "cosine", "step"});
  CHECK(registry.names(PluginKind::Loss) == std::vector<std::string>{"cross_entropy", "mse"});
  CHECK(registry.has(PluginKind::Optimizer, "adam"));
  CHECK_FALSE(registry.has(PluginKind::Model, "adam"));

  const std::string listing = registry.listing();
  for (const char* expected : {"datasets:", "models:", "optimizers:", "schedulers:", "losses:", "wine", "synthetic",
                               "csv", "mlp", "adamw", "cosine", "cross_entropy", "UCI Wine"}) {
    CHECK_THAT(listing, Contains(expected));
  }

  const std::string adam = registry.describe("optimizer.adam");
  CHECK_THAT(adam, StartsWith("optimizer.adam: Adam"));
  for (const char* expected : {"param", "type", "default", "range", "lr", "float", "0.001", "> 0", "beta2", "0.999",
                               "1e-08", "weight_decay", ">= 0"}) {
    CHECK_THAT(adam, Contains(expected));
  }
  const std::string mlp = registry.describe("model.mlp");
  CHECK_THAT(mlp, Contains("int list"));
  CHECK_THAT(mlp, Contains("[0,64,0]"));
  CHECK_THAT(mlp, Contains("relu|tanh|gelu|sigmoid"));
  CHECK_THAT(registry.describe("dataset.csv"), Contains("(required)"));
  CHECK_THAT(registry.describe("loss.mse"), Contains("(no parameters)"));
  CHECK_THAT(registry.describe("dataset.wine"), Contains("(0, 1)"));

  const std::string typo = usageErrorOf([&] { registry.describe("optimizer.adma"); });
  CHECK_THAT(typo, Contains("no optimizer plugin 'adma' (did you mean 'adam'?)"));
  CHECK_THAT(typo, Contains("known optimizers: adam, adamw, sgd"));
  const std::string noKind = usageErrorOf([&] { registry.describe("adam"); });
  CHECK_THAT(noKind, StartsWith("cannot describe 'adam': expected KIND.NAME, or training, distributed, plugins; did you mean 'optimizer.adam'? known "
                                "plugins: dataset.csv, dataset.digits, dataset.npy, dataset.synthetic, dataset.text, dataset.wine, "
                                "model.cnn, model.gpt, model.mlp, optimizer.adam,"));
  CHECK_THAT(usageErrorOf([&] { registry.describe("zzz"); }),
             StartsWith("cannot describe 'zzz': expected KIND.NAME, or training, distributed, plugins; known plugins: dataset.csv,"));
  CHECK_THAT(noKind, Contains("optimizer.adam"));
  CHECK_THAT(noKind, Contains("dataset.wine"));
  CHECK_THAT(usageErrorOf([&] { registry.describe("optimiser.adam"); }), Contains("did you mean 'optimizer.adam'?"));
}

TEST_CASE("plugin registry: duplicate and unknown names are usage errors", "[plugins]") {
  PluginRegistry registry;
  PluginSpec spec = placeholderModel("mlp");
  registry.add(spec);
  CHECK(usageErrorOf([&] { registry.add(spec); }) == "plugin registry: model 'mlp' is registered twice");
  // The same name of another kind is a different plugin.
  PluginSpec loss{"mlp", "", {}, [](const Params&) -> LossFn { return nullptr; }};
  CHECK(loss.kind() == PluginKind::Loss);
  CHECK_NOTHROW(registry.add(loss));
  // The factory's type is the kind; an empty one is still refused.
  PluginSpec noFactory{"broken", "", {}, DatasetFactory()};
  CHECK(noFactory.kind() == PluginKind::Dataset);
  CHECK_THAT(usageErrorOf([&] { registry.add(noFactory); }), Contains("has no dataset factory"));
  // A spec asked for a plugin of another kind says so.
  CHECK(usageErrorOf([&] { registry.get(PluginKind::Loss, "mlp").model(Params(), ModelContext()); }) ==
        "loss 'mlp' is not a model plugin");

  CHECK(usageErrorOf([&] { registry.get(PluginKind::Model, "mpl"); }) ==
        "unknown model 'mpl'; did you mean 'mlp'? known models: mlp");
  CHECK(usageErrorOf([&] { registry.get(PluginKind::Model, "resnet50"); }) ==
        "unknown model 'resnet50'; known models: mlp");
  CHECK(usageErrorOf([&] { registry.get(PluginKind::Scheduler, "step"); }) ==
        "unknown scheduler 'step'; known schedulers: (none)");
  CHECK(usageErrorOf([&] { builtinPlugins().get(PluginKind::Loss, "mes"); }) ==
        "unknown loss 'mes'; did you mean 'mse'? known losses: cross_entropy, mse");
}

// ---- datasets ----------------------------------------------------------------------

TEST_CASE("dataset wine: 178 rows split 80/20, standardized on the training rows", "[plugins]") {
  auto wine = loadDataset("wine");
  CHECK(wine.numFeatures == 13);
  CHECK(wine.numClasses == 3);
  CHECK(tensors(wine.train).inputs().sizes() == at::IntArrayRef{142, 13});
  CHECK(tensors(wine.test).inputs().sizes() == at::IntArrayRef{36, 13});
  CHECK(tensors(wine.train).inputs().size(0) + tensors(wine.test).inputs().size(0) == 178);
  CHECK(tensors(wine.train).targets().sizes() == at::IntArrayRef{142});
  CHECK(tensors(wine.test).targets().sizes() == at::IntArrayRef{36});
  CHECK(tensors(wine.train).inputs().scalar_type() == torch::kFloat32);
  CHECK(tensors(wine.train).targets().scalar_type() == torch::kInt64);
  // All 59 + 71 + 48 rows arrive, once each.
  auto counts = torch::bincount(torch::cat({tensors(wine.train).targets(), tensors(wine.test).targets()}));
  CHECK(counts.equal(torch::tensor({59, 71, 48}, torch::kInt64)));

  auto trainMean = tensors(wine.train).inputs().mean(0);
  auto trainStd = (tensors(wine.train).inputs() - trainMean).pow(2).mean(0).sqrt();
  CHECK(trainMean.abs().max().item<double>() < 1e-5);
  CHECK((trainStd - 1).abs().max().item<double>() < 1e-4);
  // The test rows are scaled with the training statistics, so theirs differ.
  CHECK(tensors(wine.test).inputs().mean(0).abs().max().item<double>() > 1e-3);

  SECTION("the split depends on the seed only") {
    auto again = loadDataset("wine");
    CHECK(tensors(again.train).inputs().equal(tensors(wine.train).inputs()));
    CHECK(tensors(again.test).targets().equal(tensors(wine.test).targets()));
    auto other = loadDataset("wine", Json::object(), /*seed=*/1);
    CHECK_FALSE(tensors(other.test).inputs().equal(tensors(wine.test).inputs()));
    CHECK(tensors(other.test).inputs().size(0) == 36);
  }
  SECTION("without standardizing, the file's values come through") {
    auto raw = loadDataset("wine", {{"standardize", false}});
    // Proline (last feature) is in the hundreds; magnesium (5th) 70..162.
    CHECK(tensors(raw.train).inputs().select(1, 12).min().item<double>() >= 278);
    CHECK(tensors(raw.train).inputs().select(1, 4).max().item<double>() <= 162);
  }
  SECTION("test_fraction sets the split") {
    auto half = loadDataset("wine", {{"test_fraction", 0.5}});
    CHECK(tensors(half.train).inputs().size(0) == 89);
    CHECK(tensors(half.test).inputs().size(0) == 89);
    CHECK_THAT(usageErrorOf([] {
                 loadDataset("wine", {{"test_fraction", 1.0}});
               }),
               Contains("dataset.test_fraction: must be < 1"));
    CHECK_THAT(usageErrorOf([] { loadDataset("wine", {{"test_fraction", 0.001}}); }), Contains("no test rows"));
  }
  SECTION("the path resolves against the config directory first") {
    TempDir dir;
    std::filesystem::create_directories(dir.path() + "/data");
    std::string rows = "3,2,a,b\n1,2,0\n3,4,1\n5,6,1\n";
    dir.write("data/wine.csv", rows);
    auto tiny = loadDataset("wine", {{"test_fraction", 0.34}, {"standardize", false}}, 0, dir.path());
    CHECK(tiny.numFeatures == 2);
    CHECK(tensors(tiny.train).inputs().size(0) + tensors(tiny.test).inputs().size(0) == 3);
    CHECK_THAT(usageErrorOf([] {
                 loadDataset("wine", {{"path", "no/such/wine.csv"}});
               }),
               Contains("dataset.path: file 'no/such/wine.csv' not found"));
  }
}

TEST_CASE("dataset csv: reads a numeric table", "[plugins]") {
  TempDir dir;
  std::string table = "f1,f2,f3,label\n";
  for (int i = 0; i < 20; ++i) {
    table += std::to_string(i) + "," + std::to_string(i * 2) + ".5,-" + std::to_string(i) + "e-1," +
             std::to_string(i % 3) + "\n";
  }
  const std::string path = dir.write("table.csv", table);

  auto data = loadDataset("csv", {{"path", path}, {"standardize", false}, {"test_fraction", 0.25}});
  CHECK(data.numFeatures == 3);
  CHECK(data.numClasses == 3);
  CHECK(tensors(data.train).inputs().size(0) == 15);
  CHECK(tensors(data.test).inputs().size(0) == 5);
  // Every row keeps its own target: f1 is the row number, the label f1 % 3.
  auto all = torch::cat({tensors(data.train).inputs(), tensors(data.test).inputs()});
  auto labels = torch::cat({tensors(data.train).targets(), tensors(data.test).targets()});
  CHECK(all.select(1, 0).to(torch::kInt64).remainder(3).equal(labels));
  CHECK(all.select(1, 1).sub(all.select(1, 0) * 2).eq(0.5).all().item<bool>());

  SECTION("target column from the front, regression, no header") {
    auto first = loadDataset("csv", {{"path", path}, {"target_column", 0}, {"task", "regression"}});
    CHECK(first.numClasses == 0);
    CHECK(tensors(first.train).targets().scalar_type() == torch::kFloat32);
    CHECK(tensors(first.train).targets().dim() == 1);
    const std::string bare = dir.write("bare.csv", "1,2,3\n4,5,6\n7,8,9\n10,11,12\n");
    auto noHeader = loadDataset("csv", {{"path", bare}, {"header", false}, {"task", "regression"}});
    CHECK(tensors(noHeader.train).inputs().size(0) + tensors(noHeader.test).inputs().size(0) == 4);
    CHECK_THAT(usageErrorOf([&] {
                 loadDataset("csv", {{"path", path}, {"target_column", 4}});
               }),
               Contains("dataset.target_column: 4 is out of range for 4 columns"));
  }
}

TEST_CASE("dataset csv: bad files fail naming file and line", "[plugins]") {
  TempDir dir;
  const std::string good = "a,b,c,d,y\n1,2,3,4,0\n";
  auto errorFor = [&](const std::string& name, const std::string& content, Json extra = Json::object()) {
    std::string path = dir.write(name, content);
    extra["path"] = path;
    return usageErrorOf([&] { loadDataset("csv", extra); });
  };
  const std::string base = dir.path() + "/";

  CHECK(errorFor("ragged.csv", good + "1,2,3,4,1\n5,6,7,8,0\n1,1,1,1,1\n2,2,2,2,2\n1,2,3,0\n") ==
        base + "ragged.csv:7: expected 5 columns, found 4");
  CHECK(errorFor("text.csv", good + "1,abc,3,4,1\n") == base + "text.csv:3: column 2: 'abc' is not a number");
  CHECK(errorFor("nan.csv", good + "1,2,nan,4,1\n") == base + "nan.csv:3: column 3: 'nan' is not a finite number");
  CHECK(errorFor("inf.csv", good + "1,2,3,-inf,1\n") == base + "inf.csv:3: column 4: '-inf' is not a finite number");
  CHECK(errorFor("blank.csv", good + "1,,3,4,1\n") == base + "blank.csv:3: column 2: empty value");
  CHECK(errorFor("empty.csv", "") == base + "empty.csv: empty file");
  CHECK(errorFor("spaces.csv", "\n  \n") == base + "spaces.csv: empty file");
  CHECK_THAT(errorFor("header_only.csv", "a,b,c\n"), Contains("header_only.csv: no data rows"));
  CHECK_THAT(errorFor("fraction.csv", good + "1,2,3,4,1.5\n"),
             StartsWith(base + "fraction.csv:3: target 1.5 is not a class index"));
  CHECK_THAT(errorFor("negative.csv", good + "1,2,3,4,-1\n"), StartsWith(base + "negative.csv:3: target -1"));
  // A blank line still counts for the line numbers.
  CHECK(errorFor("gap.csv", good + "\n1,2,3,x,0\n") == base + "gap.csv:4: column 4: 'x' is not a number");
  // Regression takes any finite target.
  CHECK_NOTHROW(loadDataset(
      "csv", {{"path", dir.write("real.csv", good + "1,2,3,4,1.5\n1,2,3,4,2.5\n")}, {"task", "regression"}}));

  const std::string missing = base + "missing.csv";
  CHECK_THAT(usageErrorOf([&] {
               loadDataset("csv", {{"path", missing}});
             }),
             Contains("dataset.path: file '" + missing + "' not found"));
}

TEST_CASE("dataset synthetic: shapes, determinism, learnable", "[plugins]") {
  auto data = loadDataset("synthetic", {{"samples", 100}, {"features", 5}, {"classes", 3}}, 7);
  CHECK(tensors(data.train).inputs().sizes() == at::IntArrayRef{80, 5});
  CHECK(tensors(data.test).inputs().sizes() == at::IntArrayRef{20, 5});
  CHECK(data.numFeatures == 5);
  CHECK(data.numClasses == 3);
  CHECK(torch::cat({tensors(data.train).targets(), tensors(data.test).targets()}).max().item<int64_t>() == 2);
  CHECK(torch::isfinite(tensors(data.train).inputs()).all().item<bool>());

  auto again = loadDataset("synthetic", {{"samples", 100}, {"features", 5}, {"classes", 3}}, 7);
  CHECK(tensors(again.train).inputs().equal(tensors(data.train).inputs()));
  CHECK(tensors(again.test).targets().equal(tensors(data.test).targets()));
  auto other = loadDataset("synthetic", {{"samples", 100}, {"features", 5}, {"classes", 3}}, 8);
  CHECK_FALSE(tensors(other.train).inputs().equal(tensors(data.train).inputs()));

  // The defaults make an easy problem: a few full-batch Adam steps solve it.
  torch::manual_seed(0);
  auto blobs = loadDataset("synthetic");
  CHECK(tensors(blobs.train).inputs().sizes() == at::IntArrayRef{819, 16});
  auto model = makeModel({{"layers", {0, 32, 0}}}, blobs.numFeatures, blobs.numClasses);
  auto optimizer = makeOptimizer("adam", model->parameters(), {{"lr", 0.01}});
  for (int step = 0; step < 100; ++step) {
    optimizer->zero_grad();
    torch::cross_entropy_loss(model->forward(tensors(blobs.train).inputs()), tensors(blobs.train).targets()).backward();
    optimizer->step();
  }
  torch::NoGradGuard noGrad;
  auto accuracy = model->forward(tensors(blobs.test).inputs()).argmax(1).eq(tensors(blobs.test).targets()).to(torch::kFloat).mean();
  CHECK(accuracy.item<double>() > 0.95);
}

// ---- models ------------------------------------------------------------------------

TEST_CASE("model mlp: shapes, names, and widths checked against the dataset", "[plugins]") {
  auto model = makeModel(Json::object(), 13, 3);
  std::vector<std::string> names;
  for (const auto& item : model->named_parameters()) names.push_back(item.key());
  CHECK(names == std::vector<std::string>{"layers.0.weight", "layers.0.bias", "layers.1.weight", "layers.1.bias"});
  CHECK(model->named_parameters()["layers.0.weight"].sizes() == at::IntArrayRef{64, 13});
  CHECK(model->named_parameters()["layers.1.weight"].sizes() == at::IntArrayRef{3, 64});
  CHECK(model->forward(torch::randn({5, 13})).sizes() == at::IntArrayRef{5, 3});

  auto deep = makeModel({{"layers", {0, 8, 6, 0}}, {"activation", "gelu"}}, 7, 4);
  CHECK(deep->parameters().size() == 6);
  CHECK(deep->named_parameters().contains("layers.2.bias"));
  CHECK(deep->forward(torch::randn({2, 7})).sizes() == at::IntArrayRef{2, 4});
  // Regression: no classes, one output.
  auto regression = makeModel({{"layers", {0, 4, 0}}}, 3, 0);
  CHECK(regression->forward(torch::randn({2, 3})).sizes() == at::IntArrayRef{2, 1});

  for (const char* activation : {"relu", "tanh", "gelu", "sigmoid"}) {
    auto m = makeModel({{"activation", activation}}, 13, 3);
    CHECK(torch::isfinite(m->forward(torch::randn({4, 13}))).all().item<bool>());
  }

  CHECK_THAT(usageErrorOf([] {
               makeModel({{"layers", {12, 64, 3}}}, 13, 3);
             }),
             StartsWith("model.layers: first width 12 does not match the dataset's 13 features"));
  CHECK_THAT(usageErrorOf([] {
               makeModel({{"layers", {13, 64, 4}}}, 13, 3);
             }),
             StartsWith("model.layers: last width 4 does not match the dataset's 3 classes"));
  CHECK_THAT(usageErrorOf([] {
               makeModel({{"layers", Json::array({13})}}, 13, 3);
             }),
             StartsWith("model.layers: needs at least"));
  CHECK_THAT(usageErrorOf([] { makeModel({{"layers", {13, 0, 3}}}, 13, 3); }), Contains("width 0 at position 1"));
  CHECK_THAT(usageErrorOf([] { makeModel({{"dropout", 1.0}}, 13, 3); }), StartsWith("model.dropout: must be < 1"));
  CHECK_THAT(usageErrorOf([&] { model->forward(torch::randn({2, 12})); }), Contains("expected input [batch, 13]"));

  // Dropout acts in training mode only.
  auto dropping = makeModel({{"dropout", 0.5}}, 13, 3);
  auto x = torch::randn({64, 13});
  dropping->eval();
  CHECK(dropping->forward(x).equal(dropping->forward(x)));
  dropping->train();
  CHECK_FALSE(dropping->forward(x).equal(dropping->forward(x)));
}

namespace {

// The mlp's forward as composed ATen ops (torch::linear and the activation),
// recorded by autograd's own nodes: the reference for the fused layers.
at::Tensor composedMlp(torch::nn::Module& model, const at::Tensor& x, const std::string& activation) {
  std::vector<at::Tensor> weights, biases;
  for (const auto& item : model.named_parameters()) {
    (item.key().find("weight") != std::string::npos ? weights : biases).push_back(item.value());
  }
  at::Tensor h = x;
  for (size_t i = 0; i < weights.size(); ++i) {
    h = torch::linear(h, weights[i], biases[i]);
    if (i + 1 == weights.size()) break;
    if (activation == "relu") h = torch::relu(h);
    if (activation == "tanh") h = torch::tanh(h);
    if (activation == "gelu") h = torch::gelu(h);
    if (activation == "sigmoid") h = torch::sigmoid(h);
  }
  return h;
}

}  // namespace

TEST_CASE("model mlp: the fused layers match composed ATen ops, values and gradients", "[plugins]") {
  torch::manual_seed(5);
  struct Shape {
    std::vector<int64_t> widths;
    int64_t batch;
  };
  // The wine MLP; narrow and odd widths (the loops' short-row orders); a
  // layer above kSmallLinearMacs (ATen's path); an empty batch.
  const std::vector<Shape> shapes = {{{13, 64, 3}, 32}, {{5, 3, 9, 2}, 7}, {{3, 17, 1}, 33}, {{200, 400, 4}, 16},
                                     {{13, 64, 3}, 0}};
  for (auto dtype : {torch::kFloat32, torch::kFloat64}) {
    for (const char* activation : {"relu", "tanh", "gelu", "sigmoid"}) {
      for (const auto& shape : shapes) {
        CAPTURE(dtype, activation, shape.widths, shape.batch);
        auto model = makeModel({{"layers", shape.widths}, {"activation", activation}}, shape.widths.front(),
                               shape.widths.back() == 1 ? 0 : shape.widths.back());
        model->to(dtype);
        const double tolerance = dtype == torch::kFloat32 ? 1e-5 : 1e-12;
        auto x = torch::randn({shape.batch, shape.widths.front()}, dtype).requires_grad_(true);
        auto xRef = x.detach().clone().requires_grad_(true);
        auto ours = model->forward(x);
        auto theirs = composedMlp(*model, xRef, activation);
        REQUIRE(ours.sizes() == theirs.sizes());
        if (shape.batch == 0) continue;
        CHECK(maxAbsDiff(ours, theirs) <= tolerance * (1 + theirs.abs().max().item<double>()));
        // A gradient that is not contiguous (an expanded one) as well.
        auto weights = torch::randn({ours.size(1)}, dtype);
        auto ourGrads = torch::autograd::grad({(ours * weights).sum()}, {x, model->parameters()[0]});
        auto theirGrads = torch::autograd::grad({(theirs * weights).sum()}, {xRef, model->parameters()[0]});
        for (size_t i = 0; i < ourGrads.size(); ++i) {
          CAPTURE(i);
          CHECK(maxAbsDiff(ourGrads[i], theirGrads[i]) <= tolerance * (1 + theirGrads[i].abs().max().item<double>()));
        }
      }
    }
  }

  SECTION("no graph without grad mode, and evaluation mode gives training mode's values") {
    auto model = makeModel(Json::object(), 13, 3);
    auto x = torch::randn({4, 13});
    auto trained = model->forward(x);
    CHECK(trained.requires_grad());
    torch::NoGradGuard noGrad;
    auto plain = model->forward(x);
    CHECK_FALSE(plain.requires_grad());
    CHECK(plain.equal(trained.detach()));
  }

  SECTION("gradients of gradients (create_graph) are recorded") {
    for (const char* activation : {"relu", "tanh", "gelu", "sigmoid"}) {
      CAPTURE(activation);
      auto model = makeModel({{"layers", {3, 5, 2}}, {"activation", activation}}, 3, 2);
      model->to(torch::kFloat64);
      auto x = torch::randn({4, 3}, torch::kFloat64).requires_grad_(true);
      auto xRef = x.detach().clone().requires_grad_(true);
      auto w = model->parameters()[0];
      auto g = torch::autograd::grad({model->forward(x).pow(2).sum()}, {x, w}, {}, true, true);
      auto gRef = torch::autograd::grad({composedMlp(*model, xRef, activation).pow(2).sum()}, {xRef, w}, {}, true, true);
      auto gg = torch::autograd::grad({g[0].pow(2).sum() + g[1].sum()}, {x, w});
      auto ggRef = torch::autograd::grad({gRef[0].pow(2).sum() + gRef[1].sum()}, {xRef, w});
      CHECK(maxAbsDiff(gg[0], ggRef[0]) < 1e-12);
      CHECK(maxAbsDiff(gg[1], ggRef[1]) < 1e-12);
    }
  }

  SECTION("a weight changed in place after forward is caught by backward") {
    auto model = makeModel(Json::object(), 13, 3);
    auto y = model->forward(torch::randn({2, 13}));
    {
      torch::NoGradGuard noGrad;
      model->parameters()[0].add_(1);
    }
    CHECK_THROWS_WITH(y.sum().backward(), Contains("modified by an inplace operation"));
  }
}

// ---- optimizers --------------------------------------------------------------------

namespace {

// Steps `ours` and `theirs` side by side on copies of the same parameters
// with the same random gradients; returns the largest difference seen.
double runSideBySide(const std::string& name, const Json& values, torch::optim::Optimizer& theirs,
                     std::vector<at::Tensor>& theirParams, int steps = 6) {
  std::vector<at::Tensor> ourParams;
  for (const auto& p : theirParams) {
    // Same strides as theirs (clone keeps them), so non-contiguous stays so.
    ourParams.push_back(p.detach().clone().requires_grad_(true));
  }
  auto ours = makeOptimizer(name, ourParams, values);
  double worst = 0;
  for (int step = 0; step < steps; ++step) {
    for (size_t i = 0; i < ourParams.size(); ++i) {
      auto grad = torch::randn_like(theirParams[i]);
      theirParams[i].mutable_grad() = grad.clone();
      ourParams[i].mutable_grad() = grad.clone();
    }
    theirs.step();
    ours->step();
    for (size_t i = 0; i < ourParams.size(); ++i) worst = std::max(worst, maxAbsDiff(ourParams[i], theirParams[i]));
  }
  return worst;
}

std::vector<at::Tensor> randomParams(at::ScalarType dtype) {
  std::vector<at::Tensor> params;
  params.push_back(torch::randn({64, 13}, dtype).requires_grad_(true));
  params.push_back(torch::randn({64}, dtype).requires_grad_(true));
  // Non-contiguous: takes the tensor-op path.
  params.push_back(torch::randn({5, 7}, dtype).t().detach().requires_grad_(true));
  return params;
}

}  // namespace

TEST_CASE("optimizers adam and adamw match LibTorch's", "[plugins]") {
  torch::manual_seed(1);
  for (auto dtype : {torch::kFloat32, torch::kFloat64}) {
    CAPTURE(dtype);
    {
      auto params = randomParams(dtype);
      REQUIRE_FALSE(params[2].is_contiguous());
      torch::optim::Adam theirs(params, torch::optim::AdamOptions(0.01));
      CHECK(runSideBySide("adam", {{"lr", 0.01}}, theirs, params) < 1e-6);
    }
    {
      auto params = randomParams(dtype);
      torch::optim::Adam theirs(
          params, torch::optim::AdamOptions(0.05).betas(std::make_tuple(0.8, 0.99)).eps(1e-6).weight_decay(0.1));
      CHECK(runSideBySide("adam", {{"lr", 0.05}, {"beta1", 0.8}, {"beta2", 0.99}, {"eps", 1e-6}, {"weight_decay", 0.1}},
                          theirs, params) < 1e-6);
    }
    {
      auto params = randomParams(dtype);
      torch::optim::AdamW theirs(params, torch::optim::AdamWOptions(1e-3));  // weight_decay 0.01 in both
      CHECK(runSideBySide("adamw", Json::object(), theirs, params) < 1e-6);
    }
    {
      auto params = randomParams(dtype);
      torch::optim::AdamW theirs(params, torch::optim::AdamWOptions(0.02).weight_decay(0.3));
      CHECK(runSideBySide("adamw", {{"lr", 0.02}, {"weight_decay", 0.3}}, theirs, params) < 1e-6);
    }
  }

  SECTION("amsgrad, set through the group options, also matches") {
    auto params = randomParams(torch::kFloat32);
    torch::optim::Adam theirs(params, torch::optim::AdamOptions(0.01).amsgrad(true));
    std::vector<at::Tensor> ourParams;
    for (const auto& p : params) ourParams.push_back(p.detach().clone().requires_grad_(true));
    auto ours = makeOptimizer("adam", ourParams, {{"lr", 0.01}});
    static_cast<torch::optim::AdamOptions&>(ours->param_groups()[0].options()).amsgrad(true);
    double worst = 0;
    for (int step = 0; step < 6; ++step) {
      for (size_t i = 0; i < params.size(); ++i) {
        // Shrinking gradients, so that the max of the second moment matters.
        auto grad = torch::randn_like(params[i]) / (step + 1);
        params[i].mutable_grad() = grad.clone();
        ourParams[i].mutable_grad() = grad.clone();
      }
      theirs.step();
      ours->step();
      for (size_t i = 0; i < params.size(); ++i) worst = std::max(worst, maxAbsDiff(ourParams[i], params[i]));
    }
    CHECK(worst < 1e-6);
  }

  SECTION("parameters without a gradient are left alone") {
    auto p = torch::ones({3}).requires_grad_(true);
    auto optimizer = makeOptimizer("adam", {p});
    optimizer->step();
    CHECK(p.equal(torch::ones({3})));
  }
}

TEST_CASE("optimizers: lr through param groups, save and load", "[plugins]") {
  torch::manual_seed(2);
  for (const char* name : {"adam", "adamw", "sgd"}) {
    CAPTURE(name);
    Json values = std::string(name) == "sgd" ? Json{{"lr", 0.1}, {"momentum", 0.9}} : Json{{"lr", 0.01}};
    auto a = torch::randn({4, 3}).requires_grad_(true);
    auto b = torch::randn({3}).requires_grad_(true);
    auto first = makeOptimizer(name, {a, b}, values);
    auto& options = first->param_groups()[0].options();
    CHECK(options.get_lr() == Approx(values["lr"].get<double>()));
    options.set_lr(0.005);
    CHECK(first->param_groups()[0].options().get_lr() == 0.005);

    auto stepWith = [](torch::optim::Optimizer& optimizer, std::vector<at::Tensor> params, int seed) {
      torch::manual_seed(seed);
      for (auto& p : params) p.mutable_grad() = torch::randn_like(p);
      optimizer.step();
    };
    for (int s = 0; s < 3; ++s) stepWith(*first, {a, b}, 10 + s);

    std::stringstream buffer;
    {
      torch::serialize::OutputArchive archive;
      first->save(archive);
      archive.save_to(buffer);
    }
    // A fresh optimizer over copies of the parameters, as a resumed run has.
    auto a2 = a.detach().clone().requires_grad_(true);
    auto b2 = b.detach().clone().requires_grad_(true);
    auto second = makeOptimizer(name, {a2, b2}, values);
    {
      torch::serialize::InputArchive archive;
      archive.load_from(buffer);
      second->load(archive);
    }
    CHECK(second->param_groups()[0].options().get_lr() == 0.005);
    // With the moments restored, the next steps are identical.
    for (int s = 0; s < 2; ++s) {
      stepWith(*first, {a, b}, 20 + s);
      stepWith(*second, {a2, b2}, 20 + s);
    }
    CHECK(a.equal(a2));
    CHECK(b.equal(b2));
  }

  CHECK_THAT(usageErrorOf([] {
               makeOptimizer("sgd", {torch::zeros({1})}, {{"nesterov", true}});
             }),
             Contains("optimizer.nesterov: needs momentum > 0"));
  CHECK_THAT(usageErrorOf([] {
               makeOptimizer("sgd", {torch::zeros({1})}, {{"momentum", 1.0}});
             }),
             Contains("optimizer.momentum: must be < 1, got 1"));
  CHECK_THAT(usageErrorOf([] {
               makeOptimizer("adam", {torch::zeros({1})}, {{"beta2", 1.0}});
             }),
             Contains("optimizer.beta2: must be < 1"));
}

TEST_CASE("training wine with the built-ins is fast and accurate", "[plugins][solo]") {
  auto wine = loadDataset("wine");
  auto trainOnce = [&](bool ours) {
    torch::manual_seed(3);
    auto model = makeModel(Json::object(), 13, 3);
    std::unique_ptr<torch::optim::Optimizer> optimizer;
    if (ours) {
      optimizer = makeOptimizer("adam", model->parameters(), {{"lr", 0.01}});
    } else {
      optimizer = std::make_unique<torch::optim::Adam>(model->parameters(), torch::optim::AdamOptions(0.01));
    }
    auto loss = builtin(PluginKind::Loss, "cross_entropy").loss(Params(Json{{"label_smoothing", 0.0}}));
    const int64_t n = tensors(wine.train).inputs().size(0);
    auto start = std::chrono::steady_clock::now();
    for (int64_t step = 0, offset = 0; step < 500; ++step) {
      if (offset >= n) offset = 0;
      const int64_t end = std::min(offset + 32, n);
      optimizer->zero_grad();
      loss(model->forward(tensors(wine.train).inputs().slice(0, offset, end)), tensors(wine.train).targets().slice(0, offset, end))
          .backward();
      optimizer->step();
      offset = end;
    }
    double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    torch::NoGradGuard noGrad;
    double accuracy =
        model->forward(tensors(wine.test).inputs()).argmax(1).eq(tensors(wine.test).targets()).to(torch::kFloat).mean().item<double>();
    return std::make_pair(seconds, accuracy);
  };
  auto [ourSeconds, ourAccuracy] = trainOnce(true);
  auto [torchSeconds, torchAccuracy] = trainOnce(false);
  INFO("wine, 500 Adam steps of batch 32: fused " << ourSeconds * 1e3 << " ms, torch::optim::Adam "
                                                  << torchSeconds * 1e3 << " ms");
  CHECK(ourAccuracy >= 0.9);
  CHECK(ourAccuracy == Approx(torchAccuracy).margin(0.06));
  // Against torch's Adam timed alike, in the same sitting (a loaded machine
  // slows both): a regression to many tensor ops per parameter would show.
  CHECK(ourSeconds < 3.0 * torchSeconds);
}

// ---- schedulers and losses ---------------------------------------------------------

TEST_CASE("schedulers: closed-form learning rates", "[plugins]") {
  const auto& stepSpec = builtin(PluginKind::Scheduler, "step");
  auto step = stepSpec.scheduler(paramsFor(stepSpec, {{"step_size", 10}, {"gamma", 0.5}}));
  CHECK(step->lrAt(0, 0.1) == Approx(0.1));
  CHECK(step->lrAt(9, 0.1) == Approx(0.1));
  CHECK(step->lrAt(10, 0.1) == Approx(0.05));
  CHECK(step->lrAt(25, 0.1) == Approx(0.025));
  auto defaults = stepSpec.scheduler(paramsFor(stepSpec));
  CHECK(defaults->lrAt(30, 1.0) == Approx(0.1));
  CHECK(defaults->lrAt(60, 1.0) == Approx(0.01));

  const auto& cosineSpec = builtin(PluginKind::Scheduler, "cosine");
  auto cosine = cosineSpec.scheduler(paramsFor(cosineSpec, {{"t_max", 10}, {"eta_min", 0.1}}));
  CHECK(cosine->lrAt(0, 1.0) == Approx(1.0));
  CHECK(cosine->lrAt(5, 1.0) == Approx(0.55));
  CHECK(cosine->lrAt(2, 1.0) == Approx(0.1 + 0.9 * (1 + std::cos(M_PI * 0.2)) / 2));
  CHECK(cosine->lrAt(10, 1.0) == Approx(0.1));
  CHECK(cosine->lrAt(25, 1.0) == Approx(0.1));  // stays at eta_min
  auto plain = cosineSpec.scheduler(paramsFor(cosineSpec));
  CHECK(plain->lrAt(50, 0.2) == Approx(0.1));
  CHECK(plain->lrAt(100, 0.2) == Approx(0.0).margin(1e-12));
}

TEST_CASE("losses: cross entropy and mse", "[plugins]") {
  torch::manual_seed(4);
  auto output = torch::randn({6, 3});
  auto target = torch::tensor({0, 1, 2, 2, 1, 0}, torch::kInt64);
  const auto& ceSpec = builtin(PluginKind::Loss, "cross_entropy");
  auto ce = ceSpec.loss(paramsFor(ceSpec));
  CHECK(ce(output, target).item<double>() == Approx(torch::cross_entropy_loss(output, target).item<double>()));
  // Label smoothing eps: (1 - eps) * NLL + eps * mean over classes of -log p.
  auto smooth = ceSpec.loss(paramsFor(ceSpec, {{"label_smoothing", 0.2}}));
  auto logp = torch::log_softmax(output, 1);
  double expected = (0.8 * -logp.gather(1, target.unsqueeze(1)).squeeze(1) + 0.2 * -logp.mean(1)).mean().item<double>();
  CHECK(smooth(output, target).item<double>() == Approx(expected));
  CHECK_THAT(usageErrorOf([&] { ce(output, torch::randn({6, 3, 2})); }), Contains("HINT: use the mse loss"));
  // With a gradient (one autograd node of its own): the same loss and
  // gradient as LibTorch's, ignored targets (-100) included.
  for (auto dtype : {torch::kFloat32, torch::kFloat64}) {
    auto logits = torch::randn({6, 3}, dtype).requires_grad_(true);
    auto logitsRef = logits.detach().clone().requires_grad_(true);
    auto partly = torch::tensor({0, -100, 2, 2, -100, 1}, torch::kInt64);
    for (const auto& t : {target, partly}) {
      auto ours = ce(logits, t);
      auto theirs = torch::cross_entropy_loss(logitsRef, t);
      CHECK(ours.item<double>() == Approx(theirs.item<double>()).epsilon(1e-12));
      auto g = torch::autograd::grad({ours}, {logits}, {}, true, true)[0];
      auto gRef = torch::autograd::grad({theirs}, {logitsRef}, {}, true, true)[0];
      CHECK(g.equal(gRef));
      // create_graph: the gradient is differentiable in the logits too.
      auto weights = torch::randn_like(g);
      auto gg = torch::autograd::grad({(g * weights).sum()}, {logits})[0];
      auto ggRef = torch::autograd::grad({(gRef * weights).sum()}, {logitsRef})[0];
      CHECK(maxAbsDiff(gg, ggRef) < (dtype == torch::kFloat32 ? 1e-6 : 1e-12));
    }
  }

  const auto& mseSpec = builtin(PluginKind::Loss, "mse");
  auto mse = mseSpec.loss(paramsFor(mseSpec));
  auto prediction = torch::tensor({{1.0f}, {2.0f}, {4.0f}});
  CHECK(mse(prediction, torch::tensor({1.0f, 1.0f, 1.0f})).item<double>() == Approx((0 + 1 + 9) / 3.0));
  CHECK(mse(output, target).item<double>() ==
        Approx(torch::mse_loss(output, torch::one_hot(target, 3).to(torch::kFloat)).item<double>()));
  CHECK_THAT(usageErrorOf([&] { mse(prediction, torch::ones({4})); }), Contains("do not match"));
}

// ---- plugin libraries --------------------------------------------------------------

TEST_CASE("plugin libraries: the example loads, bad ones fail clearly", "[plugins]") {
  PluginRegistry registry;
  registerBuiltinPlugins(registry);
  REQUIRE_FALSE(registry.has(PluginKind::Model, "linear"));
  loadPluginLibrary(DDP_EXAMPLE_PLUGIN_PATH, registry);
  CHECK(registry.has(PluginKind::Model, "linear"));
  CHECK(registry.has(PluginKind::Loss, "smooth_l1"));
  CHECK_THAT(registry.listing(), Contains("example plugin"));
  CHECK_THAT(registry.describe("loss.smooth_l1"), Contains("beta"));
  // The global registry is untouched.
  CHECK_FALSE(builtinPlugins().has(PluginKind::Model, "linear"));

  const auto& linear = registry.get(PluginKind::Model, "linear");
  ModelContext context;
  context.numFeatures = 13;
  context.numClasses = 3;
  auto model = linear.model(Params(), context);
  CHECK(model->forward(torch::randn({4, 13})).sizes() == at::IntArrayRef{4, 3});
  CHECK(model->parameters().size() == 2);
  const auto& smoothL1 = registry.get(PluginKind::Loss, "smooth_l1");
  auto loss = smoothL1.loss(Params(Json{{"beta", 1.0}}));
  CHECK(loss(torch::tensor({{0.5f}, {3.0f}}), torch::zeros({2})).item<double>() == Approx((0.125 + 2.5) / 2));

  // Loading it again (an experiment read twice in one process) is a no-op.
  const auto modelsBefore = registry.names(PluginKind::Model);
  CHECK_NOTHROW(loadPluginLibrary(DDP_EXAMPLE_PLUGIN_PATH, registry));
  CHECK(registry.names(PluginKind::Model) == modelsBefore);

  // A library whose names are taken: the registry refuses, and the error
  // crosses back out of the library as a UsageError.
  PluginRegistry taken;
  taken.add(placeholderModel("linear"));
  CHECK(usageErrorOf([&] { loadPluginLibrary(DDP_EXAMPLE_PLUGIN_PATH, taken); }) ==
        "plugin registry: model 'linear' is registered twice");

  TempDir dir;
  const std::string missing = dir.path() + "/libmissing.so";
  CHECK(usageErrorOf([&] { loadPluginLibrary(missing, registry); }) ==
        "plugin library '" + missing + "': file not found");
  // A library cut short (a copy that did not finish): dlopen() would map it
  // and die of SIGBUS on the missing pages.
  {
    std::ifstream whole(DDP_EXAMPLE_PLUGIN_PATH, std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(whole)), std::istreambuf_iterator<char>());
    const std::string half = dir.path() + "/libhalf.so";
    std::ofstream(half, std::ios::binary) << bytes.substr(0, bytes.size() / 2);
    CHECK_THAT(usageErrorOf([&] { loadPluginLibrary(half, registry); }),
               Contains("plugin library '" + half + "': the file is cut short: " + std::to_string(bytes.size() / 2) +
                        " bytes, where its ELF headers describe"));
  }
  CHECK(usageErrorOf([&] { loadPluginLibrary(DDP_NO_SYMBOL_PLUGIN_PATH, registry); }) ==
        std::string("plugin library '") + DDP_NO_SYMBOL_PLUGIN_PATH +
            "' has no ddp_register_plugins symbol. HINT: export extern \"C\" void "
            "ddp_register_plugins(ddp::PluginRegistry&)");
  // Libraries built against another plugin interface are refused before
  // they register anything, naming both versions.
  const std::string wrongVersion = DDP_WRONG_VERSION_PLUGIN_PATH;
  CHECK(usageErrorOf([&] { loadPluginLibrary(wrongVersion, registry); }) ==
        "plugin library '" + wrongVersion +
            "' was built for plugin API version 999; this ddp has plugin API version 5. HINT: rebuild it against "
            "this ddp's headers");
  const std::string unversioned = DDP_UNVERSIONED_PLUGIN_PATH;
  CHECK(usageErrorOf([&] { loadPluginLibrary(unversioned, registry); }) ==
        "plugin library '" + unversioned +
            "' has no plugin API version (no ddp_plugin_api_version symbol); this ddp has plugin API version 5. "
            "HINT: rebuild it against this ddp, with DDP_EXPORT_PLUGIN_API_VERSION(); in one of its sources");
  CHECK_FALSE(registry.has(PluginKind::Model, "refused_model"));
  // Refused, not remembered: a second try is refused again.
  CHECK_THAT(usageErrorOf([&] { loadPluginLibrary(wrongVersion, registry); }), Contains("version 999"));
  CHECK(DDP_PLUGIN_API_VERSION == 5);

  const std::string notElf =
      dir.write("libtext.so", std::string(20, '#') + " not a shared library, just long enough for an ELF header\n" +
                                  std::string(200, '#') + "\n");
  const std::string notElfError = usageErrorOf([&] { loadPluginLibrary(notElf, registry); });
  CHECK_THAT(notElfError, StartsWith("plugin library '" + notElf + "': "));
  CHECK_THAT(notElfError, Contains("ELF"));
}

TEST_CASE("ddp-run trains an experiment whose model comes from a plugin library, on 1 and 2 ranks",
          "[plugins][launcher][solo]") {
  TempDir dir;
  const std::string experiment = dir.write("linear.json", R"({
    "plugins": [")" + std::string(DDP_EXAMPLE_PLUGIN_PATH) + R"("],
    "dataset": {"name": "wine"}, "model": {"name": "linear"}, "optimizer": {"name": "adam", "lr": 0.05},
    "loss": {"name": "cross_entropy"}, "training": {"epochs": 3, "threads": 1}})");
  for (const std::string ranks : {"1", "2"}) {
    const std::string runDir = dir.path() + "/run" + ranks;
    ddp::test::ProgramOutcome o =
        ddp::test::runDdpRun("--nproc-per-node " + ranks + " " + experiment + " --out " + runDir);
    INFO(o.output);
    CHECK(o.exitCode == 0);
    CHECK_THAT(o.output, Contains("done: "));
    CHECK(std::filesystem::exists(runDir + "/metrics.jsonl"));
  }
}

// ---- the public Param builder --------------------------------------------------------

TEST_CASE("the public Param builder fills every ParamSpec field", "[plugins]") {
  const ParamSpec lr = Param("lr", ParamType::Float, 0.01, "learning rate").above(0).atMost(1);
  CHECK(lr.name == "lr");
  CHECK(lr.type == ParamType::Float);
  CHECK(lr.defaultValue == Json(0.01));
  CHECK(lr.min == 0.0);
  CHECK(lr.minExclusive);
  CHECK(lr.max == 1.0);
  CHECK(lr.doc == "learning rate");
  CHECK_FALSE(lr.isFile);
  const ParamSpec steps = Param("steps", ParamType::Int, 3, "").above(5).atLeast(1);
  CHECK(steps.min == 1.0);
  CHECK_FALSE(steps.minExclusive);  // the last bound set wins
  const ParamSpec path = Param("path", ParamType::String, nullptr, "input").file();
  CHECK(path.defaultValue.is_null());
  CHECK(path.isFile);
  const ParamSpec mode = Param("mode", ParamType::String, "a", "").oneOf({"a", "b"});
  CHECK(mode.choices == std::vector<std::string>{"a", "b"});
  // The same declaration the registry describes.
  PluginRegistry registry;
  registry.add({"m", "doc", {Param("lr", ParamType::Float, 0.01, "learning rate").above(0).atMost(1)},
                [](const Params&, const ModelContext&) -> ModelPtr { return nullptr; }});
  CHECK_THAT(registry.describe("model.m"), Contains("(0, 1]"));
}

// ---- the dataset's shape reaches the model ---------------------------------------------

namespace {

// Trains `experiment` (JSON text) for its epochs on one rank, quietly.
TrainResult trainText(const std::string& experiment, PluginRegistry& registry, const std::string& configDir = "") {
  const ExperimentConfig config = parseExperimentConfig(experiment, "test", configDir, {}, registry);
  auto ctx = ddp::test::singleProcessContext();
  RunOptions ro;
  ro.runDir = ddp::test::tempDir();
  ro.quiet = true;
  return runTraining(config, ctx, ro, registry);
}

// A Linear model that records the context the trainer built it with; on
// token windows, one Linear from each token id to the vocabulary's logits.
class ProbeModel : public Model {
 public:
  explicit ProbeModel(const ModelContext& context) : tokens_(context.vocabSize > 0) {
    linear_ = register_module("linear", torch::nn::Linear(tokens_ ? 1 : context.numFeatures,
                                                          std::max<int64_t>(1, context.numClasses)));
  }
  at::Tensor forward(const at::Tensor& input) override {
    return tokens_ ? linear_->forward(input.to(at::kFloat).unsqueeze(-1)) : linear_->forward(input.flatten(1));
  }

 private:
  bool tokens_;
  torch::nn::Linear linear_{nullptr};
};

// A version 1.0 .npy file of `shape` holding `values`, as numpy.save writes
// it (little-endian, C order, the header padded to 64 bytes).
template <typename T>
std::string npyBytes(const std::string& descr, const std::vector<int64_t>& shape, const std::vector<T>& values) {
  std::string header = "{'descr': '" + descr + "', 'fortran_order': False, 'shape': (" + joinNames(shape) +
                       (shape.size() == 1 ? "," : "") + "), }";
  while ((10 + header.size() + 1) % 64 != 0) header += ' ';
  header += '\n';
  std::string out("\x93NUMPY\x01\x00", 8);
  out += static_cast<char>(header.size() & 0xff);
  out += static_cast<char>(header.size() >> 8);
  out += header;
  out.append(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(T));
  return out;
}

}  // namespace

TEST_CASE("each built-in dataset's sample shape reaches the model context through the trainer", "[plugins][training]") {
  PluginRegistry registry;
  registerBuiltinPlugins(registry);
  std::optional<ModelContext> seen;
  registry.add({"probe", "records its context", {}, [&seen](const Params&, const ModelContext& context) -> ModelPtr {
                  seen = context;
                  return std::make_shared<ProbeModel>(context);
                }});
  TempDir dir;
  const std::string csv = dir.write("table.csv", "a,b,c,y\n1,2,3,0\n4,5,6,1\n7,8,9,0\n1,3,5,1\n2,4,6,0\n");
  // The dataset section for each built-in dataset; a new one must be added here.
  const std::map<std::string, Json> sections = {
      {"wine", {{"name", "wine"}}},
      {"csv", {{"name", "csv"}, {"path", csv}}},
      {"synthetic", {{"name", "synthetic"}, {"samples", 40}, {"features", 6}, {"classes", 3}}},
      {"digits", {{"name", "digits"}}},
      {"text", {{"name", "text"}, {"path", dir.write("corpus.txt", std::string(200, 'a') + "bcd\n")}, {"block_size", 8}}},
      {"npy",
       {{"name", "npy"},
        {"features", dir.write("images.npy", npyBytes<float>("<f4", {6, 1, 2, 3}, std::vector<float>(36, 0.5f)))},
        {"labels", dir.write("labels.npy", npyBytes<int64_t>("<i8", {6}, {0, 1, 0, 1, 0, 1}))}}},
  };
  for (const auto& name : registry.names(PluginKind::Dataset)) {
    INFO("dataset " << name);
    REQUIRE(sections.count(name) == 1);
    const Json& section = sections.at(name);
    // What the dataset itself says, loaded directly.
    const auto& spec = registry.get(PluginKind::Dataset, name);
    Json params = section;
    params.erase("name");
    const DatasetSplits data = spec.dataset(paramsFor(spec, params), DatasetContext{0, ""});
    const Batch first = data.train->range(0, 1);  // alive while `sizes` points into it
    const auto sizes = first.inputs.sizes();
    CHECK(data.sampleShape == std::vector<int64_t>(sizes.begin() + 1, sizes.end()));
    CHECK(data.numFeatures ==
          std::accumulate(data.sampleShape.begin(), data.sampleShape.end(), int64_t{1}, std::multiplies<>()));
    if (data.task == Task::NextToken) {
      CHECK(data.vocabSize == data.numClasses);
    } else {
      CHECK(data.vocabSize == 0);
    }

    seen.reset();
    Json experiment = {{"dataset", section},
                       {"model", {{"name", "probe"}}},
                       {"optimizer", {{"name", "sgd"}}},
                       {"loss", {{"name", "cross_entropy"}}},
                       {"training", {{"epochs", 1}, {"max_steps", 1}, {"seed", 0}, {"save_every", 0}}}};
    trainText(experiment.dump(), registry, dir.path());
    REQUIRE(seen.has_value());
    CHECK(seen->sampleShape == data.sampleShape);
    CHECK(seen->numFeatures == data.numFeatures);
    CHECK(seen->numClasses == data.numClasses);
    CHECK(seen->vocabSize == data.vocabSize);
  }
}

TEST_CASE("modelContextFor carries shape and vocabulary, and fills a missing shape from the tensors", "[plugins]") {
  DatasetSplits images;
  images.train = std::make_shared<TensorDataset>(torch::zeros({5, 1, 8, 8}), torch::zeros({5}, torch::kInt64));
  images.numFeatures = 64;
  images.numClasses = 10;
  ModelContext context = modelContextFor(images);  // sampleShape left empty by the dataset
  CHECK(context.sampleShape == std::vector<int64_t>{1, 8, 8});
  CHECK(context.numFeatures == 64);
  CHECK(context.numClasses == 10);

  DatasetSplits tokens;
  tokens.train = std::make_shared<TensorDataset>(torch::zeros({5, 16}, torch::kInt64), torch::zeros({5, 16}, torch::kInt64));
  tokens.sampleShape = {16};
  tokens.vocabSize = 100;
  context = modelContextFor(tokens);
  CHECK(context.sampleShape == std::vector<int64_t>{16});
  CHECK(context.vocabSize == 100);
}

// ---- the plain template model --------------------------------------------------------

TEST_CASE("the example plugin's plain torch::nn MLP trains on wine through the registry like the built-in mlp",
          "[plugins][training]") {
  PluginRegistry registry;
  registerBuiltinPlugins(registry);
  loadPluginLibrary(DDP_EXAMPLE_PLUGIN_PATH, registry);
  REQUIRE(registry.has(PluginKind::Model, "plain_mlp"));
  const auto experiment = [](const Json& model) {
    return Json{{"dataset", {{"name", "wine"}}},
                {"model", model},
                {"optimizer", {{"name", "adam"}, {"lr", 0.01}}},
                {"loss", {{"name", "cross_entropy"}}},
                {"training", {{"epochs", 20}, {"batch_size", 32}, {"seed", 5}, {"save_every", 0}}}}
        .dump();
  };
  const TrainResult plain = trainText(experiment({{"name", "plain_mlp"}, {"hidden", {64}}}), registry);
  // The reference: the built-in mlp of the same widths, whose fused layers
  // agree with torch::nn::Linear to float rounding. Both draw their
  // initial weights in the same order from the same seed.
  const TrainResult fused = trainText(experiment({{"name", "mlp"}, {"layers", {0, 64, 0}}}), registry);
  REQUIRE(plain.history.size() == 20);
  REQUIRE(plain.history.back().testAccuracy);
  INFO("plain: train loss " << plain.history.back().trainLoss << ", test accuracy "
                            << *plain.history.back().testAccuracy);
  CHECK(plain.history.front().trainLoss > 2 * plain.history.back().trainLoss);
  CHECK(*plain.history.back().testAccuracy >= 0.9);
  REQUIRE(plain.finalParameters.size() == fused.finalParameters.size());
  for (size_t i = 0; i < plain.finalParameters.size(); ++i) {
    CHECK(plain.finalParameters[i].sizes() == fused.finalParameters[i].sizes());
    CHECK(maxAbsDiff(plain.finalParameters[i], fused.finalParameters[i]) < 1e-3);
  }
  CHECK(plain.history.back().trainLoss == Approx(fused.history.back().trainLoss).epsilon(1e-3));
}

TEST_CASE("a hook from a plugin library trains wine as the built-in average does", "[comm_hook][plugins][launcher][solo]") {
  const std::string dir = ddp::test::tempDir();
  std::map<std::string, std::string> lastRecord;
  for (const char* hook : {"allreduce", "sum_then_divide"}) {
    const std::string experiment = dir + "/" + hook + ".json";
    std::ofstream(experiment) << Json{
        {"name", "hooked"},
        {"plugins", Json::array({DDP_EXAMPLE_PLUGIN_PATH})},
        {"dataset", {{"name", "wine"}}},
        {"model", {{"name", "mlp"}, {"layers", {13, 32, 3}}}},
        {"optimizer", {{"name", "adam"}, {"lr", 0.01}}},
        {"loss", {{"name", "cross_entropy"}}},
        {"training", {{"epochs", 10}, {"batch_size", 16}, {"seed", 3}}},
        {"distributed", {{"nproc_per_node", 2}, {"comm_hook", hook}}}}.dump();
    const auto o = ddp::test::runDdpRun(experiment + " --out " + dir + "/" + hook);
    INFO(hook << ": " << o.output);
    REQUIRE(o.exitCode == 0);
    std::ifstream metrics(dir + "/" + hook + "/metrics.jsonl");
    std::string line;
    while (std::getline(metrics, line)) {
      if (!line.empty()) lastRecord[hook] = line;
    }
  }
  const auto exact = Json::parse(lastRecord["allreduce"]);
  const auto plugin = Json::parse(lastRecord["sum_then_divide"]);
  CHECK(plugin["train_loss"].get<double>() == Approx(exact["train_loss"].get<double>()).epsilon(1e-4));
  CHECK(plugin["test_accuracy"].get<double>() == exact["test_accuracy"].get<double>());
}

TEST_CASE("ddp-run refuses a plugin library built for another plugin API version, in one line", "[plugins][launcher]") {
  TempDir dir;
  const std::string experiment = dir.write("refused.json", R"({
    "plugins": [")" + std::string(DDP_WRONG_VERSION_PLUGIN_PATH) + R"("],
    "dataset": {"name": "wine"}, "model": {"name": "mlp"}, "optimizer": {"name": "adam"},
    "loss": {"name": "cross_entropy"}})");
  const std::string runDir = dir.path() + "/run";
  ddp::test::ProgramOutcome o = ddp::test::runDdpRun(experiment + " --out " + runDir);
  INFO(o.output);
  CHECK(o.exitCode == 2);
  CHECK_THAT(o.output, Contains("plugins[0]: plugin library '"));
  CHECK_THAT(o.output, Contains("was built for plugin API version 999; this ddp has plugin API version 5. HINT: "));
  CHECK(std::count(o.output.begin(), o.output.end(), '\n') == 1);
  CHECK_FALSE(std::filesystem::exists(runDir));
}
