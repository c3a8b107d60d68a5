// Weights to and from PyTorch (issue 33): safetensors and torch.save files
// written and read here, checked against an independent implementation
// (python/ddp_models.py and PyTorch itself under /usr/bin/python3), broken
// files refused, and models trained here evaluated in PyTorch and the other
// way round.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <sys/wait.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "framework/core/errors.hpp"
#include "framework/experiment/trained_model.hpp"
#include "framework/interop/safetensors.hpp"
#include "framework/interop/torch_file.hpp"
#include "framework/interop/weights_file.hpp"
#include "framework/launch/spawn.hpp"
#include "plugins/builtin.hpp"
#include "tests/test_support.hpp"

using namespace ddp;
using Catch::Contains;
using ddp::test::runDdpRun;
using ddp::test::tempDir;

namespace {

namespace fs = std::filesystem;
const std::string kSource = DDP_SOURCE_DIR;


struct PythonRun {
  int exitCode = -1;
  std::string output;
};

PythonRun python(const std::vector<std::string>& args) {
  SpawnOptions options;
  options.argv = {"/usr/bin/python3"};
  for (const auto& a : args) options.argv.push_back(a);
  const FinishedProcess done = runProcess(options);
  return {WIFEXITED(done.status) ? WEXITSTATUS(done.status) : -1, done.output};
}

// The message of the UsageError `f` throws ("no error" / "other: ..." otherwise).
template <typename F>
std::string usageError(F&& f) {
  try {
    f();
  } catch (const UsageError& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("other: ") + e.what();
  }
  return "no error";
}

std::string writeBytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
  return path;
}

// A safetensors file from a header text and `data` bytes.
std::string rawSafetensors(const std::string& header, const std::string& data) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[static_cast<size_t>(i)] = static_cast<char>(uint64_t(header.size()) >> (8 * i));
  return out + header + data;
}

at::Tensor named(const NamedTensors& tensors, const std::string& name) {
  for (const auto& [n, t] : tensors) {
    if (n == name) return t;
  }
  FAIL("no tensor " << name);
  return {};
}

NamedTensors everyDtype() {
  torch::manual_seed(3);
  return {{"f64", at::randn({2, 3}, at::kDouble)},
          {"f32", at::randn({5})},
          {"f16", at::randn({3, 2}).to(at::kHalf)},
          {"bf16", at::randn({4}).to(at::kBFloat16)},
          {"i64", at::tensor(std::vector<int64_t>{-5, 0, int64_t(1) << 40})},
          {"i32", at::tensor(std::vector<int32_t>{-7, 7})},
          {"i16", at::tensor(std::vector<int16_t>{-300, 300})},
          {"i8", at::tensor(std::vector<int8_t>{-128, 127})},
          {"u8", at::tensor(std::vector<uint8_t>{0, 255})},
          {"bool", at::tensor(std::vector<uint8_t>{1, 0, 1}).to(at::kBool)},
          {"empty", at::zeros({0, 4})},
          {"scalar", at::tensor(2.5)},
          {"transposed", at::randn({3, 4}).t()}};
}

}  // namespace

