// Experiment validation: malformed configs fail before anything runs, with
// one line naming the JSON path, exit code 2, and no run folder.
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>

#include <catch2/catch.hpp>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "plugins/builtin.hpp"
#include "backends/builtin.hpp"
#include "framework/experiment/experiment_config.hpp"
#include "framework/experiment/plugin_registry.hpp"
#include "tests/test_support.hpp"

using namespace ddp;
using ddp::test::runDdpRun;
using ddp::test::tempDir;

namespace {

const char* kValid = R"({
  "name": "t",
  "dataset": {"name": "wine"},
  "model": {"name": "mlp", "layers": [13, 8, 3]},
  "optimizer": {"name": "adam", "lr": 0.001},
  "loss": {"name": "cross_entropy"},
  "training": {"epochs": 2, "batch_size": 16}
})";

void writeFile(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

bool exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

struct BadConfig {
  const char* what;
  std::string text;       // the experiment file ("" = use kValid)
  std::string overrides;  // extra ddp-run arguments
  std::string expected;   // in the error line
};

}  // namespace

TEST_CASE("malformed experiments fail with one clear line, exit code 2 and no run folder", "[config][solo]") {
  const std::vector<BadConfig> cases = {
      {"malformed JSON", "{\n  \"name\": \"x\"\n  \"model\": 1\n}", "", "bad.json:3:9: malformed JSON"},
      {"empty file", "", "", "bad.json:1:1: malformed JSON"},
      {"not an object", "[1, 2]", "", "expected a JSON object at the top level"},
      {"unknown top-level key", R"({"trainig": {}})", "", "trainig: unknown key; did you mean \"training\"?"},
      {"missing dataset", R"({"model": {"name": "mlp"}, "optimizer": {"name": "adam"}, "loss": {"name": "mse"}})", "",
       "dataset: required section is missing"},
      {"unknown model", "", "--set model.name=mpl", "model.name: unknown model \"mpl\"; did you mean \"mlp\"?"},
      {"lr is a word", "", "--set optimizer.lr=fast", "optimizer.lr: expected a number > 0, got \"fast\""},
      {"lr negative", "", "--set optimizer.lr=-1", "optimizer.lr: expected a number > 0, got -1"},
      {"epochs zero", "", "--set training.epochs=0", "training.epochs: expected an integer >= 1, got 0"},
      {"epochs fractional", "", "--set training.epochs=2.5", "training.epochs: expected an integer >= 1, got 2.5"},
      {"batch size as string",
       R"({"dataset": {"name": "wine"}, "model": {"name": "mlp"}, "optimizer": {"name": "adam"},
           "loss": {"name": "cross_entropy"}, "training": {"batch_size": "32"}})",
       "", "training.batch_size: expected an integer >= 1, got \"32\""},
      {"unknown optimizer key",
       R"({"dataset": {"name": "wine"}, "model": {"name": "mlp"}, "optimizer": {"name": "adam", "lrr": 0.1},
           "loss": {"name": "cross_entropy"}})",
       "", "optimizer.lrr: unknown key; did you mean \"lr\"?"},
      {"unknown backend", "", "--set distributed.backend=mpi",
       "distributed.backend: expected one of \"gloo\", \"nccl\", got \"mpi\""},
      {"csv without path", "", "--set dataset.name=csv", "dataset.path: required parameter is missing"},
      {"missing data file", "", "--set dataset.name=csv --set dataset.path=nope.csv",
       "dataset.path: file \"nope.csv\" not found"},
      {"layers not a list", "", "--set model.layers=big", "model.layers: expected a list of integers"},
      {"activation typo", "", "--set model.activation=relux", "did you mean \"relu\"?"},
      {"negative seed", "", "--set training.seed=-1", "training.seed: expected an integer >= 0, got -1"},
      {"missing plugin library",
       R"({"plugins": ["missing.so"], "dataset": {"name": "wine"}, "model": {"name": "mlp"},
           "optimizer": {"name": "adam"}, "loss": {"name": "cross_entropy"}})",
       "", "plugins[0]: plugin library \"missing.so\" not found"},
      {"dataset not an object",
       R"({"dataset": 5, "model": {"name": "mlp"}, "optimizer": {"name": "adam"}, "loss": {"name": "mse"}})", "",
       "dataset: expected an object with a \"name\", got 5"},
      {"scheduler typo", "", "--set scheduler.name=cosin", "did you mean \"cosine\"?"},
      {"loss without name",
       R"({"dataset": {"name": "wine"}, "model": {"name": "mlp"}, "optimizer": {"name": "adam"}, "loss": {}})", "",
       "loss.name: required"},
      {"override of unknown key", "", "--set training.epochz=3",
       "--set training.epochz: unknown key; did you mean \"epochs\"?"},
      {"override without value", "", "--set training.epochs", "expected KEY=VALUE"},
      {"override of unknown section", "", "--set trainer.epochs=3", "unknown section \"trainer\""},
      {"description not a string", R"({"description": {"a": 1}, "dataset": {"name": "wine"}, "model": {"name": "mlp"},
           "optimizer": {"name": "adam"}, "loss": {"name": "cross_entropy"}})",
       "", "description: expected a string, got {\"a\":1}"},
      {"unknown key names its --describe", "", "--set model.widht=3", "HINT: ddp-run --describe model.mlp lists them"},
      {"bool as string", "", "--set training.drop_last=yes", "training.drop_last: expected true or false, got \"yes\""},
      {"timeout zero", "", "--set distributed.timeout_s=0", "distributed.timeout_s: expected a number > 0, got 0"},
      // Found by the plugins when they are built, still before any folder.
      {"layers that do not fit the dataset", "", "--set model.layers=[10,64,3]",
       "model.layers: first width 10 does not match the dataset's 13 features"},
      // Found by one forward pass and the loss on two rows, before any folder
      // (reg.csv, labels.csv and one_class.csv are written below).
      {"regression dataset with cross_entropy",
       R"({"dataset": {"name": "csv", "path": "reg.csv", "task": "regression"},
           "model": {"name": "mlp", "layers": [2, 8, 1]}, "optimizer": {"name": "adam"},
           "loss": {"name": "cross_entropy"}})",
       "", "loss cross_entropy: expected class indices (int64), got Float targets [2]"},
      {"regression model wider than its target",
       R"({"dataset": {"name": "csv", "path": "reg.csv", "task": "regression"},
           "model": {"name": "mlp", "layers": [2, 8, 3]}, "optimizer": {"name": "adam"}, "loss": {"name": "mse"}})",
       "", "model mlp (output [2, 3] Float) -> loss mse do not fit together: loss mse: output [2, 3] and target [2] do "
           "not match. HINT: a regression model has one output"},
      {"model too large for memory", "", "--set model.layers=[13,100000000000,3]",
       "model mlp: out of memory while building it (4843 GiB asked for). HINT:"},
      // The JSON itself.
      {"number beyond a double",
       "{\"dataset\": {\"name\": \"wine\"}, \"model\": {\"name\": \"mlp\"},\n"
       "  \"optimizer\": {\"name\": \"adam\", \"lr\": 1e400}, \"loss\": {\"name\": \"cross_entropy\"}}",
       "", "bad.json:2:39: number 1e400 is beyond the range of a double"},
      {"number beyond a double in an override", "", "--set optimizer.lr=1e400",
       "--set optimizer.lr: number 1e400 is beyond the range of a double"},
      {"duplicate key", R"({"dataset": {"name": "wine"}, "model": {"name": "mlp", "layers": [13, 8, 3],
           "layers": [13, 64, 3]}, "optimizer": {"name": "adam"}, "loss": {"name": "cross_entropy"}})",
       "", "bad.json: duplicate key \"model.layers\""},
      {"duplicate key at the top", R"({"name": "a", "dataset": {"name": "wine"}, "name": "b"})", "",
       "bad.json: duplicate key \"name\""},
      {"duplicate key inside a list", R"({"description": [{"a": 1}, {"b": {"c": 1, "c": 2}}]})", "",
       "bad.json: duplicate key \"description[1].b.c\""},
      // Class labels of a CSV.
      {"class labels with a gap",
       R"({"dataset": {"name": "csv", "path": "labels.csv"}, "model": {"name": "mlp", "layers": [0, 8, 0]},
           "optimizer": {"name": "adam"}, "loss": {"name": "cross_entropy"}})",
       "", "labels.csv: class labels must be 0..C-1 with a row for each; found 0, 1, 2, 7 (8 classes implied, no row "
           "for 3, 4, 5, 6). HINT:"},
      {"a single class",
       R"({"dataset": {"name": "csv", "path": "one_class.csv"}, "model": {"name": "mlp", "layers": [0, 8, 0]},
           "optimizer": {"name": "adam"}, "loss": {"name": "cross_entropy"}})",
       "", "one_class.csv: every row has class 1; a classifier needs at least 2 classes"},
      // Names that would leave runs/.
      {"name with ..", "", "--set name=../escaped", "name: \"../escaped\" cannot name a run folder"},
      {"name with a slash", R"({"name": "a/b", "dataset": {"name": "wine"}})", "",
       "name: \"a/b\" cannot name a run folder"},
      {"hidden name", "", "--set name=.hidden", "name: \".hidden\" cannot name a run folder"},
      // Command-line mistakes.
      {"no ranks", "", "--nproc-per-node 0", "--nproc-per-node: Value 0 not in range 1 to 4096"},
      {"port out of range", "", "--master-port 99999", "--master-port: Value 99999 not in range 0 to 65535"},
      {"negative restarts", "", "--max-restarts -1", "--max-restarts: Value -1 not in range"},
      {"node rank past the nodes", "", "--nnodes 2 --node-rank 2", "--node-rank: 2 is not below --nnodes 2"},
      {"several nodes without a master address", "", "--nnodes 2 --nproc-per-node 1",
       "--nnodes 2 needs --master-addr: the address of the node with --node-rank 0"},
      {"stray argument", "", "stray", "The following argument was not expected: stray"},
  };
  const std::string dir = tempDir();
  {
    std::ofstream reg(dir + "/reg.csv"), labels(dir + "/labels.csv"), oneClass(dir + "/one_class.csv");
    reg << "a,b,y\n";
    labels << "a,b,y\n";
    oneClass << "a,b,y\n";
    for (int i = 1; i <= 20; ++i) {
      reg << i << "," << 2 * i << "," << i + 0.5 << "\n";
      labels << i << "," << 2 * i << "," << i % 3 << "\n";
      oneClass << i << "," << 2 * i << ",1\n";
    }
    labels << "5,5,7\n";  // a stray label
  }
  for (const auto& c : cases) {
    SECTION(c.what) {
      const std::string file = dir + "/bad.json";
      writeFile(file, c.text.empty() && std::string(c.what) != "empty file" ? kValid : c.text);
      const std::string runDir = dir + "/run";
      ddp::test::ProgramOutcome o = runDdpRun(file + " --out " + runDir + " " + c.overrides);
      INFO(c.what << ": " << o.output);
      CHECK(o.exitCode == 2);
      CHECK(o.output.find(c.expected) != std::string::npos);
      // One line: the error, nothing else (no stack, no second line). A
      // sanitizer build adds its own "==pid==WARNING" line for the huge
      // allocation; that one is not ours.
      std::istringstream lines(o.output);
      int ours = 0;
      for (std::string line; std::getline(lines, line);) ours += line.rfind("==", 0) != 0;
      CHECK(ours == 1);
      CHECK_FALSE(exists(runDir));
    }
  }
  SECTION("a folder given as the experiment") {
    ddp::test::ProgramOutcome o = runDdpRun(std::string(DDP_SOURCE_DIR) + "/experiments --out " + dir + "/run");
    INFO(o.output);
    CHECK(o.exitCode == 2);
    CHECK(o.output.find("is a folder, not an experiment file. HINT: pass one of its JSON files: ") !=
          std::string::npos);
    CHECK(o.output.find("wine_baseline.json") != std::string::npos);
    CHECK_FALSE(exists(dir + "/run"));
  }
  SECTION("a missing experiment file") {
    ddp::test::ProgramOutcome o = runDdpRun(dir + "/absent.json --out " + dir + "/run");
    CHECK(o.exitCode == 2);
    CHECK(o.output.find("absent.json: cannot open experiment file") != std::string::npos);
  }
}

