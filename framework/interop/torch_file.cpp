// torch.save-compatible weights files (torch_file.hpp).
#include "framework/interop/torch_file.hpp"

#include <ATen/core/Dict.h>
#include <c10/util/Exception.h>
#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/jit/serialization/export.h>
#include <torch/csrc/jit/serialization/pickler.h>

#include <fcntl.h>
#include <unistd.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstdio>
#include <exception>
#include <functional>
#include <unordered_map>
#include <cstring>
#include <fstream>

#include "framework/core/errors.hpp"
#include "framework/core/strings.hpp"
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

uint64_t littleEndian(const std::string& bytes, size_t at, size_t n) {
  uint64_t v = 0;
  for (size_t i = n; i-- > 0;) v = (v << 8) | uint8_t(bytes[at + i]);
  return v;
}

// torch.save stores every record uncompressed. The zip reader would inflate
// a compressed one into memory whatever its size (a small file could claim
// gigabytes), so the central directory is read first and any record that
// is compressed, or larger than the file, refuses the file.
void checkZipRecords(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  const auto size = static_cast<uint64_t>(std::max<std::streamoff>(0, in.tellg()));
  const uint64_t tailBytes = std::min<uint64_t>(size, 22 + 65535);
  std::string tail(static_cast<size_t>(tailBytes), '\0');
  in.seekg(static_cast<std::streamoff>(size - tailBytes));
  in.read(tail.data(), static_cast<std::streamsize>(tailBytes));
  const auto bad = [&](const std::string& what) {
    fail<UsageError>("{}: not a readable torch.save archive: {}", path, what);
  };
  size_t eocd = std::string::npos;
  for (size_t i = tail.size() >= 22 ? tail.size() - 22 + 1 : 0; i-- > 0;) {
    if (tail.compare(i, 4, std::string("PK\x05\x06", 4)) == 0) {
      eocd = i;
      break;
    }
  }
  if (eocd == std::string::npos) bad("no zip end-of-directory record (a truncated file?)");
  uint64_t entries = littleEndian(tail, eocd + 10, 2);
  uint64_t dirBytes = littleEndian(tail, eocd + 12, 4);
  uint64_t dirOffset = littleEndian(tail, eocd + 16, 4);
  if (entries == 0xFFFF || dirBytes == 0xFFFFFFFF || dirOffset == 0xFFFFFFFF) {
    // Zip64: its end-of-directory record, found through the locator just before.
    if (eocd < 20 || tail.compare(eocd - 20, 4, std::string("PK\x06\x07", 4)) != 0) bad("a damaged zip64 directory");
    const uint64_t at = littleEndian(tail, eocd - 20 + 8, 8);
    if (at + 56 > size) bad("a damaged zip64 directory");
    std::string record(56, '\0');
    in.seekg(static_cast<std::streamoff>(at));
    in.read(record.data(), 56);
    if (!in || record.compare(0, 4, std::string("PK\x06\x06", 4)) != 0) bad("a damaged zip64 directory");
    entries = littleEndian(record, 32, 8);
    dirBytes = littleEndian(record, 40, 8);
    dirOffset = littleEndian(record, 48, 8);
  }
  if (dirOffset > size || dirBytes > size - dirOffset) bad("a zip directory outside the file");
  std::string dir(static_cast<size_t>(dirBytes), '\0');
  in.clear();
  in.seekg(static_cast<std::streamoff>(dirOffset));
  in.read(dir.data(), static_cast<std::streamsize>(dirBytes));
  if (!in) bad("the zip directory cannot be read");
  size_t pos = 0;
  for (uint64_t e = 0; e < entries; ++e) {
    if (pos + 46 > dir.size() || dir.compare(pos, 4, std::string("PK\x01\x02", 4)) != 0) bad("a damaged zip directory");
    const uint64_t method = littleEndian(dir, pos + 10, 2);
    uint64_t uncompressed = littleEndian(dir, pos + 24, 4);
    const size_t nameBytes = littleEndian(dir, pos + 28, 2), extraBytes = littleEndian(dir, pos + 30, 2),
                 commentBytes = littleEndian(dir, pos + 32, 2);
    if (pos + 46 + nameBytes + extraBytes + commentBytes > dir.size()) bad("a damaged zip directory");
    const std::string name = dir.substr(pos + 46, nameBytes);
    if (uncompressed == 0xFFFFFFFF) {
      // The zip64 extra field (id 1) holds the real size first.
      for (size_t x = pos + 46 + nameBytes; x + 4 <= pos + 46 + nameBytes + extraBytes;) {
        const uint64_t id = littleEndian(dir, x, 2), len = littleEndian(dir, x + 2, 2);
        if (id == 1 && len >= 8 && x + 4 + 8 <= dir.size()) uncompressed = littleEndian(dir, x + 4, 8);
        x += 4 + len;
      }
    }
    if (method != 0) {
      bad(fmt::format("record {} is compressed (method {}), which torch.save never does", printable(name), method));
    }
    if (uncompressed > size) bad(fmt::format("record {} claims {} bytes in a file of {}", printable(name), uncompressed, size));
    pos += 46 + nameBytes + extraBytes + commentBytes;
  }
}

}  // namespace

bool looksLikeZip(const std::string& path) { return firstBytes(path, 4) == std::string("PK\x03\x04", 4); }

