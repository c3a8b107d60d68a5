// The `text` dataset: next-token prediction over a plain-text corpus, with
// its bytes as the vocabulary.
//
// Contract
// - The corpus: the file at `path` (at most `max_bytes` of it; 0: all),
//   read as bytes, so any encoding works and UTF-8 characters become their
//   bytes. The vocabulary is the distinct bytes that occur, in byte order;
//   token id i stands for the i-th of them.
// - Split by position, not by shuffling windows: the first 1 - val_fraction
//   of the tokens train, the rest validate, so no validation text is ever
//   inside a training window.
// - Sample k of a split is the window starting at k * stride: inputs the
//   `block_size` tokens there, targets the same tokens shifted by one
//   (int64 [T] each). Windows are cut from the one token array when asked,
//   never materialised; a split holds (tokens - block_size - 1) / stride + 1
//   windows. stride 0 means block_size (windows that do not overlap).
// - The run folder gets vocab.json: {"kind": "bytes", "tokens": [byte, ...]},
//   what `ddp-run --sample` needs to turn a prompt into ids and back.
// - Errors (UsageError, one line): an empty file; a split too short for one
//   window (HINT: a smaller block_size or val_fraction); a vocab.json that
//   is not one of these.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "framework/experiment/plugin_registry.hpp"

namespace ddp::plugins {

class ByteVocabulary {
 public:
  // The distinct bytes of `text`, in byte order.
  static ByteVocabulary of(std::string_view text);
  // vocab.json's contents; `where` names the file in errors.
  static ByteVocabulary fromJson(const std::string& json, const std::string& where);
  std::string toJson() const;

  int64_t size() const { return static_cast<int64_t>(bytes_.size()); }
  // UsageError naming the first byte that is not in the vocabulary.
  std::vector<int64_t> encode(std::string_view text) const;
  std::string decode(const std::vector<int64_t>& ids) const;

 private:
  std::vector<unsigned char> bytes_;  // id -> byte
  std::array<int, 256> ids_{};        // byte -> id + 1 (0: not in it)
};

DatasetSplits loadText(const Params& params, const DatasetContext& context);

}  // namespace ddp::plugins
