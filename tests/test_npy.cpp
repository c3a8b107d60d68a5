// The .npy reader and the `npy` dataset, on files that numpy itself writes
// (/usr/bin/python3 with numpy; the tests print SKIPPED without it): every
// supported dtype read back equal to numpy's values, each bad file's one-line
// error (in-process and through ddp-run: exit code 2, no run folder), the
// batches served against a TensorDataset of the same arrays, and 2 ranks
// training on an npy dataset.
#include <sys/wait.h>

#include <ATen/ATen.h>
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <set>
#include <functional>
#include <iostream>
#include <sstream>

#include "framework/core/errors.hpp"
#include "framework/experiment/plugin_registry.hpp"
#include "plugins/builtin.hpp"
#include "plugins/datasets/files.hpp"
#include "plugins/datasets/npy_file.hpp"
#include "tests/test_support.hpp"

using namespace ddp;
using Catch::Matchers::Contains;
using ddp::plugins::NpyArray;
using ddp::plugins::readNpy;

namespace {

// A fresh folder under /tmp, removed with everything in it.
struct Folder {
  std::string path = ddp::test::tempDir();
  Folder() = default;
  Folder(const Folder&) = delete;
  Folder& operator=(const Folder&) = delete;
  ~Folder() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  std::string operator/(const std::string& name) const { return path + "/" + name; }
};

const char* kPython = "/usr/bin/python3";

// Why numpy cannot write the test files here, or "" when it can.
std::string numpyMissing() {
  static const std::string why = [] {
    if (!std::filesystem::exists(kPython)) return std::string(kPython) + " is absent";
    SpawnOptions o;
    o.argv = {kPython, "-c", "import numpy"};
    o.captureOutput = true;
    const FinishedProcess p = runProcess(std::move(o));
    return WIFEXITED(p.status) && WEXITSTATUS(p.status) == 0 ? std::string()
                                                              : std::string("numpy is not importable by ") + kPython;
  }();
  return why;
}

#define SKIP_WITHOUT_NUMPY()                                 \
  do {                                                       \
    if (!numpyMissing().empty()) {                           \
      std::cout << "SKIPPED: " << numpyMissing() << std::endl; \
      return;                                                \
    }                                                        \
  } while (0)

// Runs `code` (Python, with numpy imported as np) in `dir`.
void python(const Folder& dir, const std::string& code) {
  const std::string script = dir / "gen.py";
  std::ofstream(script) << "import os, numpy as np\nos.chdir(" << '"' << dir.path << '"' << ")\n" << code;
  SpawnOptions o;
  o.argv = {kPython, script};
  o.captureOutput = true;
  const FinishedProcess p = runProcess(std::move(o));
  INFO(p.output);
  REQUIRE((WIFEXITED(p.status) && WEXITSTATUS(p.status) == 0));
}

// The message of the UsageError that f throws ("" when it throws none).
std::string usageError(const std::function<void()>& f) {
  try {
    f();
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}

std::vector<int64_t> shapeOf(const at::Tensor& t) { return {t.sizes().begin(), t.sizes().end()}; }

bool mapped(const std::string& path) {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  const std::string name = std::filesystem::canonical(path).string();
  while (std::getline(maps, line)) {
    if (line.size() >= name.size() && line.compare(line.size() - name.size(), name.size(), name) == 0) return true;
  }
  return false;
}

DatasetSplits loadNpyDataset(const Json& params, uint64_t seed = 0) {
  Json values = {{"test_features", ""}, {"test_labels", ""}, {"task", "classification"},
                 {"scale", 1.0},        {"num_classes", 0},  {"test_fraction", 0.2}};
  for (auto it = params.begin(); it != params.end(); ++it) values[it.key()] = it.value();
  return builtinPlugins().get(PluginKind::Dataset, "npy").dataset(Params(values), {seed, ""});
}

// A valid 2-rank experiment over the npy dataset of `dir`, with `dataset`
// entries replacing the defaults.
std::string writeExperiment(const Folder& dir, const std::string& name, const Json& dataset, int epochs = 2) {
  Json d = {{"name", "npy"}, {"features", dir / "x.npy"}, {"labels", dir / "y.npy"}};
  for (auto it = dataset.begin(); it != dataset.end(); ++it) d[it.key()] = it.value();
  Json experiment = {{"name", "npy_test"},
                     {"dataset", d},
                     {"model", {{"name", "mlp"}, {"layers", {0, 32, 0}}}},
                     {"optimizer", {{"name", "adam"}, {"lr", 0.01}}},
                     {"loss", {{"name", "cross_entropy"}}},
                     {"training", {{"epochs", epochs}, {"batch_size", 16}, {"seed", 1}, {"save_every", 0},
                                   {"threads", 1}}}};
  if (d.value("task", "") == "regression") experiment["loss"]["name"] = "mse";
  const std::string path = dir / name;
  std::ofstream(path) << experiment.dump(2);
  return path;
}

}  // namespace

TEST_CASE("readNpy reads every supported dtype and shape as numpy wrote it, memory-mapped", "[npy][solo]") {
  SKIP_WITHOUT_NUMPY();
  Folder dir;
  python(dir, R"(
np.save('f4.npy', np.arange(12, dtype=np.float32).reshape(3, 4) * np.float32(0.5) - np.float32(1))
np.save('f8.npy', np.arange(24, dtype=np.float64).reshape(2, 3, 4) / 7)
np.save('u1.npy', ((np.arange(2 * 64) * 37) % 256).astype(np.uint8).reshape(2, 1, 8, 8))
np.save('i8.npy', np.arange(-5, 5, dtype=np.int64) * 1000000007)
np.save('i4.npy', np.arange(-3, 7, dtype=np.int32))
np.save('empty.npy', np.zeros((0, 3), dtype=np.float32))
np.save('strided.npy', np.arange(20, dtype=np.float32).reshape(4, 5)[:, ::2])
for v in [(1, 0), (2, 0), (3, 0)]:
    with open('v%d.npy' % v[0], 'wb') as f:
        np.lib.format.write_array(f, np.arange(6, dtype=np.float64).reshape(3, 2), version=v)
data = open('u1.npy', 'rb').read()
open('u1_le.npy', 'wb').write(data.replace(b"'|u1'", b"'<u1'"))
)");
  auto f4 = at::arange(12, at::kFloat).reshape({3, 4}) * 0.5 - 1;
  auto f8 = at::arange(24, at::kDouble).reshape({2, 3, 4}) / 7;
  auto u1 = (at::arange(2 * 64, at::kLong) * 37).remainder(256).to(at::kByte).reshape({2, 1, 8, 8});
  auto i8 = at::arange(-5, 5, at::kLong) * 1000000007;
  auto i4 = at::arange(-3, 7, at::kInt);
  auto v = at::arange(6, at::kDouble).reshape({3, 2});
  struct Case {
    std::string file;
    at::Tensor expected;
    std::string descr;
  };
  const std::vector<Case> cases = {
      {"f4.npy", f4, "<f4"},  {"f8.npy", f8, "<f8"},    {"u1.npy", u1, "|u1"},
      {"u1_le.npy", u1, "<u1"}, {"i8.npy", i8, "<i8"},  {"i4.npy", i4, "<i4"},
      {"v1.npy", v, "<f8"},   {"v2.npy", v, "<f8"},     {"v3.npy", v, "<f8"},
      {"strided.npy", at::arange(20, at::kFloat).reshape({4, 5}).slice(1, 0, 5, 2).contiguous(), "<f4"},
  };
  for (const auto& c : cases) {
    INFO(c.file);
    NpyArray a = readNpy(dir / c.file);
    CHECK(a.descr == c.descr);
    CHECK(a.dtype == c.expected.scalar_type());
    CHECK(a.shape == shapeOf(c.expected));
    CHECK(shapeOf(a.data) == shapeOf(c.expected));
    CHECK(a.data.is_contiguous());
    CHECK(a.data.equal(c.expected));
  }
  CHECK(readNpy(dir / "v1.npy").versionMajor == 1);
  CHECK(readNpy(dir / "v2.npy").versionMajor == 2);
  CHECK(readNpy(dir / "v3.npy").versionMajor == 3);
  NpyArray empty = readNpy(dir / "empty.npy");
  CHECK(empty.shape == std::vector<int64_t>{0, 3});
  CHECK(empty.data.numel() == 0);

  // The data is the file, mapped: the mapping lives as long as a tensor
  // shares it, and goes with the last one.
  const std::string file = dir / "f8.npy";
  CHECK_FALSE(mapped(file));
  {
    at::Tensor view;
    {
      NpyArray a = readNpy(file);
      CHECK(mapped(file));
      view = a.data[1];
    }
    CHECK(mapped(file));
    CHECK(view.equal(f8[1]));
  }
  CHECK_FALSE(mapped(file));
}

namespace {

// Bad .npy files, each with the words its one-line error must contain.
struct BadFile {
  std::string file;
  std::vector<std::string> expected;
};

// Writes them into `dir` (through numpy, or numpy's files with bytes changed).
std::vector<BadFile> writeBadFiles(const Folder& dir) {
  python(dir, R"(
good = np.arange(6, dtype=np.float32).reshape(2, 3)
np.save('good.npy', good)
data = open('good.npy', 'rb').read()
open('text.npy', 'w').write('a,b\n1,2\n')
np.savez('arrays.npz', x=good)
open('version.npy', 'wb').write(data[:6] + bytes([9, 0]) + data[8:])
open('short_header.npy', 'wb').write(data[:40])
open('short_data.npy', 'wb').write(data[:-4])
np.save('fortran.npy', np.asfortranarray(good))
np.save('object.npy', np.array([{'a': 1}, None], dtype=object), allow_pickle=True)
np.save('big_endian.npy', np.arange(4, dtype='>f4'))
np.save('float16.npy', np.arange(4, dtype=np.float16))
np.save('record.npy', np.zeros(3, dtype=[('a', '<f4'), ('b', '<i4')]))
def header(text):
    text = text.encode('latin1')
    text += b' ' * (64 - (10 + len(text) + 1) % 64) + b'\n'
    return b'\x93NUMPY\x01\x00' + len(text).to_bytes(2, 'little') + text
body = good.tobytes()
open('unclosed.npy', 'wb').write(header("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), ") + body)
open('no_shape.npy', 'wb').write(header("{'descr': '<f4', 'fortran_order': False}") + body)
open('shape_text.npy', 'wb').write(header("{'descr': '<f4', 'fortran_order': False, 'shape': 'big'}") + body)
)");
  return {
      {"text.npy", {"text.npy: not an .npy file", "HINT: write it with numpy.save"}},
      {"arrays.npz", {"arrays.npz: an .npz archive", "HINT: save each array on its own with numpy.save"}},
      {"version.npy", {"version.npy: .npy format version 9.0 is not supported (1.0, 2.0 and 3.0 are)"}},
      {"short_header.npy", {"short_header.npy: truncated .npy header: it says 118 bytes, the file ends 30 bytes"}},
      {"short_data.npy",
       {"short_data.npy: truncated .npy data: shape (2, 3) of <f4 needs 24 bytes after the header, the file has 20"}},
      {"fortran.npy",
       {"fortran.npy: the array is in Fortran order", "HINT: save numpy.ascontiguousarray(a)"}},
      {"object.npy",
       {"object.npy: dtype '|O' is an object array", "HINT: allow_pickle data cannot be read; save a numeric array"}},
      {"big_endian.npy",
       {"big_endian.npy: dtype '>f4' (big-endian float32) is not supported; supported: float32 '<f4', float64 '<f8', "
        "uint8 '|u1', int32 '<i4', int64 '<i8'. HINT:"}},
      {"float16.npy", {"float16.npy: dtype '<f2' (float16) is not supported; supported: float32 '<f4'"}},
      {"record.npy", {"record.npy: a structured dtype", "is not supported"}},
      {"unclosed.npy", {"unclosed.npy: malformed .npy header: expected a quoted string at character"}},
      {"no_shape.npy", {"no_shape.npy: malformed .npy header: no 'shape' key"}},
      {"shape_text.npy", {"shape_text.npy: malformed .npy header: 'shape' is not a tuple of integers"}},
  };
}

// Exactly one line (a trailing newline allowed).
bool oneLine(const std::string& text) {
  const size_t newline = text.find('\n');
  return !text.empty() && (newline == std::string::npos || newline == text.size() - 1);
}

}  // namespace

TEST_CASE("each bad .npy file is one line naming the file and what is wrong", "[npy][solo]") {
  SKIP_WITHOUT_NUMPY();
  Folder dir;
  for (const BadFile& bad : writeBadFiles(dir)) {
    INFO(bad.file);
    const std::string error = usageError([&] { readNpy(dir / bad.file); });
    INFO(error);
    CHECK(oneLine(error));
    CHECK_THAT(error, Contains(dir / bad.file));
    for (const std::string& words : bad.expected) CHECK_THAT(error, Contains(words));
  }
  CHECK_THAT(usageError([&] { readNpy(dir / "absent.npy"); }), Contains("absent.npy: cannot open: "));
  CHECK(readNpy(dir / "good.npy").data.equal(at::arange(6, at::kFloat).reshape({2, 3})));
}

namespace {

// Label and feature files that the dataset refuses, in `dir` (x.npy and
// y.npy are a good pair), each with the words its error must contain.
std::vector<std::pair<Json, std::string>> writeBadDatasets(const Folder& dir) {
  python(dir, R"(
n = 40
x = ((np.arange(n * 64) * 7) % 256).astype(np.uint8).reshape(n, 64)
y = (np.arange(n) % 4).astype(np.int64)
np.save('x.npy', x); np.save('y.npy', y)
np.save('y_short.npy', y[:30])
bad = y.copy(); bad[7] = 12; np.save('y_big.npy', bad)
bad = y.copy(); bad[5] = -1; np.save('y_negative.npy', bad)
np.save('y_float.npy', y.astype(np.float32))
np.save('y_column.npy', y.reshape(n, 1))
np.save('y_one.npy', np.full(n, 3, dtype=np.int64))
np.save('x_empty.npy', x[:0]); np.save('y_empty.npy', y[:0])
np.save('x_flat.npy', np.arange(n, dtype=np.float32))
np.save('x_test.npy', x[:10, :32]); np.save('y_test.npy', y[:10]); np.save('x_test_ok.npy', x[:10])
bad = y[:10].copy(); bad[2] = 9; np.save('y_test_big.npy', bad)
np.save('y_gap.npy', y * 2)
xf = x.astype(np.float32); xf[6, 5] = np.nan; np.save('x_nan.npy', xf)
bad = y.copy(); bad[3] = 2**40; np.save('y_huge.npy', bad)
)");
  const std::string x = dir / "x.npy", y = dir / "y.npy";
  return {
      {{{"labels", dir / "y_short.npy"}},
       x + " has 40 samples, shape (40, 64), but " + dir / "y_short.npy" + " has 30 labels, shape (30,)"},
      {{{"labels", dir / "y_big.npy"}, {"num_classes", 10}},
       "y_big.npy: label 12 at index 7 is not below 10, the number of classes (dataset.num_classes). HINT:"},
      {{{"labels", dir / "y_negative.npy"}}, "y_negative.npy: label -1 at index 5 is negative"},
      {{{"labels", dir / "y_float.npy"}},
       "y_float.npy: labels are float32 ('<f4'), but classification needs integer class indices. HINT: save "
       "labels.astype(numpy.int64), or set \"task\": \"regression\""},
      {{{"labels", dir / "y_column.npy"}},
       "y_column.npy: labels must be 1-D, shape (N,); got shape (40, 1). HINT: save labels.reshape(-1)"},
      {{{"labels", dir / "y_one.npy"}}, "y_one.npy: every label is 3; a classifier needs at least 2 classes. HINT:"},
      {{{"features", dir / "x_empty.npy"}, {"labels", dir / "y_empty.npy"}},
       "x_empty.npy: no samples (shape (0, 64))"},
      {{{"features", dir / "x_flat.npy"}},
       "x_flat.npy: features need a sample dimension and at least one more, shape (N, ...); got shape (40,). HINT: "
       "for one value per sample, save x.reshape(-1, 1)"},
      {{{"test_features", dir / "x_test.npy"}, {"test_labels", dir / "y_test.npy"}},
       "x_test.npy: samples of shape (32,), but " + x + " has samples of shape (64,)"},
      {{{"test_features", dir / "x_test_ok.npy"}, {"test_labels", dir / "y_test_big.npy"}},
       "y_test_big.npy: label 9 at index 2 is not below 4, the number of classes (the largest label in " + y +
           " + 1). HINT: set dataset.num_classes"},
      {{{"test_features", dir / "x.npy"}}, "dataset.test_labels: required when dataset.test_features is given"},
      {{{"test_fraction", 0.001}}, "dataset.test_fraction: 0.001 of 40 rows leaves no test rows"},
      {{{"task", "regression"}, {"num_classes", 3}}, "dataset.num_classes: is for classification"},
      // Classes implied by the largest label must each have a sample.
      {{{"labels", dir / "y_gap.npy"}},
       "y_gap.npy: class labels must be 0..C-1 with a sample for each; the largest, 6 at index 3, implies 7 "
       "classes, but no sample has class 1, 3, 5. HINT:"},
      {{{"features", dir / "x_nan.npy"}},
       "x_nan.npy: feature nan at sample 6 (element 389 of the file) is not finite"},
      {{{"labels", dir / "y_huge.npy"}},
       "y_huge.npy: label 1099511627776 at index 3 implies 1099511627777 classes, more than the 40 samples"},
  };
}

}  // namespace

TEST_CASE("the npy dataset refuses mismatched shapes and bad labels with one line", "[npy][solo]") {
  SKIP_WITHOUT_NUMPY();
  Folder dir;
  for (const auto& [overrides, expected] : writeBadDatasets(dir)) {
    Json params = {{"features", dir / "x.npy"}, {"labels", dir / "y.npy"}};
    for (auto it = overrides.begin(); it != overrides.end(); ++it) params[it.key()] = it.value();
    INFO(params.dump());
    const std::string error = usageError([&] { loadNpyDataset(params); });
    INFO(error);
    CHECK(oneLine(error));
    CHECK_THAT(error, Contains(expected));
  }
}

TEST_CASE("npy labels may skip classes when dataset.num_classes says how many there are", "[npy][solo]") {
  SKIP_WITHOUT_NUMPY();
  Folder dir;
  writeBadDatasets(dir);
  CHECK_NOTHROW(loadNpyDataset({{"features", dir / "x.npy"}, {"labels", dir / "y_gap.npy"}, {"num_classes", 8}}));
}

namespace {

// Runs each experiment over the npy dataset with `dataset` entries through
// ddp-run: exit code 2, the one line with `expected`, and no run folder.
void checkRefusedByProgram(const Folder& dir, const std::vector<std::pair<Json, std::string>>& cases) {
  int i = 0;
  for (const auto& [dataset, expected] : cases) {
    const std::string experiment = writeExperiment(dir, "bad" + std::to_string(i) + ".json", dataset);
    const std::string runDir = dir / ("run" + std::to_string(i++));
    const ddp::test::ProgramOutcome o = ddp::test::runDdpRun(experiment + " --out " + runDir);
    INFO(dataset.dump() << "\n" << o.output);
    CHECK(o.exitCode == 2);
    CHECK(oneLine(o.output));
    CHECK_THAT(o.output, Contains(expected));
    CHECK_FALSE(std::filesystem::exists(runDir));
  }
}

}  // namespace

// The program's part is the same for every UsageError, and each start of
// ddp-run costs a second or so: the kinds of mistake the issue names go
// through it, the wording of every case is checked in-process above.
TEST_CASE("ddp-run refuses bad .npy files: exit code 2, one line, no run folder", "[npy][launcher][solo]") {
  SKIP_WITHOUT_NUMPY();
  Folder dir;
  const std::set<std::string> chosen = {"text.npy",       "version.npy", "short_header.npy", "short_data.npy",
                                        "fortran.npy",    "object.npy",  "big_endian.npy",   "unclosed.npy"};
  std::vector<std::pair<Json, std::string>> cases;
  for (const BadFile& bad : writeBadFiles(dir)) {
    // The labels file is read after the features, which fail first.
    if (chosen.count(bad.file)) {
      cases.push_back({{{"features", dir / bad.file}, {"labels", dir / "good.npy"}}, bad.expected[0]});
    }
  }
  REQUIRE(cases.size() == chosen.size());
  checkRefusedByProgram(dir, cases);
}

TEST_CASE("ddp-run refuses npy datasets with bad labels: exit code 2, one line, no run folder", "[npy][launcher][solo]") {
  SKIP_WITHOUT_NUMPY();
  Folder dir;
  std::vector<std::pair<Json, std::string>> cases = writeBadDatasets(dir);
  cases.resize(7);  // shapes that disagree, labels out of range, negative, float, 2-D, one class, no samples
  checkRefusedByProgram(dir, cases);
}

// test_features and test_labels are file parameters: a missing one is
// found with the others, naming where it was looked for.
TEST_CASE("ddp-run refuses a missing npy test file before anything runs", "[npy][launcher][solo]") {
  SKIP_WITHOUT_NUMPY();
  Folder dir;
  writeBadDatasets(dir);  // for its x.npy and y.npy, which fit together
  checkRefusedByProgram(dir, {{{{"features", dir / "x.npy"}, {"labels", dir / "y.npy"},
                                {"test_features", dir / "x.npy"}, {"test_labels", "nope.npy"}},
                               "dataset.test_labels: file \"nope.npy\" not found (looked in"}});
}

TEST_CASE("the npy dataset serves the batches a TensorDataset of the same arrays serves", "[npy][solo]") {
  SKIP_WITHOUT_NUMPY();
  Folder dir;
  python(dir, R"(
n = 40
np.save('images.npy', ((np.arange(n * 64) * 7) % 256).astype(np.uint8).reshape(n, 1, 8, 8))
np.save('classes.npy', (np.arange(n) % 4).astype(np.uint8))
np.save('table.npy', np.arange(n * 3, dtype=np.float64).reshape(n, 3) / 9)
np.save('targets.npy', (np.arange(n) * 0.25).astype(np.float32))
np.save('table_test.npy', np.arange(12, dtype=np.float64).reshape(4, 3) / 9 + 100)
np.save('targets_test.npy', np.arange(4, dtype=np.int32))
)");
  const int64_t n = 40;
  const at::Tensor images = (at::arange(n * 64, at::kLong) * 7).remainder(256).to(at::kByte).reshape({n, 1, 8, 8});
  const at::Tensor classes = at::arange(n, at::kLong).remainder(4);

  SECTION("uint8 images, scaled, split by test_fraction") {
    const double scale = 1.0 / 255;
    const uint64_t seed = 7;
    DatasetSplits s = loadNpyDataset(
        {{"features", dir / "images.npy"}, {"labels", dir / "classes.npy"}, {"scale", scale}, {"test_fraction", 0.25}},
        seed);
    CHECK(s.task == Task::Classification);
    CHECK(s.numClasses == 4);
    CHECK(s.sampleShape == std::vector<int64_t>{1, 8, 8});
    CHECK(s.numFeatures == 64);
    REQUIRE(s.train->size() == 30);
    REQUIRE(s.test->size() == 10);
    // The reference: the whole arrays converted, then split by the same
    // seeded permutation as the table datasets (first 10 rows test).
    const std::vector<int64_t> order = plugins::seededPermutation(n, seed);
    const at::Tensor perm = at::tensor(order, at::kLong);
    const at::Tensor x = images.to(at::kFloat).mul(scale);
    TensorDataset refTrain(x.index_select(0, perm.slice(0, 10, n)), classes.index_select(0, perm.slice(0, 10, n)));
    TensorDataset refTest(x.index_select(0, perm.slice(0, 0, 10)), classes.index_select(0, perm.slice(0, 0, 10)));
    for (const std::vector<int64_t>& batch : {std::vector<int64_t>{3, 0, 29, 3}, std::vector<int64_t>{}}) {
      const Batch got = s.train->get(batch);
      const Batch want = refTrain.get(batch);
      CHECK(got.inputs.scalar_type() == at::kFloat);
      CHECK(got.targets.scalar_type() == at::kLong);
      CHECK(shapeOf(got.inputs) == shapeOf(want.inputs));
      CHECK(got.inputs.equal(want.inputs));
      CHECK(got.targets.equal(want.targets));
    }
    CHECK(s.train->all().inputs.equal(refTrain.all().inputs));
    CHECK(s.test->all().inputs.equal(refTest.all().inputs));
    CHECK(s.test->all().targets.equal(refTest.all().targets));
    CHECK(s.train->all().inputs.max().item<float>() <= 1.0f);
    CHECK_THROWS_WITH(s.train->get(std::vector<int64_t>{30}), Contains("sample index 30 out of range for 30 samples"));
    CHECK_THROWS_WITH(s.test->get(std::vector<int64_t>{-1}), Contains("sample index -1 out of range for 10 samples"));
  }

  SECTION("a float64 table for regression, with its own test files") {
    DatasetSplits s = loadNpyDataset({{"features", dir / "table.npy"},
                                      {"labels", dir / "targets.npy"},
                                      {"test_features", dir / "table_test.npy"},
                                      {"test_labels", dir / "targets_test.npy"},
                                      {"task", "regression"}});
    CHECK(s.task == Task::Regression);
    CHECK(s.numClasses == 0);
    CHECK(s.sampleShape == std::vector<int64_t>{3});
    TensorDataset refTrain((at::arange(n * 3, at::kDouble).reshape({n, 3}) / 9).to(at::kFloat),
                           (at::arange(n, at::kFloat) * 0.25));
    TensorDataset refTest((at::arange(12, at::kDouble).reshape({4, 3}) / 9 + 100).to(at::kFloat),
                          at::arange(4, at::kFloat));
    REQUIRE(s.train->size() == n);
    REQUIRE(s.test->size() == 4);
    const std::vector<int64_t> batch = {39, 1, 17};
    CHECK(s.train->get(batch).inputs.equal(refTrain.get(batch).inputs));
    CHECK(s.train->get(batch).targets.equal(refTrain.get(batch).targets));
    CHECK(s.test->all().inputs.equal(refTest.all().inputs));
    CHECK(s.test->all().targets.equal(refTest.all().targets));
    CHECK(s.test->all().targets.scalar_type() == at::kFloat);
  }
}

TEST_CASE("two ranks train the mlp on an npy dataset of uint8 pixel rows scaled by 1/255, and the loss falls",
          "[npy][launcher][solo]") {
  SKIP_WITHOUT_NUMPY();
  Folder dir;
  // 4 classes of noisy uint8 "images" around 4 random patterns.
  python(dir, R"(
rng = np.random.default_rng(0)
n, d = 400, 64
centers = rng.uniform(0, 255, size=(4, d))
y = np.arange(n) % 4
x = np.clip(centers[y] + rng.normal(0, 40, size=(n, d)), 0, 255).astype(np.uint8)
np.save('x.npy', x); np.save('y.npy', y.astype(np.int64))
)");
  const std::string experiment =
      writeExperiment(dir, "train.json", {{"scale", 1.0 / 255}, {"test_fraction", 0.25}}, /*epochs=*/4);
  const std::string runDir = dir / "run";
  const ddp::test::ProgramOutcome o = ddp::test::runDdpRun("--nproc-per-node 2 " + experiment + " --out " + runDir);
  INFO(o.output);
  REQUIRE(o.exitCode == 0);
  std::ifstream in(runDir + "/metrics.jsonl");
  std::vector<Json> records;
  for (std::string line; std::getline(in, line);) {
    if (!line.empty()) records.push_back(Json::parse(line));
  }
  REQUIRE(records.size() == 4);
  const double first = records.front()["train_loss"].get<double>();
  const double last = records.back()["train_loss"].get<double>();
  INFO("train loss " << first << " -> " << last);
  CHECK(last < 0.5 * first);
  REQUIRE(records.back().contains("test_accuracy"));
  CHECK(records.back()["test_accuracy"].get<double>() >= 0.9);
}
