// TensorBoard event files (framework/interop/tensorboard_events.hpp), read
// back by tests/interop/read_tfevents.py, a decoder written apart from the
// writer with its own CRC-32C and protobuf wire-format reader (/usr/bin/python3,
// standard library only; the tests that need it print SKIPPED without it):
// every scalar (float32-rounded), step, wall time, tag and text comes back;
// a flipped byte is a CRC mismatch; events reach the file as they are added.
#include <sys/wait.h>
#include <unistd.h>

// test_support.hpp first: its LibTorch headers bring glog's CHECK macro,
// which Catch's CHECK must come after to replace.
#include "tests/test_support.hpp"

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <algorithm>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "framework/interop/tensorboard_events.hpp"
#include "framework/launch/spawn.hpp"

using namespace ddp;
using Catch::Matchers::Contains;

namespace {

const char* kPython = "/usr/bin/python3";

std::string decoderPath() { return std::string(DDP_SOURCE_DIR) + "/tests/interop/read_tfevents.py"; }

// True, with a "SKIPPED: <reason>" warning, when the decoder cannot run here.
bool skipWithoutPython() {
  if (std::filesystem::exists(kPython)) return false;
  WARN("SKIPPED: " << kPython << " is absent (it runs tests/interop/read_tfevents.py)");
  return true;
}

struct Decoded {
  int exitCode = -1;
  std::string output;                 // stdout and stderr together
  std::vector<nlohmann::json> lines;  // the JSON lines, when it exited 0
};

// What read_tfevents.py prints for the file.
Decoded decode(const std::string& path) {
  SpawnOptions options;
  options.argv = {kPython, decoderPath(), path};
  const FinishedProcess done = runProcess(std::move(options));
  Decoded d;
  d.exitCode = WIFEXITED(done.status) ? WEXITSTATUS(done.status) : -1;
  d.output = done.output;
  if (d.exitCode == 0) {
    std::istringstream in(d.output);
    for (std::string line; std::getline(in, line);) {
      if (!line.empty()) d.lines.push_back(nlohmann::json::parse(line));
    }
  }
  return d;
}

// A value as simple_value holds it, as the decoder prints it: a number, or
// "NaN" / "Infinity" / "-Infinity".
nlohmann::json asFloat32(double v) {
  const float f = static_cast<float>(v);
  if (std::isnan(f)) return "NaN";
  if (std::isinf(f)) return f > 0 ? "Infinity" : "-Infinity";
  return static_cast<double>(f);
}

struct Scalar {
  std::string tag;
  double value;
  int64_t step;
  double wallTime;
};

void checkScalar(const nlohmann::json& line, const Scalar& s) {
  INFO("line " << line.dump() << ", expected tag " << s.tag << " value " << s.value << " step " << s.step);
  CHECK(line.at("tag").get<std::string>() == s.tag);
  CHECK(line.at("step").get<int64_t>() == s.step);
  CHECK(line.at("wall_time").get<double>() == s.wallTime);
  CHECK(line.at("value") == asFloat32(s.value));
}

std::string readAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream bytes;
  bytes << in.rdbuf();
  return bytes.str();
}

void writeAll(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

}  // namespace

TEST_CASE("crc32c: known vectors, continuation and TFRecord's mask", "[tensorboard]") {
  CHECK(crc32c("123456789", 9) == 0xE3069283u);
  const std::vector<unsigned char> zeros(32, 0x00), ones(32, 0xFF);
  std::vector<unsigned char> ascending(32);
  for (size_t i = 0; i < ascending.size(); ++i) ascending[i] = static_cast<unsigned char>(i);
  CHECK(crc32c(zeros.data(), zeros.size()) == 0x8A9136AAu);
  CHECK(crc32c(ones.data(), ones.size()) == 0x62A8AB43u);           // RFC 3720 B.4
  CHECK(crc32c(ascending.data(), ascending.size()) == 0x46DD794Eu);  // RFC 3720 B.4
  CHECK(crc32c("", 0) == 0u);
  // Continuing from the CRC of the first part gives the CRC of the whole.
  CHECK(crc32c("56789", 5, crc32c("1234", 4)) == 0xE3069283u);
  // ((0xE3069283 >> 15) | (0xE3069283 << 17)) + 0xa282ead8, modulo 2^32.
  CHECK(maskedCrc32c("123456789", 9) == 0xC78AB0E5u);
}

