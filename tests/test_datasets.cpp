// The digits and text datasets, cross-entropy per token, and the metrics
// each task writes. Each is checked against a closed form or a plain
// reference (the file itself, numpy's reading of it).
#include <torch/torch.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <numeric>
#include <sstream>

#include "framework/core/errors.hpp"
#include "framework/experiment/experiment_config.hpp"
#include "framework/experiment/plugin_registry.hpp"
#include "framework/experiment/trainer.hpp"
#include "plugins/builtin.hpp"
#include "apps/sample.hpp"
#include "framework/experiment/trained_model.hpp"
#include "plugins/datasets/text.hpp"
#include "tests/plugin_params.hpp"
#include "tests/test_support.hpp"

using namespace ddp;
using ddp::test::paramsFor;
using ddp::test::usageErrorOf;
using ddp::test::tensors;
using ddp::test::readFile;
using ddp::test::writeFileIn;
using ddp::plugins::ByteVocabulary;
using Catch::Matchers::Contains;

namespace {

DatasetSplits load(const std::string& name, const Json& values = Json::object(), uint64_t seed = 0) {
  const auto& spec = builtinPlugins().get(PluginKind::Dataset, name);
  return spec.dataset(paramsFor(spec, values), DatasetContext{seed, ""});
}

// A token model for these tests: logits from a table row per token.
struct Bigram : Model {
  explicit Bigram(int64_t vocab) { table = register_module("table", torch::nn::Embedding(vocab, vocab)); }
  at::Tensor forward(const at::Tensor& input) override { return table->forward(input); }
  torch::nn::Embedding table{nullptr};
};

// The built-ins and test_bigram; not builtinPlugins(), whose models other
// tests list.
void registerWithBigram(PluginRegistry& registry) {
  registerBuiltinPlugins(registry);
  registry.add({"test_bigram", "logits from a table per token", {},
                [](const Params&, const ModelContext& c) -> ModelPtr { return std::make_shared<Bigram>(c.vocabSize); }});
}

// Trains `experiment` on one rank in a fresh run folder; returns the folder.
std::string train(const Json& experiment, PluginRegistry& registry) {
  const ExperimentConfig config = parseExperimentConfig(experiment.dump(), "test", "", {}, registry);
  auto ctx = ddp::test::singleProcessContext();
  RunOptions options;
  options.runDir = ddp::test::tempDir() + "/run";
  options.quiet = true;
  runTraining(config, ctx, options, registry);
  return options.runDir;
}

}  // namespace

// ---- digits ------------------------------------------------------------------------------

TEST_CASE("digits: 1,797 images [1, 8, 8] in [0, 1], the file's pixels and class counts", "[datasets]") {
  const DatasetSplits data = load("digits");
  CHECK(data.task == Task::Classification);
  CHECK(data.numClasses == 10);
  CHECK(data.sampleShape == std::vector<int64_t>{1, 8, 8});
  CHECK(data.numFeatures == 64);
  REQUIRE(data.train->size() + data.test->size() == 1797);
  CHECK(data.test->size() == 359);  // round(1797 * 0.2)
  const Batch train = data.train->all(), test = data.test->all();
  CHECK(train.inputs.sizes() == at::IntArrayRef({data.train->size(), 1, 8, 8}));
  const at::Tensor images = at::cat({train.inputs, test.inputs});
  const at::Tensor labels = at::cat({train.targets, test.targets});
  CHECK(images.min().item<float>() == 0.0f);
  CHECK(images.max().item<float>() == 1.0f);
  // The reference: the file itself, summed here without the plugin.
  std::ifstream in(std::string(DDP_SOURCE_DIR) + "/data/digits.csv");
  double pixelSum = 0;
  std::vector<int64_t> counts(10, 0);
  std::string line;
  while (std::getline(in, line)) {
    std::stringstream fields(line);
    std::string field;
    for (int c = 0; c < 65 && std::getline(fields, field, ','); ++c) {
      if (c < 64) pixelSum += std::stod(field);
      else ++counts[static_cast<size_t>(std::stoi(field))];
    }
  }
  CHECK(images.sum().item<double>() * 16 == Approx(pixelSum).epsilon(1e-9));
  const at::Tensor histogram = at::bincount(labels);
  CHECK(std::vector<int64_t>(histogram.data_ptr<int64_t>(), histogram.data_ptr<int64_t>() + 10) == counts);
  CHECK(counts == std::vector<int64_t>{178, 182, 177, 183, 181, 182, 181, 179, 174, 180});
  // The same seed, the same split; another seed, another one.
  CHECK(at::equal(load("digits").test->all().inputs, test.inputs));
  CHECK_FALSE(at::equal(load("digits", Json::object(), 7).test->all().inputs, test.inputs));
}

