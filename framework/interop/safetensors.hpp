// safetensors files (the format of Hugging Face and most tools): written and
// read without a new dependency.
//
// Contract
// - Layout: 8 bytes, the header's length N (little-endian uint64); N bytes of
//   JSON, {"NAME": {"dtype": "F32", "shape": [..], "data_offsets": [b, e]},
//   ..., "__metadata__": {"key": "value"}}; then the tensors' raw
//   little-endian bytes, offsets counted from the end of the header.
// - writeSafetensors: the tensors in the order given (each made contiguous
//   and moved to the CPU), the header padded with spaces to a multiple of 8
//   bytes, the file written to PATH.tmp and renamed (no half-written file
//   under PATH). dtypes: F64, F32, F16, BF16, I64, I32, I16, I8, U8, BOOL.
// - readSafetensors: every tensor, owning its memory, and __metadata__. A
//   file that is not one fails with UsageError naming the file and what is
//   wrong, before reading anything its header points to: shorter than 8
//   bytes; a header length beyond the file or above 100 MB; a header that
//   is not a JSON object; an entry without dtype, shape or data_offsets; a
//   dtype outside the list; offsets outside the data, reversed, or not
//   matching shape x dtype size; two tensors overlapping. Nothing is read
//   past the file's end.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "framework/interop/named_tensors.hpp"

namespace ddp {

void writeSafetensors(const std::string& path, const NamedTensors& tensors,
                      const std::map<std::string, std::string>& metadata = {});

// The same file, from tensors produced one at a time in the layout's order
// (`tensor(i)` must match layout[i]'s dtype and shape, else
// std::runtime_error naming it and no file): the header first, then each
// tensor's bytes as it comes, so at most one tensor is held at a time.
void writeSafetensorsStreamed(const std::string& path, const std::vector<TensorLayout>& layout,
                              const TensorSource& tensor, const std::map<std::string, std::string>& metadata = {});

WeightsFile readSafetensors(const std::string& path);

// The header alone, checked as readSafetensors checks it (the same
// UsageErrors), for readers that take byte ranges (sharded checkpoints):
// each tensor's dtype, shape and absolute byte range [begin, end) in the
// file, in file order.
struct SafetensorsEntry {
  std::string name;
  at::ScalarType type;
  std::vector<int64_t> sizes;
  uint64_t begin = 0, end = 0;
};
struct SafetensorsHeader {
  std::vector<SafetensorsEntry> tensors;
  std::map<std::string, std::string> metadata;
  uint64_t fileBytes = 0;
};
SafetensorsHeader readSafetensorsHeader(const std::string& path);

// The format's dtype names ("F32", ...) and back (nullopt for another).
std::string safetensorsDtypeName(at::ScalarType type);
std::optional<at::ScalarType> safetensorsDtype(const std::string& name);

// Reads `bytes` bytes at `offset` of the file; a UsageError naming the file
// when it cannot be opened or ends first (a truncated file).
void readFileRange(const std::string& path, void* data, size_t bytes, uint64_t offset);

// Whether the file's first bytes look like safetensors (a plausible header
// length followed by '{'); false when it cannot be read.
bool looksLikeSafetensors(const std::string& path);

}  // namespace ddp