TEST_CASE("TensorBoard event file: every scalar, step, tag and text comes back through an independent decoder",
          "[tensorboard][solo]") {
  if (skipWithoutPython()) return;
  test::TempDir dir;
  const double t0 = 1700000000.123456;
  const std::vector<Scalar> scalars = {
      {"loss", 0.0, 0, t0},
      {"loss", -1.5, 1, t0 + 1},
      {"loss", 0.1, 2, t0 + 2},  // not a float: rounded
      {"tiny", 1e-30, 3, t0 + 3},
      {"large", 3.0e38, 4, t0 + 4},
      {"large", -123456789.0, 5, t0 + 5},
      {"beyond_float", 1e300, 6, t0 + 6},  // +inf as a float
      {"not_a_number", std::nan(""), 7, t0 + 7},
      {"minus_inf", -std::numeric_limits<double>::infinity(), 8, t0 + 8},
      {"损失/λ ünïcode", 2.5, 9, t0 + 9},
      {"negative_step", 4.0, -3, t0 + 10},
      {"big_step", 5.0, int64_t{1} << 40, t0 + 11},
      {"max_step", 6.0, std::numeric_limits<int64_t>::max(), t0 + 12},
  };
  const std::vector<std::pair<std::string, double>> oneStep = {{"train/accuracy", 0.5}, {"val/accuracy", 0.75},
                                                               {"lr", 1e-3}};
  const int64_t oneStepStep = 100;
  const double oneStepWall = t0 + 100.5;
  const std::string text = "# Run notes\n\n*lr* = 0.001, \"quoted\", tab\there — ünïcode ✓";
  std::string path;
  {
    TensorBoardEventWriter writer(dir.path());
    path = writer.path();
    for (const Scalar& s : scalars) writer.addScalar(s.tag, s.value, s.step, s.wallTime);
    writer.addScalars(oneStep, oneStepStep, oneStepWall);
    writer.addScalars({}, 101, oneStepWall);  // writes nothing
    writer.addText("notes", text, 102, t0 + 102);
  }
  const std::string name = std::filesystem::path(path).filename().string();
  CHECK(std::filesystem::path(path).parent_path() == std::filesystem::path(dir.path()));
  CHECK(name.rfind("events.out.tfevents.", 0) == 0);
  CHECK_THAT(name, Contains("." + std::to_string(::getpid()) + "."));

  const Decoded d = decode(path);
  INFO(d.output);
  REQUIRE(d.exitCode == 0);
  REQUIRE(d.lines.size() == scalars.size() + oneStep.size() + 1);
  for (size_t i = 0; i < scalars.size(); ++i) checkScalar(d.lines[i], scalars[i]);
  for (size_t i = 0; i < oneStep.size(); ++i) {
    checkScalar(d.lines[scalars.size() + i], {oneStep[i].first, oneStep[i].second, oneStepStep, oneStepWall});
  }
  const nlohmann::json& textLine = d.lines.back();
  CHECK(textLine.at("tag") == "notes");
  CHECK(textLine.at("step") == 102);
  CHECK(textLine.at("wall_time").get<double>() == t0 + 102);
  CHECK(textLine.at("text").get<std::string>() == text);
  CHECK_FALSE(textLine.contains("value"));
}

TEST_CASE("TensorBoard event file: each event is in the file when its add returns", "[tensorboard][solo]") {
  if (skipWithoutPython()) return;
  test::TempDir dir;
  TensorBoardEventWriter writer(dir.path());
  CHECK(decode(writer.path()).exitCode == 0);  // the file_version event alone
  writer.addScalar("loss", 1.0, 1, 1e9);
  Decoded d = decode(writer.path());
  INFO(d.output);
  REQUIRE(d.exitCode == 0);
  CHECK(d.lines.size() == 1);
  writer.addText("notes", "hello", 2, 1e9 + 1);
  d = decode(writer.path());
  REQUIRE(d.exitCode == 0);
  REQUIRE(d.lines.size() == 2);
  CHECK(d.lines[1].at("text") == "hello");
}

TEST_CASE("read_tfevents.py fails on a flipped byte naming a CRC mismatch, and on a truncated file",
          "[tensorboard][solo]") {
  if (skipWithoutPython()) return;
  test::TempDir dir;
  std::string path;
  {
    TensorBoardEventWriter writer(dir.path());
    path = writer.path();
    for (int i = 0; i < 5; ++i) writer.addScalar("loss", 1.0 / (i + 1), i, 1e9 + i);
  }
  REQUIRE(decode(path).exitCode == 0);
  const std::string bytes = readAll(path);
  REQUIRE(bytes.size() > 40);

  std::string flipped = bytes;
  flipped[bytes.size() - 10] = static_cast<char>(flipped[bytes.size() - 10] ^ 0x20);  // in the last record's data
  const std::string corrupt = dir.path() + "/corrupt.tfevents";
  writeAll(corrupt, flipped);
  Decoded d = decode(corrupt);
  INFO(d.output);
  CHECK(d.exitCode != 0);
  CHECK_THAT(d.output, Contains("CRC mismatch") && Contains(corrupt) && Contains("byte "));

  std::string lengthFlipped = bytes;
  lengthFlipped[0] = static_cast<char>(lengthFlipped[0] ^ 0x01);  // the first record's length
  writeAll(corrupt, lengthFlipped);
  d = decode(corrupt);
  CHECK(d.exitCode != 0);
  CHECK_THAT(d.output, Contains("CRC mismatch") && Contains("byte 0"));

  const std::string truncated = dir.path() + "/truncated.tfevents";
  writeAll(truncated, bytes.substr(0, bytes.size() - 3));
  d = decode(truncated);
  CHECK(d.exitCode != 0);
  CHECK_THAT(d.output, Contains("truncated") && Contains(truncated));
}