TEST_CASE("digits: a malformed file is one line naming file:line:column", "[datasets]") {
  const std::string dir = ddp::test::tempDir();
  std::string row;
  for (int i = 0; i < 64; ++i) row += "1,";
  CHECK_THAT(usageErrorOf([&] { load("digits", {{"path", writeFileIn(dir, "a.csv", row + "3\n" + row + "\n")}}); }),
             Contains("a.csv:2: column 65: expected an integer 0..9"));
  CHECK_THAT(usageErrorOf([&] { load("digits", {{"path", writeFileIn(dir, "b.csv", row + "17\n")}}); }),
             Contains("b.csv:1: column 65: expected an integer 0..9, found '17'"));
  CHECK_THAT(usageErrorOf([&] { load("digits", {{"path", writeFileIn(dir, "c.csv", "1,2,3\n")}}); }),
             Contains("c.csv:1: expected 65 columns"));
  CHECK_THAT(usageErrorOf([&] { load("digits", {{"path", writeFileIn(dir, "d.csv", row + "3\n")}}); }),
             Contains("no image of the digit 0"));
  std::filesystem::remove_all(dir);
}

// ---- text ----------------------------------------------------------------------------------

TEST_CASE("text: byte vocabulary, windows cut by position, targets shifted by one", "[datasets]") {
  const std::string dir = ddp::test::tempDir();
  // 100 bytes: "the quick ..." repeated; 10 validation bytes at the end.
  std::string corpus;
  while (corpus.size() < 100) corpus += "the quick brown fox. ";
  corpus.resize(100);
  const std::string path = writeFileIn(dir, "corpus.txt", corpus);
  const DatasetSplits data = load("text", {{"path", path}, {"block_size", 8}, {"stride", 3}, {"val_fraction", 0.1}});
  const auto vocab = ByteVocabulary::of(corpus);
  CHECK(data.task == Task::NextToken);
  CHECK(data.vocabSize == vocab.size());
  CHECK(data.numClasses == vocab.size());
  CHECK(data.sampleShape == std::vector<int64_t>{8});
  // 90 training tokens: windows at 0, 3, ..., the last ending at 89: (90 - 9) / 3 + 1.
  CHECK(data.train->size() == (90 - 9) / 3 + 1);
  CHECK(data.test->size() == (10 - 9) / 3 + 1);
  const std::vector<int64_t> ids = vocab.encode(corpus);
  for (int64_t k : {int64_t{0}, int64_t{5}, data.train->size() - 1}) {
    const Batch b = data.train->get({k});
    for (int64_t t = 0; t < 8; ++t) {
      CHECK(b.inputs[0][t].item<int64_t>() == ids[static_cast<size_t>(3 * k + t)]);
      CHECK(b.targets[0][t].item<int64_t>() == ids[static_cast<size_t>(3 * k + t + 1)]);
    }
  }
  // Validation windows hold only the last 10 bytes.
  const Batch val = data.test->get({0});
  CHECK(vocab.decode(std::vector<int64_t>(val.inputs.data_ptr<int64_t>(), val.inputs.data_ptr<int64_t>() + 8)) ==
        corpus.substr(90, 8));
  CHECK_THROWS_WITH(data.train->get({data.train->size()}), Contains("out of range"));
  // The vocabulary: sorted distinct bytes, and back.
  CHECK(vocab.decode(ids) == corpus);
  CHECK(ByteVocabulary::fromJson(vocab.toJson(), "v").toJson() == vocab.toJson());
  CHECK(data.runFiles.at("vocab.json") == vocab.toJson());
  CHECK_THAT(usageErrorOf([&] { vocab.encode("Z"); }), Contains("byte 90 ('Z') at offset 0 is not in the vocabulary"));
  CHECK_THAT(usageErrorOf([&] { ByteVocabulary::fromJson("{\"kind\": \"words\"}", "v.json"); }), Contains("v.json"));
  CHECK_THAT(usageErrorOf([&] { ByteVocabulary::fromJson("{\"kind\": \"bytes\", \"tokens\": [1, 1]}", "v.json"); }),
             Contains("not a distinct byte"));
  // Too short for one validation window.
  CHECK_THAT(usageErrorOf([&] { load("text", {{"path", path}, {"block_size", 10}, {"val_fraction", 0.1}}); }),
             Contains("the validation part of"));
  CHECK_THAT(usageErrorOf([&] { load("text", {{"path", writeFileIn(dir, "empty.txt", "")}}); }), Contains("is empty"));
  std::filesystem::remove_all(dir);
}

