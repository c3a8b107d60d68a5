// torch.save-compatible weights files (torch_file.hpp).
#include "framework/interop/torch_file.hpp"

#include <caffe2/serialize/inline_container.h>
#include <c10/util/Exception.h>
#include <torch/csrc/jit/serialization/pickle.h>
#include <ATen/core/Dict.h>

#include <fmt/format.h>

#include <cstdio>
#include <cstring>
#include <fstream>

#include "framework/core/errors.hpp"
#include "framework/core/system.hpp"
#include "framework/interop/state_dict_unpickler.hpp"

namespace ddp {
namespace {

std::string firstBytes(const std::string& path, size_t n) {
  std::ifstream in(path, std::ios::binary);
  std::string head(n, '\0');
  in.read(head.data(), static_cast<std::streamsize>(n));
  head.resize(static_cast<size_t>(std::max<std::streamsize>(0, in.gcount())));
  return head;
}

// LibTorch's messages carry a backtrace after the first line.
std::string firstLine(const c10::Error& e) {
  const std::string what = e.what_without_backtrace();
  return what.substr(0, what.find('\n'));
}

}  // namespace

bool looksLikeZip(const std::string& path) { return firstBytes(path, 4) == std::string("PK\x03\x04", 4); }

void writeTorchStateDict(const std::string& path, const NamedTensors& tensors) {
  c10::Dict<std::string, at::Tensor> dict;
  for (const auto& [name, tensor] : tensors) {
    if (dict.contains(name)) fail<UsageError>("{}: tensor name {} given twice", path, name);
    dict.insert(name, tensor.detach().to(at::kCPU).contiguous());
  }
  const std::vector<char> bytes = torch::jit::pickle_save(c10::IValue(dict));
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) fail<UsageError>("{}: cannot create: {}", tmp, errnoText(errno));
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    out.flush();
    if (!out) fail<std::runtime_error>("{}: cannot write: {}", tmp, errnoText(errno));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    fail<UsageError>("{}: cannot rename {} to it: {}", path, tmp, errnoText(errno));
  }
}

WeightsFile readTorchStateDict(const std::string& path) {
  const std::string head = firstBytes(path, 4);
  if (head.size() >= 2 && uint8_t(head[0]) == 0x80 && uint8_t(head[1]) == 0x02) {
    fail<UsageError>("{}: a torch.save file of the legacy format (before PyTorch 1.6, or "
                     "_use_new_zipfile_serialization=False), which is not read here. HINT: convert it in Python: "
                     "torch.save(torch.load(\"{}\"), \"new.pt\")",
                     path, path);
  }
  if (head != std::string("PK\x03\x04", 4)) {
    fail<UsageError>("{}: neither a safetensors file nor a torch.save zip archive. HINT: save the weights in "
                     "Python with torch.save(model.state_dict(), PATH)",
                     path);
  }
  WeightsFile out;
  try {
    caffe2::serialize::PyTorchStreamReader reader(path);
    if (!reader.hasRecord("data.pkl")) {
      fail<UsageError>("{}: a zip archive without data.pkl: not written by torch.save. HINT: save the weights in "
                       "Python with torch.save(model.state_dict(), PATH)",
                       path);
    }
    auto [pickleData, pickleSize] = reader.getRecord("data.pkl");
    const std::string pickle(static_cast<const char*>(pickleData.get()), pickleSize);
    const StorageLoader loadStorage = [&](const std::string& key, at::ScalarType dtype, int64_t numel) {
      const std::string record = "data/" + key;
      if (key.find('/') != std::string::npos || !reader.hasRecord(record)) {
        fail<UsageError>("{}: storage {} has no record {} in the archive", path, key, record);
      }
      auto [data, size] = reader.getRecord(record);
      const uint64_t need = static_cast<uint64_t>(numel) * c10::elementSize(dtype);
      if (size < need) {
        fail<UsageError>("{}: storage {} holds {} bytes, {} elements of {} need {}", path, key, size, numel,
                         c10::toString(dtype), need);
      }
      at::Tensor storage = at::empty({numel}, at::TensorOptions().dtype(dtype));
      if (need > 0) std::memcpy(storage.data_ptr(), data.get(), static_cast<size_t>(need));
      return storage;
    };
    out.tensors = unpickleStateDict(pickle, loadStorage, path);
  } catch (const c10::Error& e) {
    fail<UsageError>("{}: not a readable torch.save archive: {}", path, firstLine(e));
  }
  return out;
}

}  // namespace ddp