TEST_CASE("TensorBoard event writer: a file of its own per writer, a missing folder, a tag that is not UTF-8",
          "[tensorboard]") {
  test::TempDir dir;
  TensorBoardEventWriter a(dir.path());
  TensorBoardEventWriter b(dir.path());
  CHECK(a.path() != b.path());
  CHECK(std::filesystem::exists(a.path()));
  CHECK(std::filesystem::exists(b.path()));

  const std::string missing = dir.path() + "/missing";
  try {
    TensorBoardEventWriter w(missing);
    FAIL("a writer in a missing folder was created: " << w.path());
  } catch (const std::runtime_error& e) {
    CHECK_THAT(e.what(), Contains("cannot create " + missing + "/events.out.tfevents.") &&
                             Contains(std::strerror(ENOENT)));
  }

  const auto sizeBefore = std::filesystem::file_size(a.path());
  CHECK_THROWS_AS(a.addScalar(std::string("bad\xff", 4), 1.0, 1, 1e9), std::invalid_argument);
  CHECK_THROWS_AS(a.addScalars({{"good", 1.0}, {std::string("\xc0\x80", 2), 2.0}}, 1, 1e9), std::invalid_argument);
  CHECK_THROWS_AS(a.addText(std::string("\xed\xa0\x80", 3), "surrogate", 1, 1e9), std::invalid_argument);
  CHECK(std::filesystem::file_size(a.path()) == sizeBefore);
  a.addScalar("still/ok/λ", 1.0, 1, 1e9);
  CHECK(std::filesystem::file_size(a.path()) > sizeBefore);
}

TEST_CASE("training.tensorboard: every number of metrics.jsonl and steps.jsonl is in the run's event file",
          "[tensorboard][launcher][solo]") {
  if (skipWithoutPython()) return;
  const std::string run = ddp::test::tempDir() + "/run";
  const auto trained = ddp::test::runDdpRun(
      "--nproc-per-node 2 " + std::string(DDP_SOURCE_DIR) +
      "/experiments/wine_baseline.json --set training.epochs=4 --set training.eval_every=2 --set training.tensorboard=true "
      "--set training.clip_grad_norm=1 --set training.log_every=2 --out " + run);
  INFO(trained.output);
  REQUIRE(trained.exitCode == 0);
  std::vector<std::string> files;
  for (const auto& entry : std::filesystem::directory_iterator(run)) {
    if (entry.path().filename().string().rfind("events.out.tfevents.", 0) == 0) files.push_back(entry.path().string());
  }
  REQUIRE(files.size() == 1);  // rank 0's alone
  const Decoded d = decode(files[0]);
  INFO(d.output.substr(0, 2000));
  REQUIRE(d.exitCode == 0);
  // tag -> (step -> value as float32)
  std::map<std::string, std::map<int64_t, nlohmann::json>> seen;
  std::string config;
  for (const auto& line : d.lines) {
    if (line.contains("text")) {
      config = line["text"].get<std::string>();
    } else {
      seen[line["tag"].get<std::string>()][line["step"].get<int64_t>()] = line["value"];
    }
  }
  CHECK_THAT(config, Contains("\"tensorboard\": true"));
  int checked = 0;
  const auto steps = ddp::test::jsonLines(run + "/steps.jsonl");
  REQUIRE(steps.size() >= 4);
  for (const auto& record : steps) {
    for (const auto& [key, value] : record.items()) {
      if (key == "step" || key == "epoch" || key == "time" || !value.is_number()) continue;
      INFO("step/" << key << " at step " << record["step"]);
      CHECK(seen["step/" + key][record["step"].get<int64_t>()] == asFloat32(value.get<double>()));
      ++checked;
    }
  }
  CHECK(seen.count("step/grad_norm") == 1);
  const auto metrics = ddp::test::jsonLines(run + "/metrics.jsonl");
  REQUIRE(metrics.size() == 4);
  for (const auto& record : metrics) {
    for (const auto& [key, value] : record.items()) {
      if (key == "epoch" || !value.is_number()) continue;
      INFO("epoch/" << key << " of epoch " << record["epoch"]);
      const auto& values = seen["epoch/" + key];
      CHECK(std::any_of(values.begin(), values.end(),
                        [&](const auto& entry) { return entry.second == asFloat32(value.get<double>()); }));
      ++checked;
    }
  }
  CHECK(seen["epoch/test_accuracy"].size() == 2);  // evaluated epochs only
  CHECK(checked > 60);
}