TEST_CASE("safetensors: every dtype, empty and scalar tensors round-trip, with metadata", "[interop][solo]") {
  const std::string dir = tempDir();
  const NamedTensors tensors = everyDtype();
  writeSafetensors(dir + "/all.safetensors", tensors, {{"format", "pt"}, {"note", "ünïcode"}});
  REQUIRE(looksLikeSafetensors(dir + "/all.safetensors"));
  REQUIRE_FALSE(fs::exists(dir + "/all.safetensors.tmp"));
  const WeightsFile back = readWeightsFile(dir + "/all.safetensors");
  CHECK(back.metadata == std::map<std::string, std::string>{{"format", "pt"}, {"note", "ünïcode"}});
  REQUIRE(back.tensors.size() == tensors.size());
  for (const auto& [name, tensor] : tensors) {
    const at::Tensor got = named(back.tensors, name);
    INFO(name);
    CHECK(got.scalar_type() == tensor.scalar_type());
    CHECK(got.sizes() == tensor.sizes());
    CHECK(at::equal(got, tensor));
  }
  // The data starts 8-byte aligned, right after the padded header.
  const std::string bytes = ddp::test::readFile(dir + "/all.safetensors");
  uint64_t headerBytes = 0;
  for (int i = 7; i >= 0; --i) headerBytes = (headerBytes << 8) | uint8_t(bytes[static_cast<size_t>(i)]);
  CHECK(headerBytes % 8 == 0);

  const std::string whyNot = ddp::test::pythonTorchUnavailable();
  if (!whyNot.empty()) {
    WARN("SKIPPED (the independent reader): " << whyNot);
    return;
  }
  // python/ddp_models.py reads our file and writes its own; we read that.
  const PythonRun copy = python(
      {"-c",
       "import sys; sys.path.insert(0, sys.argv[1]); import ddp_models; s, m = ddp_models.load_safetensors(sys.argv[2]); "
       "assert m == {'format': 'pt', 'note': 'ünïcode'}, m; ddp_models.save_safetensors(sys.argv[3], s, m)",
       kSource + "/python", dir + "/all.safetensors", dir + "/python.safetensors"});
  INFO(copy.output);
  REQUIRE(copy.exitCode == 0);
  const WeightsFile fromPython = readSafetensors(dir + "/python.safetensors");
  CHECK(fromPython.metadata == back.metadata);
  for (const auto& [name, tensor] : tensors) {
    INFO(name);
    CHECK(at::equal(named(fromPython.tensors, name), tensor));
  }
}

// The streamed writers (export of a sharded checkpoint): the same tensors
// as the whole-file writers, asked for one at a time, in the layout's order;
// a tensor that does not match its layout leaves no file.
TEST_CASE("weights files written tensor by tensor hold what the whole-file writers hold", "[interop]") {
  const std::string dir = tempDir();
  const NamedTensors tensors = everyDtype();
  std::vector<TensorLayout> layout;
  for (const auto& [name, tensor] : tensors) layout.push_back({name, tensor.scalar_type(), tensor.sizes().vec()});
  for (const WeightsFormat format : {WeightsFormat::Safetensors, WeightsFormat::Torch}) {
    INFO(weightsFormatName(format));
    const std::string path = dir + "/streamed." + weightsFormatName(format);
    std::vector<size_t> asked;
    writeWeightsFileStreamed(path, format, layout, [&](size_t i) {
      asked.push_back(i);
      return tensors[i].second;
    }, {{"format", "pt"}});
    CHECK(asked.size() == tensors.size());
    std::vector<size_t> sorted = asked;
    std::sort(sorted.begin(), sorted.end());
    CHECK(std::adjacent_find(sorted.begin(), sorted.end()) == sorted.end());  // each once
    const WeightsFile back = readWeightsFile(path);
    REQUIRE(back.tensors.size() == tensors.size());
    for (const auto& [name, tensor] : tensors) {
      INFO(name);
      const at::Tensor got = named(back.tensors, name);
      CHECK(got.scalar_type() == tensor.scalar_type());
      CHECK(got.sizes() == tensor.sizes());
      CHECK(at::equal(got, tensor));
    }
    // Tensor 1 comes as another shape: an error naming it, and no file.
    const std::string bad = dir + "/bad." + weightsFormatName(format);
    try {
      writeWeightsFileStreamed(bad, format, layout, [&](size_t i) {
        return i == 1 ? at::zeros({7}, tensors[i].second.options()) : tensors[i].second;
      });
      FAIL("a tensor of the wrong shape was written");
    } catch (const std::runtime_error& e) {
      CHECK_THAT(e.what(), Contains("tensor " + tensors[1].first + " came as"));
    }
    CHECK_FALSE(fs::exists(bad));
    CHECK_FALSE(fs::exists(bad + ".tmp"));
  }
}