// ---- cross-entropy per token ---------------------------------------------------------------------

TEST_CASE("cross_entropy over [B, T, V] logits is the mean over tokens, value and gradient", "[datasets]") {
  const auto& spec = builtinPlugins().get(PluginKind::Loss, "cross_entropy");
  torch::manual_seed(3);
  for (double smoothing : {0.0, 0.1}) {
    INFO("label_smoothing " << smoothing);
    const LossFn loss = spec.loss(paramsFor(spec, {{"label_smoothing", smoothing}}));
    at::Tensor logits = torch::randn({3, 5, 7}, torch::requires_grad());
    const at::Tensor tokens = torch::randint(0, 7, {3, 5}, torch::kLong);
    const at::Tensor ours = loss(logits, tokens);
    ours.backward();
    const at::Tensor ourGrad = logits.grad().clone();
    logits.grad().zero_();
    // The reference: the per-token losses by hand, averaged.
    const at::Tensor logProbs = torch::log_softmax(logits.reshape({15, 7}), 1);
    const at::Tensor nll = -logProbs.gather(1, tokens.reshape({15, 1})).squeeze(1);
    const at::Tensor reference = ((1 - smoothing) * nll - smoothing * logProbs.mean(1)).mean();
    reference.backward();
    CHECK(ours.item<double>() == Approx(reference.item<double>()).epsilon(1e-6));
    CHECK(torch::allclose(ourGrad, logits.grad(), 1e-6, 1e-7));
  }
  const LossFn loss = spec.loss(paramsFor(spec, Json::object()));
  CHECK_THAT(usageErrorOf([&] { loss(torch::zeros({3, 5, 7}), torch::zeros({3, 4}, torch::kLong)); }),
             Contains("[B, T, V] and [B, T] tokens"));
}

// ---- metrics by task -----------------------------------------------------------------------------

