// Weights files by format, and a module's state in and out (weights_file.hpp).
#include "framework/interop/weights_file.hpp"

#include <torch/csrc/autograd/grad_mode.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <filesystem>
#include <map>
#include <set>
#include <string_view>

#include "framework/core/errors.hpp"
#include "framework/core/strings.hpp"
#include "framework/interop/safetensors.hpp"
#include "framework/interop/torch_file.hpp"

namespace ddp {
namespace {

std::string shapeText(const at::Tensor& t) {
  if (t.dim() > 8) return fmt::format("[{} dimensions]", t.dim());
  return fmt::format("[{}]", fmt::join(t.sizes(), ", "));
}

// Names longer than this take no part in the prefix hint (a hostile file's
// megabyte names would make it slow), and are cut in messages.
constexpr size_t kLongName = 1024;

// At most `keep` items, then how many more.
std::string someOf(const std::vector<std::string>& items, size_t keep = 6) {
  if (items.size() <= keep) return fmt::format("{}", fmt::join(items, ", "));
  return fmt::format("{}, ... ({} in all)", fmt::join(items.begin(), items.begin() + static_cast<std::ptrdiff_t>(keep), ", "),
                     items.size());
}

// The prefix that, taken off the file's names (or put in front of them),
// makes most of them the module's: "" when there is none.
std::pair<std::string, bool> prefixDifference(const std::set<std::string, std::less<>>& expected,
                                              const std::vector<std::string>& unexpected) {
  std::map<std::string, int> votes;  // prefix -> names it fixes; bool: the file has it
  for (const std::string& name : unexpected) {
    if (name.size() > kLongName) continue;
    const std::string_view view(name);
    for (size_t dot = name.find('.'); dot != std::string::npos; dot = name.find('.', dot + 1)) {
      if (expected.count(view.substr(dot + 1))) ++votes["-" + name.substr(0, dot + 1)];
    }
    for (const std::string& want : expected) {
      if (want.size() > name.size() && want.compare(want.size() - name.size(), name.size(), name) == 0 &&
          want[want.size() - name.size() - 1] == '.') {
        ++votes["+" + want.substr(0, want.size() - name.size())];
      }
    }
  }
  std::string best;
  int most = 0;
  for (const auto& [prefix, count] : votes) {
    if (count > most) best = prefix, most = count;
  }
  if (best.empty()) return {"", false};
  return {best.substr(1), best[0] == '-'};
}

}  // namespace

WeightsFormat parseWeightsFormat(const std::string& name) {
  if (name == "safetensors") return WeightsFormat::Safetensors;
  if (name == "torch") return WeightsFormat::Torch;
  fail<UsageError>("--format {}: unknown weights format; known: safetensors, torch", name);
}

std::string weightsFormatName(WeightsFormat format) {
  return format == WeightsFormat::Safetensors ? "safetensors" : "torch";
}

void writeWeightsFile(const std::string& path, WeightsFormat format, const NamedTensors& tensors,
                      const std::map<std::string, std::string>& metadata) {
  if (format == WeightsFormat::Safetensors) {
    writeSafetensors(path, tensors, metadata);
  } else {
    writeTorchStateDict(path, tensors);
  }
}

void writeWeightsFileStreamed(const std::string& path, WeightsFormat format, const std::vector<TensorLayout>& layout,
                              const TensorSource& tensor, const std::map<std::string, std::string>& metadata) {
  if (format == WeightsFormat::Safetensors) {
    writeSafetensorsStreamed(path, layout, tensor, metadata);
  } else {
    writeTorchStateDictStreamed(path, layout, tensor);
  }
}

WeightsFile readWeightsFile(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) fail<UsageError>("{}: no such file", path);
  if (looksLikeZip(path)) return readTorchStateDict(path);
  if (looksLikeSafetensors(path)) return readSafetensors(path);
  // Not recognised: the torch reader names a legacy torch.save file, the
  // safetensors reader says what is wrong with a broken header.
  const std::string extension = std::filesystem::path(path).extension().string();
  if (extension == ".safetensors") return readSafetensors(path);
  return readTorchStateDict(path);
}

NamedTensors moduleState(const torch::nn::Module& module) {
  NamedTensors out;
  for (const auto& item : module.named_parameters(/*recurse=*/true)) out.emplace_back(item.key(), item.value());
  for (const auto& item : module.named_buffers(/*recurse=*/true)) out.emplace_back(item.key(), item.value());
  return out;
}

void loadModuleState(torch::nn::Module& module, const NamedTensors& tensors, const std::string& where) {
  std::map<std::string, at::Tensor> targets;
  for (auto& [name, tensor] : moduleState(module)) targets.emplace(name, tensor);
  std::set<std::string, std::less<>> expected;
  for (const auto& entry : targets) expected.insert(entry.first);
  std::map<std::string, at::Tensor> given;
  std::vector<std::string> unexpected, wrongShape, duplicated;
  for (const auto& [name, tensor] : tensors) {
    if (!given.emplace(name, tensor).second) duplicated.push_back(printable(name));
    const auto it = targets.find(name);
    if (it == targets.end()) {
      unexpected.push_back(name);
    } else if (it->second.sizes() != tensor.sizes()) {
      wrongShape.push_back(fmt::format("{} (file {}, model {})", name, shapeText(tensor), shapeText(it->second)));
    }
  }
  std::vector<std::string> missing;
  for (const auto& entry : targets) {
    if (!given.count(entry.first)) missing.push_back(entry.first);
  }
  if (missing.empty() && unexpected.empty() && wrongShape.empty() && duplicated.empty()) {
    torch::NoGradGuard noGrad;
    for (auto& [name, target] : targets) target.copy_(given.at(name));
    return;
  }
  std::vector<std::string> parts;
  if (!missing.empty()) parts.push_back(fmt::format("missing {}: {}", missing.size(), someOf(missing)));
  if (!unexpected.empty()) {
    // Names from the file: escaped and cut (printable reads at most its limit of each).
    std::vector<std::string> shown;
    for (const std::string& name : unexpected) shown.push_back(printable(name));
    parts.push_back(fmt::format("unexpected {}: {}", unexpected.size(), someOf(shown)));
  }
  if (!wrongShape.empty()) parts.push_back(fmt::format("wrong shape {}: {}", wrongShape.size(), someOf(wrongShape, 4)));
  if (!duplicated.empty()) parts.push_back(fmt::format("given twice: {}", someOf(duplicated)));
  std::string hint =
      " HINT: the file must hold the state_dict of the model the experiment builds (python/ddp_models.py builds "
      "the same modules from a run's config.json)";
  const auto [prefix, fileHasIt] = prefixDifference(expected, unexpected);
  if (!prefix.empty() && fileHasIt) {
    const char* source = prefix == "module." ? " (DistributedDataParallel's wrapper)"
                         : prefix == "_orig_mod." ? " (torch.compile's wrapper)"
                                                  : "";
    hint = fmt::format(
        " HINT: the file's names start with \"{}\"{} where the model's do not: save it without the prefix, e.g. "
        "torch.save({{k.removeprefix(\"{}\"): v for k, v in sd.items()}}, PATH)",
        prefix, source, prefix);
  } else if (!prefix.empty()) {
    hint = fmt::format(" HINT: the model's names start with \"{}\" where the file's do not: did you mean the state_dict "
                       "of the whole model rather than of one part?",
                       prefix);
  }
  fail<UsageError>("{}: does not fit the model: {}.{}", where, fmt::join(parts, "; "), hint);
}

}  // namespace ddp