TEST_CASE("safetensors: broken files are refused with one line naming what is wrong", "[interop][errors]") {
  const std::string dir = tempDir();
  const std::string f32x2 = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  std::string tenGigabytes(8, '\0');
  tenGigabytes[4] = 0x02;  // 2^33 + ...: about 8.6 GB
  tenGigabytes[3] = 0x80;
  const std::string valid = rawSafetensors(f32x2, std::string(8, '\x01'));
  std::string manyDims = "[1";
  for (int i = 1; i < 100; ++i) manyDims += ",1";
  manyDims += "]";
  struct Case {
    const char* label;
    std::string bytes;
    const char* says;
  };
  const std::vector<Case> cases = {
      {"too short", "abc", "3 bytes, fewer than the 8 of a header length"},
      {"a 10 GB header length", tenGigabytes + "{}", "above the format's limit of 100000000"},
      {"a header longer than the file", rawSafetensors(f32x2, "").substr(0, 30), "the header claims"},
      {"a header that is not an object", rawSafetensors("[1, 2]", ""), "the header is not a JSON object"},
      {"offsets beyond the data", rawSafetensors(f32x2, std::string(4, '\0')), "lie outside the 4 bytes of data"},
      {"reversed offsets", rawSafetensors(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", std::string(8, '\0')),
       "lie outside"},
      {"a shape that does not match", rawSafetensors(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", std::string(8, '\0')),
       "shape [3] of F32 needs 12 bytes, data_offsets give 8"},
      {"a huge shape", rawSafetensors(R"({"a":{"dtype":"F32","shape":[1099511627776,1099511627776],"data_offsets":[0,8]}})",
                                      std::string(8, '\0')),
       "a shape whose size overflows"},
      {"an empty shape whose other sizes overflow",
       rawSafetensors(R"({"a":{"dtype":"F32","shape":[4611686018427387904,4611686018427387904,0],"data_offsets":[0,0]}})", ""),
       "a shape whose size overflows"},
      {"a shape of many dimensions",
       rawSafetensors(R"({"a":{"dtype":"F32","data_offsets":[0,4],"shape":)" + manyDims + "}}", std::string(4, '\0')),
       "a shape of 100 dimensions"},
      {"a name with a line break", rawSafetensors(R"({"a\nFAKE":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", ""),
       "tensor a\\x0aFAKE: data_offsets [0, 8] lie outside"},
      {"a deeply nested shape", rawSafetensors(R"({"a":{"dtype":"F32","data_offsets":[0,4],"shape":)" + std::string(100000, '[') +
                                                   std::string(100000, ']') + "}}", ""),
       "a shape that holds something other than sizes"},
      {"an unknown dtype", rawSafetensors(R"({"a":{"dtype":"F8_E4M3","shape":[2],"data_offsets":[0,2]}})", std::string(2, '\0')),
       "has dtype \"F8_E4M3\"; handled: F64"},
      {"overlapping tensors",
       rawSafetensors(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                      std::string(12, '\0')),
       "tensors a and b overlap"},
      {"a missing field", rawSafetensors(R"({"a":{"dtype":"F32","shape":[2]}})", ""), "lacks dtype, shape or data_offsets"},
      {"a truncated file", valid.substr(0, valid.size() - 3), "lie outside the 5 bytes of data"},
  };
  for (const Case& c : cases) {
    INFO(c.label);
    const std::string path = writeBytes(dir + "/bad.safetensors", c.bytes);
    const std::string error = usageError([&] { readSafetensors(path); });
    CHECK_THAT(error, Contains(path + ": not a valid safetensors file: "));
    CHECK_THAT(error, Contains(c.says));
    // By content or by name, readWeightsFile refuses it too.
    CHECK_THAT(usageError([&] { readWeightsFile(path); }), Contains(path));
  }
  CHECK(readSafetensors(writeBytes(dir + "/ok.safetensors", valid)).tensors.size() == 1);
  CHECK_THAT(usageError([&] { readWeightsFile(dir + "/absent.safetensors"); }), Contains("absent.safetensors: no such file"));
}

TEST_CASE("torch.save files: an OrderedDict state_dict loads, tied weights stay tied, others get a HINT",
          "[interop][errors][solo]") {
  const std::string whyNot = ddp::test::pythonTorchUnavailable();
  if (!whyNot.empty()) {
    WARN("SKIPPED: " << whyNot);
    return;
  }
  const std::string dir = tempDir();
  const PythonRun made = python({"-c", R"PY(
import sys, torch
sys.path.insert(0, sys.argv[1]); import ddp_models
d = sys.argv[2]
torch.manual_seed(0)
m = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.BatchNorm1d(2))
m(torch.randn(4, 3))  # running statistics that are not the defaults
torch.save(m.state_dict(), d + "/od.pt")
ddp_models.save_safetensors(d + "/od.safetensors", m.state_dict())
t = torch.randn(3, 4)
plain = {"a": t, "b": t, "c": t.t(), "h": torch.randn(5).half(), "bf": torch.randn(2).bfloat16(),
         "i": torch.arange(-3, 3), "flag": torch.tensor([True, False]), "s": torch.tensor(1.5), "e": torch.zeros(0, 2)}
torch.save(plain, d + "/plain.pt")
ddp_models.save_safetensors(d + "/plain.safetensors", {k: v.contiguous() for k, v in plain.items()})
opt = torch.optim.Adam(m.parameters())
torch.save({"model": m.state_dict(), "optimizer": opt.state_dict(), "epoch": 3}, d + "/ckpt.pt")
torch.save(m, d + "/module.pt")
torch.save(m.state_dict(), d + "/legacy.pt", _use_new_zipfile_serialization=False)
torch.save(m.state_dict(), d + "/legacy4.pt", _use_new_zipfile_serialization=False, pickle_protocol=4)
import zipfile
def archive(name, pickle, version=b"3\n", method=zipfile.ZIP_STORED):
    with zipfile.ZipFile(d + "/" + name, "w", compression=method) as z:
        z.writestr("archive/data.pkl", pickle)
        z.writestr("archive/version", version)
archive("deep.pt", b"\x80\x02" + b"(" * 300000 + b"t" * 300000 + b".")
archive("bomb.pt", b"\x80\x02}." + b"\0" * 50_000_000, method=zipfile.ZIP_DEFLATED)
archive("version.pt", b"\x80\x02}.", version=b"99999999999999999999999\n")
)PY",
                                 kSource + "/python", dir});
  INFO(made.output);
  REQUIRE(made.exitCode == 0);

  const WeightsFile od = readWeightsFile(dir + "/od.pt");
  const WeightsFile expected = readSafetensors(dir + "/od.safetensors");
  std::vector<std::string> names;
  for (const auto& [name, tensor] : od.tensors) names.push_back(name);
  CHECK(names == std::vector<std::string>{"0.weight", "0.bias", "1.weight", "1.bias", "1.running_mean",
                                          "1.running_var", "1.num_batches_tracked"});
  for (const auto& [name, tensor] : expected.tensors) {
    INFO(name);
    CHECK(at::equal(named(od.tensors, name), tensor));
  }

  const WeightsFile plain = readTorchStateDict(dir + "/plain.pt");
  const WeightsFile plainExpected = readSafetensors(dir + "/plain.safetensors");
  for (const auto& [name, tensor] : plainExpected.tensors) {
    INFO(name);
    const at::Tensor got = named(plain.tensors, name);
    CHECK(got.scalar_type() == tensor.scalar_type());
    CHECK(at::equal(got, tensor));
  }
  CHECK(named(plain.tensors, "a").data_ptr() == named(plain.tensors, "b").data_ptr());  // tied
  CHECK(named(plain.tensors, "c").stride(0) == 1);  // the transposed view of the same storage

  CHECK_THAT(usageError([&] { readWeightsFile(dir + "/ckpt.pt"); }),
             Contains("not a state_dict: entries that are not tensors: model (a dict), optimizer (a dict), epoch (an "
                      "int). HINT: save the model's weights alone, as torch.save(model.state_dict(), PATH)"));
  CHECK_THAT(usageError([&] { readWeightsFile(dir + "/legacy4.pt"); }), Contains("legacy format"));
  // Hostile archives: nesting that would exhaust the stack, a record that
  // inflates to 50 MB (a zip bomb's shape), a version that is no number.
  CHECK_THAT(usageError([&] { readWeightsFile(dir + "/deep.pt"); }), Contains("the pickle nests too deeply"));
  CHECK_THAT(usageError([&] { readWeightsFile(dir + "/bomb.pt"); }),
             Contains("record archive/data.pkl is compressed (method 8), which torch.save never does"));
  CHECK_THAT(usageError([&] { readWeightsFile(dir + "/version.pt"); }), Contains("not a readable torch.save archive"));
  CHECK_THAT(usageError([&] { readWeightsFile(dir + "/module.pt"); }), Contains("not a state_dict"));
  CHECK_THAT(usageError([&] { readWeightsFile(dir + "/legacy.pt"); }),
             Contains("legacy format") && Contains("HINT: convert it in Python: torch.save(torch.load("));
  // Cut short, or garbage behind a zip signature: one UsageError, no crash.
  const std::string whole = ddp::test::readFile(dir + "/od.pt");
  for (size_t keep : {whole.size() / 2, whole.size() - 30, size_t{10}}) {
    INFO("kept " << keep << " of " << whole.size() << " bytes");
    const std::string cut = writeBytes(dir + "/cut.pt", whole.substr(0, keep));
    CHECK_THAT(usageError([&] { readWeightsFile(cut); }), Contains(cut));
  }
  const std::string garbage = writeBytes(dir + "/garbage.pt", std::string("PK\x03\x04", 4) + std::string(200, 'x'));
  CHECK_THAT(usageError([&] { readWeightsFile(garbage); }), Contains(garbage + ": not a readable torch.save archive"));
  const std::string text = writeBytes(dir + "/notes.txt", "hello, weights");
  CHECK_THAT(usageError([&] { readWeightsFile(text); }), Contains("neither a safetensors file nor a torch.save zip"));
}