TEST_CASE("metrics follow the task: perplexity for tokens, RMSE for regression, and vocab.json in the run folder",
          "[datasets][training]") {
  const std::string dir = ddp::test::tempDir();
  std::string corpus;
  while (corpus.size() < 2000) corpus += "abcabd abcabd\n";
  const std::string path = writeFileIn(dir, "corpus.txt", corpus);
  // A tiny token model: embeddings straight to logits.
  PluginRegistry registry;
  registerWithBigram(registry);
  const std::string run = train({{"dataset", {{"name", "text"}, {"path", path}, {"block_size", 16}}},
                                 {"model", {{"name", "test_bigram"}}},
                                 {"optimizer", {{"name", "adam"}, {"lr", 0.1}}},
                                 {"loss", {{"name", "cross_entropy"}}},
                                 {"training", {{"epochs", 3}, {"batch_size", 16}, {"eval_batch_size", 5}}}},
                                registry);
  std::ifstream csv(run + "/metrics.csv");
  std::string header, line;
  std::getline(csv, header);
  CHECK(header == "epoch,train_loss,test_loss,test_perplexity,test_accuracy,seconds,data_seconds,param_bytes,grad_bytes,optimizer_bytes,peak_rss_bytes");
  std::vector<std::string> last;
  while (std::getline(csv, line)) {
    last.clear();
    std::stringstream fields(line);
    for (std::string f; std::getline(fields, f, ',');) last.push_back(f);
  }
  REQUIRE(last.size() == 11);
  // Memory: parameters held, and a process that holds more than them.
  CHECK(std::stoll(last[7]) > 0);
  CHECK(std::stoll(last[10]) > std::stoll(last[7]));
  const double testLoss = std::stod(last[2]), perplexity = std::stod(last[3]), accuracy = std::stod(last[4]);
  // The batch assembly time is part of the epoch's.
  CHECK(std::stod(last[6]) > 0);
  CHECK(std::stod(last[6]) <= std::stod(last[5]));
  CHECK(perplexity == Approx(std::exp(testLoss)).epsilon(1e-4));
  // After "ab" comes c or d, after "abc"/"abd" a fixed byte: a bigram table
  // learns most of it; the accuracy counts tokens, not windows.
  CHECK(accuracy > 0.6);
  CHECK(accuracy <= 1.0);
  CHECK(perplexity < 3.0);
  CHECK(ByteVocabulary::fromJson(readFile(run + "/vocab.json"), "vocab.json").decode(
            ByteVocabulary::of(corpus).encode(corpus)) == corpus);

  // Regression: test_rmse, the square root of the mse test loss.
  std::string table = "x,y\n";
  for (int i = 0; i < 60; ++i) table += std::to_string(i % 7) + "," + std::to_string(0.5 * (i % 7) + 1) + "\n";
  const std::string reg = train({{"dataset", {{"name", "csv"}, {"path", writeFileIn(dir, "t.csv", table)},
                                              {"task", "regression"}}},
                                 {"model", {{"name", "mlp"}, {"layers", {0, 8, 1}}}},
                                 {"optimizer", {{"name", "adam"}, {"lr", 0.01}}},
                                 {"loss", {{"name", "mse"}}},
                                 {"training", {{"epochs", 2}, {"batch_size", 8}}}},
                                registry);
  std::ifstream regCsv(reg + "/metrics.csv");
  std::getline(regCsv, header);
  CHECK(header == "epoch,train_loss,test_loss,test_rmse,seconds,data_seconds,param_bytes,grad_bytes,optimizer_bytes,peak_rss_bytes");
  while (std::getline(regCsv, line)) {
    last.clear();
    std::stringstream fields(line);
    for (std::string f; std::getline(fields, f, ',');) last.push_back(f);
  }
  REQUIRE(last.size() == 10);
  CHECK(std::stod(last[3]) == Approx(std::sqrt(std::stod(last[2]))).epsilon(1e-4));
  std::filesystem::remove_all(dir);
  std::filesystem::remove_all(std::filesystem::path(run).parent_path());
  std::filesystem::remove_all(std::filesystem::path(reg).parent_path());
}

// ---- sampling from a trained run -------------------------------------------------------------------