TEST_CASE("overrides are typed by the declaration and land in the resolved config", "[config]") {
  auto& registry = builtinPlugins();
  ExperimentConfig c = parseExperimentConfig(
      kValid, "inline", ".",
      {"optimizer.lr=0.01", "training.epochs=5", "model.activation=tanh", "model.layers=[13, 32, 32, 3]",
       "training.drop_last=true", "name=renamed"},
      registry);
  CHECK(c.optimizer.params.getDouble("lr") == Approx(0.01));
  CHECK(c.training.epochs == 5);
  CHECK(c.training.dropLast);
  CHECK(c.model.params.getString("activation") == "tanh");
  CHECK(c.model.params.getIntList("layers") == std::vector<int64_t>{13, 32, 32, 3});
  CHECK(c.name == "renamed");
  CHECK(c.resolved["optimizer"]["lr"] == 0.01);
  CHECK(c.resolved["training"]["epochs"] == 5);
  // Defaults are filled in, and the data path is made absolute.
  CHECK(c.resolved["training"].contains("save_every"));
  CHECK(c.resolved["dataset"]["path"].get<std::string>().front() == '/');
  CHECK(c.resolved["distributed"]["backend"] == "gloo");
}

// Resolved paths lose their "." parts, but ".." after a symbolic link is
// kept: there it is not the folder above in the text.
TEST_CASE("input paths are made absolute without losing what a symbolic link means", "[config]") {
  const std::string dir = tempDir();
  std::filesystem::create_directories(dir + "/real/a/b");
  std::filesystem::copy_file(std::string(DDP_SOURCE_DIR) + "/data/wine.csv", dir + "/real/a/wine.csv");
  std::filesystem::create_directory_symlink(dir + "/real/a/b", dir + "/link");
  auto& registry = builtinPlugins();
  ExperimentConfig viaLink =
      parseExperimentConfig(kValid, "inline", ".", {"dataset.path=" + dir + "/link/../wine.csv"}, registry);
  const std::string resolved = viaLink.resolved["dataset"]["path"].get<std::string>();
  CHECK(std::filesystem::exists(resolved));
  ExperimentConfig dotted =
      parseExperimentConfig(kValid, "inline", ".", {"dataset.path=" + dir + "/./real/./a/wine.csv"}, registry);
  CHECK(dotted.resolved["dataset"]["path"].get<std::string>() == dir + "/real/a/wine.csv");
}