TEST_CASE("loading weights into a module: everything fits, or one error lists what does not", "[interop][errors]") {
  struct Net : torch::nn::Module {
    Net() {
      fc = register_module("fc", torch::nn::Linear(3, 2));
      bn = register_module("bn", torch::nn::BatchNorm1d(2));
    }
    torch::nn::Linear fc{nullptr};
    torch::nn::BatchNorm1d bn{nullptr};
  };
  Net net;
  const NamedTensors state = moduleState(net);
  std::vector<std::string> names;
  for (const auto& [name, tensor] : state) names.push_back(name);
  CHECK(names == std::vector<std::string>{"fc.weight", "fc.bias", "bn.weight", "bn.bias", "bn.running_mean",
                                          "bn.running_var", "bn.num_batches_tracked"});
  NamedTensors given;
  for (const auto& [name, tensor] : state) given.emplace_back(name, at::full_like(tensor, 3).to(at::kDouble));
  loadModuleState(net, given, "w.safetensors");
  CHECK(net.fc->weight.dtype() == at::kFloat);  // converted, as load_state_dict does
  CHECK(net.fc->weight.eq(3).all().item<bool>());

  NamedTensors broken = given;
  broken.erase(broken.begin());  // fc.weight missing
  broken.emplace_back("fc.extra", at::zeros({1}));
  broken[0].second = at::zeros({5});  // fc.bias of the wrong shape
  for (auto& [name, tensor] : broken) {
    if (name == "bn.weight") tensor = at::full({2}, 9.0);
  }
  const std::string error = usageError([&] { loadModuleState(net, broken, "w.safetensors"); });
  CHECK_THAT(error, Contains("w.safetensors: does not fit the model: missing 1: fc.weight; unexpected 1: fc.extra; "
                             "wrong shape 1: fc.bias (file [5], model [2])"));
  CHECK(net.bn->weight.eq(3).all().item<bool>());  // nothing copied

  for (const std::string prefix : {"module.", "_orig_mod."}) {
    NamedTensors wrapped;
    for (const auto& [name, tensor] : given) wrapped.emplace_back(prefix + name, tensor);
    const std::string e = usageError([&] { loadModuleState(net, wrapped, "w.pt"); });
    INFO(e);
    CHECK_THAT(e, Contains("missing 7") && Contains("unexpected 7"));
    CHECK_THAT(e, Contains("HINT: the file's names start with \"" + prefix + "\""));
    CHECK_THAT(e, Contains(prefix == "module." ? "DistributedDataParallel" : "torch.compile"));
  }
}