namespace {

// A plain dict's pickle, as torch::pickle_save makes it but without tagging
// the dict with its type (torch.jit._pickle.restore_type_tag), which
// torch.load(weights_only=True) refuses: a plain dict, as Python's
// torch.save writes one. `storages`: the tensors whose storages the pickle
// names, the K-th as record data/K.
std::vector<char> picklePlainDict(const c10::Dict<std::string, at::Tensor>& dict, std::vector<at::Tensor>* storages) {
  std::vector<char> pickle;
  torch::jit::Pickler pickler([&](const char* data, size_t n) { pickle.insert(pickle.end(), data, data + n); },
                              /*tensor_table=*/nullptr, /*type_renamer=*/nullptr, /*memoized_class_types=*/nullptr,
                              /*get_tensor_id=*/nullptr, /*tag_aggregates=*/false);
  pickler.protocol();
  pickler.pushIValue(c10::IValue(dict));
  pickler.stop();
  *storages = pickler.tensorData();
  return pickle;
}

// PATH.tmp written through `records` (errors of the writer and of the disk
// become one line), synced and renamed to PATH; nothing at PATH otherwise.
void writeZipArchive(const std::string& path,
                     const std::function<void(caffe2::serialize::PyTorchStreamWriter&)>& records) {
  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail<UsageError>("{}: cannot create: {}", tmp, errnoText(errno));
  std::string failure;
  std::exception_ptr thrown;
  {
    caffe2::serialize::PyTorchStreamWriter writer([&](const void* data, size_t n) -> size_t {
      if (failure.empty()) {
        if (const int err = writeFully(fd, data, n)) failure = errnoText(err);
      }
      return failure.empty() ? n : 0;
    });
    try {
      records(writer);
      writer.writeEndOfFile();
    } catch (const c10::Error& e) {
      if (failure.empty()) failure = firstLine(e);
    } catch (...) {
      thrown = std::current_exception();
    }
  }
  if (!thrown && failure.empty() && ::fsync(fd) != 0) failure = errnoText(errno);
  if (::close(fd) != 0 && failure.empty()) failure = errnoText(errno);
  if (thrown || !failure.empty()) ::unlink(tmp.c_str());
  if (thrown) std::rethrow_exception(thrown);
  if (!failure.empty()) fail<std::runtime_error>("{}: cannot write: {}", tmp, failure);
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string why = errnoText(errno);
    ::unlink(tmp.c_str());
    fail<UsageError>("{}: cannot rename {} to it: {}", path, tmp, why);
  }
}

}  // namespace

void writeTorchStateDict(const std::string& path, const NamedTensors& tensors) {
  c10::Dict<std::string, at::Tensor> dict;
  for (const auto& [name, tensor] : tensors) {
    if (dict.contains(name)) fail<UsageError>("{}: tensor name {} given twice", path, name);
    dict.insert(name, tensor.detach().to(at::kCPU).contiguous());
  }
  // Tensors that share a storage (tied weights) share one record.
  std::vector<at::Tensor> storages;
  const std::vector<char> pickle = picklePlainDict(dict, &storages);
  writeZipArchive(path, [&](caffe2::serialize::PyTorchStreamWriter& writer) {
    torch::jit::writeArchiveAndTensors("data", pickle.data(), pickle.size(), storages, writer);
  });
}

void writeTorchStateDictStreamed(const std::string& path, const std::vector<TensorLayout>& layout,
                                 const TensorSource& tensor) {
  // The pickle names storages by key: stand-ins of each tensor's dtype and
  // size give it those keys without the data (allocated, never touched).
  c10::Dict<std::string, at::Tensor> dict;
  std::unordered_map<const c10::StorageImpl*, size_t> layoutOf;
  for (size_t i = 0; i < layout.size(); ++i) {
    if (dict.contains(layout[i].name)) fail<UsageError>("{}: tensor name {} given twice", path, layout[i].name);
    at::Tensor standIn = at::empty(layout[i].shape, at::TensorOptions().dtype(layout[i].dtype));
    layoutOf[standIn.storage().unsafeGetStorageImpl()] = i;
    dict.insert(layout[i].name, standIn);
  }
  std::vector<at::Tensor> storages;
  const std::vector<char> pickle = picklePlainDict(dict, &storages);
  writeZipArchive(path, [&](caffe2::serialize::PyTorchStreamWriter& writer) {
    // As writeArchiveAndTensors lays them out: data/K, then data.pkl.
    for (size_t k = 0; k < storages.size(); ++k) {
      const size_t i = layoutOf.at(storages[k].storage().unsafeGetStorageImpl());
      const at::Tensor t = tensor(i).detach().to(at::kCPU).contiguous();
      if (t.scalar_type() != layout[i].dtype || t.sizes().vec() != layout[i].shape) {
        fail<std::runtime_error>("{}: tensor {} came as {} [{}], where the layout says {} [{}]", path, layout[i].name,
                                 c10::toString(t.scalar_type()), fmt::join(t.sizes(), ", "),
                                 c10::toString(layout[i].dtype), fmt::join(layout[i].shape, ", "));
      }
      writer.writeRecord(fmt::format("data/{}", k), t.data_ptr(), static_cast<size_t>(t.numel()) * t.element_size());
    }
    writer.writeRecord("data.pkl", pickle.data(), pickle.size());
  });
}

WeightsFile readTorchStateDict(const std::string& path) {
  const std::string head = firstBytes(path, 4);
  if (head.size() >= 2 && uint8_t(head[0]) == 0x80 && uint8_t(head[1]) >= 2 && uint8_t(head[1]) <= 5) {
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
  checkZipRecords(path);
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
  } catch (const UsageError&) {
    throw;
  } catch (const std::bad_alloc&) {
    fail<UsageError>("{}: not a readable torch.save archive: it asks for more memory than there is", path);
  } catch (const std::exception& e) {
    // The zip reader's own failures (a version record that is no number: std::out_of_range).
    fail<UsageError>("{}: not a readable torch.save archive: {}", path, e.what());
  }
  return out;
}

}  // namespace ddp