TEST_CASE("integers beyond 9e15 are refused, not wrapped to negative numbers", "[config]") {
  auto& registry = builtinPlugins();
  // 2^64 - 1 and 2^63 parse as unsigned JSON numbers; read as int64 they
  // would be -1 and -2^63 and pass the ranges below them.
  for (const std::string big : {"18446744073709551615", "9223372036854775808", "9223372036854775807"}) {
    INFO(big);
    CHECK_THROWS_WITH(parseExperimentConfig(kValid, "inline", ".", {"training.epochs=" + big}, registry),
                      Catch::Matchers::Contains("training.epochs: expected an integer >= 1, got " + big +
                                                ", beyond the largest integer accepted (9e15)"));
    CHECK_THROWS_WITH(parseExperimentConfig(kValid, "inline", ".", {"model.layers=[13, " + big + ", 3]"}, registry),
                      Catch::Matchers::Contains("model.layers: expected a list of integers"));
  }
  CHECK_THROWS_WITH(parseExperimentConfig(kValid, "inline", ".", {"training.seed=-9223372036854775808"}, registry),
                    Catch::Matchers::Contains("beyond the largest integer accepted"));
  CHECK(parseExperimentConfig(kValid, "inline", ".", {"training.seed=8999999999999999"}, registry)
            .training.seed == 8999999999999999);
  // Threads beyond any machine's cores (100,000 hung LibTorch's pool).
  CHECK_THROWS_WITH(parseExperimentConfig(kValid, "inline", ".", {"training.threads=100000"}, registry),
                    Catch::Matchers::Contains("training.threads: expected an integer in [0, 1024], got 100000"));
}