TEST_CASE("models trained here, exported, give PyTorch the same logits (wine, digits_cnn, char_gpt)",
          "[interop][launcher][solo]") {
  const std::string whyNot = ddp::test::pythonTorchUnavailable();
  if (!whyNot.empty()) {
    WARN("SKIPPED: " << whyNot);
    return;
  }
  struct Case {
    const char* experiment;
    const char* settings;  // fsdp and zero1 save sharded checkpoints: --export consolidates them
  };
  const std::vector<Case> cases = {
      {"wine_baseline", "--nproc-per-node 2 --set distributed.strategy=fsdp --set training.epochs=2"},
      {"digits_cnn", "--set distributed.strategy=zero1 --set training.epochs=1"},
      {"char_gpt", "--set training.max_steps=2 --set distributed.strategy=ddp"},
  };
  PluginRegistry& registry = builtinPlugins();
  for (const Case& c : cases) {
    if (std::string(c.experiment) == "char_gpt" && !fs::exists("/usr/share/games/fortunes/computers")) {
      WARN("SKIPPED char_gpt: its corpus /usr/share/games/fortunes/computers is absent (Debian's fortunes)");
      continue;
    }
    INFO(c.experiment);
    const std::string run = tempDir() + "/run";
    auto trained = runDdpRun(kSource + "/experiments/" + c.experiment + ".json " + c.settings +
                             " --set training.save_every=1 --out " + run);
    INFO(trained.output);
    REQUIRE(trained.exitCode == 0);
    auto exported = runDdpRun("--export " + run);
    INFO(exported.output);
    REQUIRE(exported.exitCode == 0);
    CHECK_THAT(exported.output, Contains("to " + run + "/model.safetensors (safetensors)"));
    exported = runDdpRun("--export " + run + " --format torch -o " + run + "/weights.pt");
    REQUIRE(exported.exitCode == 0);
    // Our own reader takes both files back, tensor for tensor.
    const WeightsFile fromTorch = readWeightsFile(run + "/weights.pt");
    const WeightsFile fromSafetensors = readWeightsFile(run + "/model.safetensors");
    REQUIRE(fromTorch.tensors.size() == fromSafetensors.tensors.size());
    for (const auto& [name, tensor] : fromSafetensors.tensors) CHECK(at::equal(named(fromTorch.tensors, name), tensor));

    TrainedModel model = loadTrainedModel(run, registry);
    torch::manual_seed(11);
    at::Tensor input = model.context.vocabSize > 0
                           ? at::randint(model.context.vocabSize, {2, model.context.sampleShape[0]}, at::kLong)
                           : at::randn([&] {
                               std::vector<int64_t> shape{5};
                               for (int64_t d : model.context.sampleShape) shape.push_back(d);
                               return shape;
                             }());
    at::Tensor logits;
    {
      torch::NoGradGuard noGrad;
      logits = model.model->forward(input);
    }
    writeSafetensors(run + "/case.safetensors", {{"input", input}, {"logits", logits}});
    const PythonRun check = python({kSource + "/tests/interop/check_export.py", run, run + "/case.safetensors",
                                    run + "/model.safetensors", run + "/weights.pt"});
    INFO(check.output);
    REQUIRE(check.exitCode == 0);
    int lines = 0;
    std::istringstream in(check.output);
    for (std::string line; std::getline(in, line);) {
      const auto record = nlohmann::json::parse(line);
      INFO(record.dump());
      CHECK(record["max_abs_diff"].get<double>() <= 1e-5);
      CHECK(record["max_abs_logit"].get<double>() > 0.01);  // a comparison of something
      ++lines;
    }
    CHECK(lines == 2);
  }
}