TEST_CASE("ddp-run --sample prints the argmax chain of the loaded model at temperature 0 and seeded draws otherwise",
          "[datasets][training]") {
  const std::string dir = ddp::test::tempDir();
  std::string corpus;
  while (corpus.size() < 3000) corpus += "hello world. ";
  const std::string path = writeFileIn(dir, "corpus.txt", corpus);
  PluginRegistry registry;
  registerWithBigram(registry);
  const std::string run = train({{"dataset", {{"name", "text"}, {"path", path}, {"block_size", 8}}},
                                 {"model", {{"name", "test_bigram"}}},
                                 {"optimizer", {{"name", "adam"}, {"lr", 0.1}}},
                                 {"loss", {{"name", "cross_entropy"}}},
                                 {"training", {{"epochs", 2}, {"batch_size", 16}, {"save_every", 1}}}},
                                registry);
  apps::SampleOptions options;
  options.runDir = run;
  options.prompt = "he";
  options.tokens = 12;
  options.temperature = 0;
  std::ostringstream printed;
  const std::string greedy = apps::sampleText(options, registry, printed);
  CHECK(printed.str() == "he" + greedy + "\n");
  // The reference: the loaded model's argmax, token by token, by hand.
  const TrainedModel trained = loadTrainedModel(run, registry);
  const auto vocab = ByteVocabulary::fromJson(readFile(run + "/vocab.json"), "vocab.json");
  std::vector<int64_t> ids = vocab.encode("he");
  std::string expected;
  torch::NoGradGuard noGrad;
  for (int i = 0; i < 12; ++i) {
    const at::Tensor logits = trained.model->forward(at::tensor(ids, at::kLong).unsqueeze(0))[0][-1];
    ids.push_back(logits.argmax().item<int64_t>());
    expected += vocab.decode({ids.back()});
  }
  CHECK(greedy == expected);
  CHECK(greedy[0] == 'l');  // in "hello world. ", an e is always followed by an l
  options.topK = 1;
  options.temperature = 1.0;
  CHECK(apps::sampleText(options, registry, printed) == greedy);  // top-1 is greedy
  options.topK = 0;
  options.temperature = 5.0;  // flat enough that seeds differ
  options.seed = 1;
  const std::string a = apps::sampleText(options, registry, printed);
  CHECK(apps::sampleText(options, registry, printed) == a);
  options.seed = 2;
  CHECK(apps::sampleText(options, registry, printed) != a);
  options.prompt = "Q";
  CHECK_THAT(usageErrorOf([&] { apps::sampleText(options, registry, printed); }),
             Contains("byte 81 ('Q') at offset 0 is not in the vocabulary"));
  options.prompt = "he";
  options.temperature = std::numeric_limits<double>::infinity();
  CHECK_THAT(usageErrorOf([&] { apps::sampleText(options, registry, printed); }),
             Contains("--temperature inf: expected a finite number, 0 or more"));
  options.temperature = 1.0;
  options.runDir = dir;
  CHECK_THAT(usageErrorOf([&] { apps::sampleText(options, registry, printed); }),
             Contains(dir + "/config.json cannot be read"));
  // A run folder edited after training: its model section is checked as an
  // experiment file's is, and the checkpoint's shapes against the model's.
  const std::string config = readFile(run + "/config.json");
  Json edited = Json::parse(config);
  edited["model"]["bogus"] = 1;
  writeFileIn(run, "config.json", edited.dump());
  CHECK_THAT(usageErrorOf([&] { loadTrainedModel(run, registry); }),
             Contains(run + "/config.json: model.bogus: unknown key"));
  edited["model"] = Json{{"name", 5}};
  writeFileIn(run, "config.json", edited.dump());
  CHECK_THAT(usageErrorOf([&] { loadTrainedModel(run, registry); }), Contains(run + "/config.json: model.name: required"));
  writeFileIn(run, "config.json", config);
  Json context = Json::parse(readFile(run + "/model_context.json"));
  const int64_t v = context["vocab_size"].get<int64_t>();
  context["vocab_size"] = v + 1;
  writeFileIn(run, "model_context.json", context.dump());
  CHECK_THAT(usageErrorOf([&] { loadTrainedModel(run, registry); }),
             Contains(fmt::format("has shape [{}, {}] in the checkpoint but [{}, {}] in the model", v, v, v + 1, v + 1)));
  std::filesystem::remove_all(dir);
  std::filesystem::remove_all(std::filesystem::path(run).parent_path());
}
