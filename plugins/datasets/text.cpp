#include "plugins/datasets/text.hpp"

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <cerrno>
#include <fstream>
#include <iterator>
#include <memory>

#include "framework/core/system.hpp"
#include "plugins/common.hpp"
#include "plugins/datasets/files.hpp"

namespace ddp::plugins {

namespace {

// The windows of one split: positions [begin, end) of the shared token array.
class TextWindows final : public Dataset {
 public:
  TextWindows(std::shared_ptr<const std::vector<uint8_t>> ids, int64_t begin, int64_t end, int64_t block,
              int64_t stride)
      : ids_(std::move(ids)), begin_(begin), block_(block), stride_(stride) {
    const int64_t tokens = end - begin;
    size_ = tokens < block + 1 ? 0 : (tokens - block - 1) / stride + 1;
  }

  int64_t size() const override { return size_; }

  Batch get(c10::ArrayRef<int64_t> indices) const override {
    const auto n = static_cast<int64_t>(indices.size());
    at::Tensor inputs = at::empty({n, block_}, at::kLong);
    at::Tensor targets = at::empty({n, block_}, at::kLong);
    int64_t* x = inputs.data_ptr<int64_t>();
    int64_t* y = targets.data_ptr<int64_t>();
    const uint8_t* ids = ids_->data();
    for (int64_t i = 0; i < n; ++i) {
      const int64_t k = indices[static_cast<size_t>(i)];
      TORCH_CHECK(k >= 0 && k < size_, "sample index ", k, " out of range for ", size_, " windows");
      const uint8_t* window = ids + begin_ + k * stride_;
      for (int64_t t = 0; t < block_; ++t) {
        x[i * block_ + t] = window[t];
        y[i * block_ + t] = window[t + 1];
      }
    }
    return {inputs, targets};
  }

 private:
  std::shared_ptr<const std::vector<uint8_t>> ids_;
  int64_t begin_, block_, stride_, size_ = 0;
};

}  // namespace

ByteVocabulary ByteVocabulary::of(std::string_view text) {
  std::array<bool, 256> seen{};
  for (char c : text) seen[static_cast<unsigned char>(c)] = true;
  ByteVocabulary vocab;
  for (int b = 0; b < 256; ++b) {
    if (!seen[static_cast<size_t>(b)]) continue;
    vocab.bytes_.push_back(static_cast<unsigned char>(b));
    vocab.ids_[static_cast<size_t>(b)] = static_cast<int>(vocab.bytes_.size());
  }
  return vocab;
}

ByteVocabulary ByteVocabulary::fromJson(const std::string& json, const std::string& where) {
  const auto doc = nlohmann::json::parse(json, nullptr, /*allow_exceptions=*/false);
  if (!doc.is_object() || doc.value("kind", "") != "bytes" || !doc.contains("tokens") || !doc["tokens"].is_array() ||
      doc["tokens"].empty()) {
    fail<UsageError>("{}: expected {{\"kind\": \"bytes\", \"tokens\": [byte, ...]}}, as the text dataset writes it",
                     where);
  }
  ByteVocabulary vocab;
  for (const auto& token : doc["tokens"]) {
    if (!token.is_number_integer() || token.get<int64_t>() < 0 || token.get<int64_t>() > 255 ||
        vocab.ids_[token.get<size_t>()] != 0) {
      fail<UsageError>("{}: token {} is not a distinct byte value 0..255", where, token.dump());
    }
    vocab.bytes_.push_back(static_cast<unsigned char>(token.get<int>()));
    vocab.ids_[token.get<size_t>()] = static_cast<int>(vocab.bytes_.size());
  }
  return vocab;
}

std::string ByteVocabulary::toJson() const {
  nlohmann::ordered_json doc;
  doc["kind"] = "bytes";
  doc["tokens"] = bytes_;
  return doc.dump() + "\n";
}

std::vector<int64_t> ByteVocabulary::encode(std::string_view text) const {
  std::vector<int64_t> ids;
  ids.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    const auto b = static_cast<unsigned char>(text[i]);
    const int id = ids_[b];
    if (id == 0) {
      fail<UsageError>("byte {} ({}) at offset {} is not in the vocabulary of {} bytes the model was trained on", b,
                       b >= 32 && b < 127 ? fmt::format("'{}'", static_cast<char>(b)) : std::string("unprintable"),
                       i, bytes_.size());
    }
    ids.push_back(id - 1);
  }
  return ids;
}

std::string ByteVocabulary::decode(const std::vector<int64_t>& ids) const {
  std::string text;
  text.reserve(ids.size());
  for (int64_t id : ids) {
    TORCH_CHECK(id >= 0 && id < size(), "token id ", id, " out of range for a vocabulary of ", size());
    text.push_back(static_cast<char>(bytes_[static_cast<size_t>(id)]));
  }
  return text;
}

DatasetSplits loadText(const Params& params, const DatasetContext& context) {
  const std::string path = resolveDataPath("path", params.getString("path"), context);
  const int64_t block = params.getInt("block_size");
  const int64_t stride = params.getInt("stride") == 0 ? block : params.getInt("stride");
  const double valFraction = params.getDouble("val_fraction");
  requireBelow(kDataset, "val_fraction", valFraction, 1.0);
  const int64_t maxBytes = params.getInt("max_bytes");

  std::ifstream in(path, std::ios::binary);
  if (!in) fail<UsageError>("dataset text: '{}' cannot be opened: {}", path, errnoText(errno));
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (maxBytes > 0 && static_cast<int64_t>(text.size()) > maxBytes) text.resize(static_cast<size_t>(maxBytes));
  if (text.empty()) fail<UsageError>("dataset text: '{}' is empty", path);

  const ByteVocabulary vocab = ByteVocabulary::of(text);
  auto ids = std::make_shared<std::vector<uint8_t>>();
  ids->reserve(text.size());
  for (int64_t id : vocab.encode(text)) ids->push_back(static_cast<uint8_t>(id));
  const auto n = static_cast<int64_t>(ids->size());
  const auto cut = n - static_cast<int64_t>(static_cast<double>(n) * valFraction);
  for (const auto& [name, tokens] : {std::pair<const char*, int64_t>{"training", cut}, {"validation", n - cut}}) {
    if (tokens < block + 1) {
      fail<UsageError>(
          "dataset text: the {} part of '{}' has {} tokens, fewer than one window of block_size {} + 1. HINT: a "
          "smaller block_size{}, or a longer text",
          name, path, tokens, block, std::string(name) == "validation" ? " or a larger val_fraction" : "");
    }
  }

  DatasetSplits splits;
  splits.train = std::make_shared<TextWindows>(ids, 0, cut, block, stride);
  splits.test = std::make_shared<TextWindows>(ids, cut, n, block, stride);
  splits.task = Task::NextToken;
  splits.vocabSize = vocab.size();
  splits.numClasses = vocab.size();
  splits.sampleShape = {block};
  splits.numFeatures = block;
  splits.runFiles["vocab.json"] = vocab.toJson();
  return splits;
}

}  // namespace ddp::plugins