TEST_CASE("model.init_from: weights started in Python train here, from the loss Python computes",
          "[interop][launcher][solo]") {
  const std::string whyNot = ddp::test::pythonTorchUnavailable();
  if (!whyNot.empty()) {
    WARN("SKIPPED: " << whyNot);
    return;
  }
  PluginRegistry& registry = builtinPlugins();
  // The models' settings come from a run of each experiment (dropout 0, so
  // that a training-mode loss is deterministic).
  struct Case {
    const char* experiment;
    int batch;
    std::vector<std::string> worlds;  // launcher options, each one run
  };
  const std::vector<Case> cases = {
      {"wine_baseline", 64,
       {"", "--nproc-per-node 2 --set distributed.strategy=ddp", "--nproc-per-node 2 --set distributed.strategy=zero1",
        "--nproc-per-node 2 --set distributed.strategy=fsdp"}},
      {"digits_cnn", 32, {"--nproc-per-node 1"}},
  };
  for (const Case& c : cases) {
    INFO(c.experiment);
    const std::string source = tempDir() + "/source";
    auto made = runDdpRun(kSource + "/experiments/" + c.experiment +
                          ".json --nproc-per-node 1 --set training.epochs=1 --set model.dropout=0 --out " + source);
    REQUIRE(made.exitCode == 0);
    const std::string out = tempDir();
    const PythonRun init = python({kSource + "/tests/interop/make_init.py", source, out, "7", std::to_string(c.batch)});
    INFO(init.output);
    REQUIRE(init.exitCode == 0);
    const double pythonLoss = nlohmann::json::parse(init.output)["loss_train"].get<double>();

    nlohmann::json experiment = nlohmann::json::parse(ddp::test::readFile(source + "/config.json"));
    experiment["dataset"] = {{"name", "npy"},          {"features", out + "/x.npy"},      {"labels", out + "/y.npy"},
                             {"test_features", out + "/x.npy"}, {"test_labels", out + "/y.npy"}};
    experiment["training"]["log_every"] = 1;
    experiment["training"]["save_every"] = 0;
    experiment.erase("distributed");
    const std::string file = ddp::test::writeFileIn(out, "experiment.json", experiment.dump(1));
    for (const std::string weights : {"init.safetensors", "init.pt"}) {
      for (const std::string& world : c.worlds) {
        const int ranks = world.find("--nproc-per-node 2") != std::string::npos ? 2 : 1;
        const std::string run = tempDir() + "/run";
        auto trained = runDdpRun(file + " " + world + " --set model.init_from=" + out + "/" + weights +
                                 " --set training.batch_size=" + std::to_string(c.batch / ranks) + " --out " + run);
        INFO(weights << " " << world << "\n" << trained.output);
        REQUIRE(trained.exitCode == 0);
        CHECK_THAT(ddp::test::readFile(run + "/train.log"), Contains("model: started from the "));
        // One step over the whole batch: the epoch's training loss is the
        // loss of Python's weights on Python's batch.
        const auto metrics = ddp::test::jsonLines(run + "/metrics.jsonl");
        REQUIRE(metrics.size() == 1);
        CHECK(metrics[0]["train_loss"].get<double>() == Approx(pythonLoss).epsilon(1e-5));
        if (ranks == 1) {
          const auto steps = ddp::test::jsonLines(run + "/steps.jsonl");
          REQUIRE(!steps.empty());
          CHECK(steps[0]["loss"].get<double>() == Approx(pythonLoss).epsilon(1e-5));
        }
      }
    }
  }

  // The gpt: its logits and loss on Python's batch, in eval mode, from each file.
  if (!fs::exists("/usr/share/games/fortunes/computers")) {
    WARN("SKIPPED the gpt: its corpus /usr/share/games/fortunes/computers is absent (Debian's fortunes)");
    return;
  }
  const std::string source = tempDir() + "/gpt";
  auto made = runDdpRun(kSource + "/experiments/char_gpt.json --nproc-per-node 1 --set training.max_steps=1 "
                        "--set training.save_every=1 --set model.n_layer=2 --out " + source);
  INFO(made.output);
  REQUIRE(made.exitCode == 0);
  const std::string out = tempDir();
  const PythonRun init = python({kSource + "/tests/interop/make_init.py", source, out, "7", "3"});
  INFO(init.output);
  REQUIRE(init.exitCode == 0);
  const WeightsFile batch = readSafetensors(out + "/batch.safetensors");
  for (const std::string weights : {"init.safetensors", "init.pt"}) {
    INFO(weights);
    TrainedModel model = loadTrainedModel(source, registry);
    loadModuleState(*model.model, readWeightsFile(out + "/" + weights).tensors, weights);
    torch::NoGradGuard noGrad;
    const at::Tensor logits = model.model->forward(named(batch.tensors, "input"));
    CHECK(ddp::test::maxAbsDiff(logits, named(batch.tensors, "logits")) <= 1e-5);
    const at::Tensor loss = at::cross_entropy_loss(logits.reshape({-1, logits.size(-1)}),
                                                   named(batch.tensors, "target").reshape({-1}));
    CHECK(loss.item<double>() == Approx(named(batch.tensors, "loss_eval").item<double>()).epsilon(1e-6));
  }
  // And ddp-run starts a gpt run from them.
  const std::string run = tempDir() + "/gpt-run";
  auto trained = runDdpRun(kSource + "/experiments/char_gpt.json --nproc-per-node 1 --set training.max_steps=1 "
                           "--set model.n_layer=2 --set model.init_from=" + out + "/init.pt --out " + run);
  INFO(trained.output);
  CHECK(trained.exitCode == 0);
  CHECK_THAT(ddp::test::readFile(run + "/train.log"), Contains("model: started from the "));
}