TEST_CASE("a folder where a file is expected is named as a folder", "[config]") {
  auto& registry = builtinPlugins();
  const std::string dir = tempDir();
  CHECK_THROWS_WITH(parseExperimentConfig(kValid, "inline", ".", {"dataset.path=" + dir}, registry),
                    Catch::Matchers::Contains("dataset.path: \"" + dir + "\" is a folder, not a file"));
}

TEST_CASE("a plugin switched by an override validates against its own declaration", "[config]") {
  auto& registry = builtinPlugins();
  ExperimentConfig c =
      parseExperimentConfig(kValid, "inline", ".", {"optimizer.name=sgd", "optimizer.momentum=0.9"}, registry);
  CHECK(c.optimizer.name == "sgd");
  CHECK(c.optimizer.params.getDouble("momentum") == Approx(0.9));
  // --set SECTION=NAME chooses the plugin as --set SECTION.name=NAME does.
  ExperimentConfig byName = parseExperimentConfig(kValid, "inline", ".", {"optimizer=sgd"}, registry);
  CHECK(byName.optimizer.name == "sgd");
  // An exclusive upper bound (Param::below) is checked by validation,
  // before the plugin's own factory runs.
  CHECK_THROWS_WITH(parseExperimentConfig(kValid, "inline", ".", {"optimizer=sgd", "optimizer.momentum=1"}, registry),
                    Catch::Matchers::Contains("optimizer.momentum: expected a number in [0, 1), got 1"));
  CHECK_NOTHROW(parseExperimentConfig(kValid, "inline", ".", {"optimizer=sgd", "optimizer.momentum=0.999"}, registry));
}