TEST_CASE("model.init_from that does not fit: exit 2, one line, nothing trained", "[interop][launcher][errors][solo]") {
  const std::string dir = tempDir();
  const std::string wine = kSource + "/experiments/wine_baseline.json --set training.epochs=1 --out " + dir;
  // An mlp of other widths.
  writeSafetensors(dir + "/other.safetensors", {{"layers.0.weight", at::zeros({8, 13})}, {"layers.0.bias", at::zeros({8})}});
  auto outcome = runDdpRun(wine + "/a --set model.init_from=" + dir + "/other.safetensors");
  INFO(outcome.output);
  CHECK(outcome.exitCode == 2);
  CHECK_THAT(outcome.output, Contains("model.init_from " + dir + "/other.safetensors: does not fit the model: missing 2: "
                                      "layers.1.bias, layers.1.weight; wrong shape 2: layers.0.weight (file [8, 13], "
                                      "model [64, 13]), layers.0.bias (file [8], model [64])"));
  CHECK_FALSE(fs::exists(dir + "/a/metrics.jsonl"));
  outcome = runDdpRun(wine + "/b --set model.init_from=" + dir + "/absent.pt");
  CHECK(outcome.exitCode == 2);
  CHECK_THAT(outcome.output, Contains("model.init_from: file \"" + dir + "/absent.pt\" not found"));
  // What a DistributedDataParallel wrapper saves.
  writeSafetensors(dir + "/ddp.safetensors", {{"module.layers.0.weight", at::zeros({64, 13})},
                                              {"module.layers.0.bias", at::zeros({64})},
                                              {"module.layers.1.weight", at::zeros({3, 64})},
                                              {"module.layers.1.bias", at::zeros({3})}});
  outcome = runDdpRun("--nproc-per-node 2 " + wine + "/c --set model.init_from=" + dir + "/ddp.safetensors");
  INFO(outcome.output);
  CHECK(outcome.exitCode == 2);
  CHECK_THAT(outcome.output, Contains("HINT: the file's names start with \"module.\" (DistributedDataParallel's "
                                      "wrapper)"));
}