TEST_CASE("bad tuning variables of the gloo backend fail at start-up, naming the variable", "[config][gloo][solo]") {
  struct Case {
    const char* env;
    const char* ranks;
    const char* expected;
  };
  const Case cases[] = {
      {"DDP_GLOO_CHUNK_BYTES=12k", "1", "DDP_GLOO_CHUNK_BYTES=\"12k\": expected a number of bytes > 0"},
      {"DDP_GLOO_CHUNK_BYTES=0", "2", "DDP_GLOO_CHUNK_BYTES=\"0\": expected a number of bytes > 0"},
      {"DDP_GLOO_SHM=yes", "2", "DDP_GLOO_SHM=\"yes\": expected 0 (TCP only) or 1 (shared memory)"},
      {"DDP_GLOO_INLINE_BYTES=-1", "2", "DDP_GLOO_INLINE_BYTES=\"-1\": expected a number of bytes >= 0"},
      {"DDP_GLOO_SPIN_US=1ms", "2", "DDP_GLOO_SPIN_US=\"1ms\": expected microseconds from 0 to 10000000"},
      {"DDP_GLOO_SHM_SLOT_BYTES=100", "2", "DDP_GLOO_SHM_SLOT_BYTES=\"100\": expected a number of bytes >= 4096"},
  };
  for (const auto& c : cases) {
    const bool one = std::string(c.ranks) == "1";
    ddp::test::ProgramOutcome o = runDdpRun(one ? "--demo" : "--demo --nproc-per-node 2", c.env);
    INFO(c.env << " on " << c.ranks << " rank(s): " << o.output);
    // 2, a mistake in what was asked; the launcher passes on its rank's code.
    CHECK(o.exitCode == 2);
    CHECK(o.output.find(c.expected) != std::string::npos);
    CHECK(o.output.find("peer rank may have died") == std::string::npos);
    if (one) CHECK(std::count(o.output.begin(), o.output.end(), '\n') == 1);
  }
}

TEST_CASE("a backend this machine cannot run is named before any rank starts", "[config][launcher][solo]") {
  const auto why = ddp::builtinBackends().whyUnusable("nccl");
  if (!why) {
    WARN("SKIPPED: nccl can run here, so there is no unusable backend to name");
    return;
  }
  const std::string dir = tempDir();
  const std::string experiment = std::string(DDP_SOURCE_DIR) + "/experiments/wine_ddp.json";
  struct Case {
    std::string args, expected;
  };
  const Case cases[] = {
      {"--nproc-per-node 2 " + experiment + " --set distributed.backend=nccl --out " + dir + "/run",
       "distributed.backend: " + *why},
      // One process: the same line (nothing to launch, but the backend is built).
      {"--nproc-per-node 1 " + experiment + " --set distributed.backend=nccl --out " + dir + "/run",
       "distributed.backend: " + *why},
      {"--nproc-per-node 2 --demo --demo-backend nccl", "--demo-backend: " + *why},
      {"--nproc-per-node 2 --demo --demo-backend mpi", "--demo-backend: unknown backend 'mpi'; known backends: "},
  };
  for (const auto& c : cases) {
    ddp::test::ProgramOutcome o = runDdpRun(c.args);
    INFO(o.output);
    CHECK(o.exitCode == 2);
    CHECK(o.output.find(c.expected) != std::string::npos);
    CHECK(std::count(o.output.begin(), o.output.end(), '\n') == 1);  // no rank started
  }
  CHECK_FALSE(exists(dir + "/run"));
}

TEST_CASE("ddp-run --describe of the sections lists every key with its default", "[config][solo]") {
  struct Case {
    const char* section;
    std::vector<std::string> expected;
  };
  const Case cases[] = {
      {"training", {"epochs", "batch_size", "drop_last", "join", "checkpoint_on_signal", "on_nonfinite_loss"}},
      {"distributed", {"backend", "timeout_s", "300", "strategy", "fsdp_unit_mb", "comm_hook", "powersgd"}},
      {"plugins", {"dataset", "model", "optimizer", "scheduler", "loss", "training", "distributed", "mlp", "adam"}},
  };
  for (const Case& c : cases) {
    const auto o = runDdpRun(std::string("--describe ") + c.section);
    INFO(c.section << ": " << o.output);
    CHECK(o.exitCode == 0);
    for (const auto& word : c.expected) CHECK(o.output.find(word) != std::string::npos);
  }
  // Every declared training and distributed key is listed.
  const auto training = runDdpRun("--describe training").output;
  for (const auto& spec : trainingParamSpecs()) CHECK(training.find(spec.name) != std::string::npos);
  const auto distributed = runDdpRun("--describe distributed").output;
  for (const auto& spec : distributedParamSpecs()) CHECK(distributed.find(spec.name) != std::string::npos);
  // A default can be set explicitly (fsdp_unit_mb's 0 was refused as "> 0").
  for (const auto& [section, specs] : {std::make_pair("training", &trainingParamSpecs()),
                                       std::make_pair("distributed", &distributedParamSpecs())}) {
    for (const auto& spec : *specs) {
      if (spec.defaultValue.is_null()) continue;
      const std::string value =
          spec.defaultValue.is_string() ? spec.defaultValue.get<std::string>() : spec.defaultValue.dump();
      INFO(section << "." << spec.name << "=" << value);
      CHECK_NOTHROW(parseExperimentConfig(kValid, "inline", ".", {std::string(section) + "." + spec.name + "=" + value},
                                          builtinPlugins()));
    }
  }
  const auto wrong = runDdpRun("--describe trainig");
  CHECK(wrong.exitCode == 2);
  CHECK(wrong.output.find("or training, distributed, plugins") != std::string::npos);
}
