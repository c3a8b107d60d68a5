#include "plugins/datasets/npy_file.hpp"

#include <ATen/ATen.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <limits>
#include <map>
#include <optional>

#include "framework/core/errors.hpp"
#include "framework/core/strings.hpp"
#include "framework/core/system.hpp"

namespace ddp::plugins {

namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMagicSize = 6;
constexpr const char* kSupported = "float32 '<f4', float64 '<f8', uint8 '|u1', int32 '<i4', int64 '<i8'";

// An open file descriptor, closed when it goes.
class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

// Up to `n` bytes at `offset`; fewer only at the end of the file.
std::string readAt(const std::string& path, int fd, size_t offset, size_t n) {
  std::string out(n, '\0');
  size_t done = 0;
  while (done < n) {
    ssize_t got = ::pread(fd, out.data() + done, n - done, static_cast<off_t>(offset + done));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) fail<UsageError>("{}: cannot read: {}", path, errnoText(errno));
    if (got == 0) break;
    done += static_cast<size_t>(got);
  }
  out.resize(done);
  return out;
}

// ---- the header: a Python dict literal ---------------------------------------------

// One value of the header dict: a string, a bool, a tuple of integers, or
// something else (a list: the descr of a structured dtype).
struct HeaderValue {
  enum Kind { String, Bool, IntTuple, List } kind = String;
  std::string text;
  bool flag = false;
  std::vector<int64_t> ints;
};

// Parses the literal; a malformed one is a UsageError naming the file, what
// was expected and the column.
class HeaderParser {
 public:
  HeaderParser(const std::string& path, const std::string& text) : path_(path), text_(text) {}

  std::map<std::string, HeaderValue> parse() {
    std::map<std::string, HeaderValue> dict;
    skipBlanks();
    expect('{');
    for (;;) {
      skipBlanks();
      if (peek() == '}') {
        ++pos_;
        break;
      }
      std::string key = parseString();
      skipBlanks();
      expect(':');
      skipBlanks();
      if (dict.count(key)) malformed(fmt::format("the key '{}' appears twice", key));
      dict[key] = parseValue();
      skipBlanks();
      if (peek() == ',') {
        ++pos_;
      } else if (peek() != '}') {
        malformed("expected ',' or '}'");
      }
    }
    skipBlanks();
    if (pos_ != text_.size()) malformed("text after the closing '}'");
    return dict;
  }

  [[noreturn]] void malformed(const std::string& what) const {
    std::string shown = text_;
    while (!shown.empty() && (shown.back() == ' ' || shown.back() == '\n')) shown.pop_back();
    for (char& c : shown) {
      if (c == '\n' || c == '\r' || c == '\t') c = ' ';
    }
    if (shown.size() > 160) shown = shown.substr(0, 160) + "...";
    fail<UsageError>("{}: malformed .npy header: {} at character {} of {}. HINT: write the file with numpy.save",
                     path_, what, pos_ + 1, shown);
  }

 private:
  char peek() const { return pos_ < text_.size() ? text_[pos_] : '\0'; }

  void skipBlanks() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\n' || text_[pos_] == '\r' ||
                                   text_[pos_] == '\t')) {
      ++pos_;
    }
  }

  void expect(char c) {
    if (peek() != c) malformed(fmt::format("expected '{}'", c));
    ++pos_;
  }

  std::string parseString() {
    const char quote = peek();
    if (quote != '\'' && quote != '"') malformed("expected a quoted string");
    ++pos_;
    std::string out;
    for (;;) {
      if (pos_ >= text_.size()) malformed("a string without its closing quote");
      char c = text_[pos_++];
      if (c == quote) break;
      if (c == '\\') {
        if (pos_ >= text_.size()) malformed("a string without its closing quote");
        c = text_[pos_++];
      }
      out += c;
    }
    return out;
  }

  int64_t parseInt() {
    const size_t start = pos_;
    int64_t value = 0;
    while (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9') {
      const int digit = text_[pos_] - '0';
      if (value > (std::numeric_limits<int64_t>::max() - digit) / 10) malformed("a dimension too large");
      value = value * 10 + digit;
      ++pos_;
    }
    if (pos_ == start) malformed("expected a non-negative integer");
    if (peek() == 'L') ++pos_;  // written by Python 2's repr of a long
    return value;
  }

  HeaderValue parseValue() {
    HeaderValue v;
    const char c = peek();
    if (c == '\'' || c == '"') {
      v.kind = HeaderValue::String;
      v.text = parseString();
    } else if (text_.compare(pos_, 4, "True") == 0) {
      v.kind = HeaderValue::Bool;
      v.flag = true;
      pos_ += 4;
    } else if (text_.compare(pos_, 5, "False") == 0) {
      v.kind = HeaderValue::Bool;
      pos_ += 5;
    } else if (c == '(') {
      v.kind = HeaderValue::IntTuple;
      ++pos_;
      for (;;) {
        skipBlanks();
        if (peek() == ')') {
          ++pos_;
          break;
        }
        v.ints.push_back(parseInt());
        skipBlanks();
        if (peek() == ',') {
          ++pos_;
        } else if (peek() != ')') {
          malformed("expected ',' or ')' in the shape");
        }
      }
    } else if (c == '[') {
      // A structured dtype's descr: a list of fields. Skipped to its end.
      v.kind = HeaderValue::List;
      int depth = 0;
      do {
        const char d = peek();
        if (d == '\0') malformed("a list without its closing ']'");
        if (d == '\'' || d == '"') {
          v.text += parseString();
          continue;
        }
        if (d == '[' || d == '(') ++depth;
        if (d == ']' || d == ')') --depth;
        ++pos_;
      } while (depth > 0);
    } else {
      malformed("expected a string, True, False or a tuple");
    }
    return v;
  }

  const std::string& path_;
  const std::string& text_;
  size_t pos_ = 0;
};

// ---- dtypes -------------------------------------------------------------------------

// The dtype a descr names, or nullopt with `why` saying what it is instead.
std::optional<at::ScalarType> dtypeOf(const std::string& descr, std::string* what) {
  if (descr.size() < 2) {
    *what = "an unknown dtype";
    return std::nullopt;
  }
  char order = descr[0];
  std::string rest = descr.substr(1);
  if (order != '<' && order != '>' && order != '|' && order != '=') {
    order = '=';
    rest = descr;
  }
  const char kind = rest[0];
  const std::string size = rest.substr(1);
  if (kind == 'O') {
    *what = "an object array: pickled Python objects, not numbers";
    return std::nullopt;
  }
  std::optional<at::ScalarType> type;
  std::string name;
  if (kind == 'f' && size == "4") type = at::kFloat, name = "float32";
  if (kind == 'f' && size == "8") type = at::kDouble, name = "float64";
  if (kind == 'u' && size == "1") type = at::kByte, name = "uint8";
  if (kind == 'i' && size == "4") type = at::kInt, name = "int32";
  if (kind == 'i' && size == "8") type = at::kLong, name = "int64";
  // One byte has no order; wider types must be little-endian (as this
  // machine: '=' is native).
  if (type && (size == "1" || order == '<' || order == '=')) return type;
  if (type) {
    *what = "big-endian " + name;
    return std::nullopt;
  }
  static const std::map<std::string, std::string> known = {
      {"f2", "float16"}, {"f16", "float128"}, {"i1", "int8"},      {"i2", "int16"},      {"u2", "uint16"},
      {"u4", "uint32"},  {"u8", "uint64"},    {"b1", "bool"},      {"c8", "complex64"},  {"c16", "complex128"},
      {"V", "void"},     {"S", "bytes"},      {"U", "str"},        {"M8", "datetime64"}, {"m8", "timedelta64"}};
  auto it = known.find(rest);
  if (it == known.end() && !rest.empty()) it = known.find(rest.substr(0, 1));
  if (it == known.end() && rest.size() > 2) it = known.find(rest.substr(0, 2));
  *what = it != known.end() ? it->second : "an unknown dtype";
  if (order == '>' && it != known.end() && size != "1") *what = "big-endian " + *what;
  return std::nullopt;
}

}  // namespace

std::string npyShapeText(const std::vector<int64_t>& shape) {
  if (shape.size() == 1) return fmt::format("({},)", shape[0]);
  return "(" + joinNames(shape) + ")";
}

std::string npyTypeName(at::ScalarType dtype) {
  switch (dtype) {
    case at::kFloat:
      return "float32";
    case at::kDouble:
      return "float64";
    case at::kByte:
      return "uint8";
    case at::kInt:
      return "int32";
    case at::kLong:
      return "int64";
    default:
      return c10::toString(dtype);
  }
}

NpyArray readNpy(const std::string& path) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
  fail<UsageError>("{}: .npy files are read on little-endian machines only", path);
#endif
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) fail<UsageError>("{}: cannot open: {}", path, errnoText(errno));
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) fail<UsageError>("{}: cannot stat: {}", path, errnoText(errno));
  if (!S_ISREG(st.st_mode)) fail<UsageError>("{}: not a regular file", path);
  const auto fileSize = static_cast<uint64_t>(st.st_size);

  // Magic and version.
  const std::string prelude = readAt(path, fd.get(), 0, 12);
  if (prelude.size() < kMagicSize || prelude.compare(0, kMagicSize, kMagic, kMagicSize) != 0) {
    if (prelude.compare(0, 4, "PK\x03\x04", 4) == 0) {
      fail<UsageError>(
          "{}: an .npz archive (a zip of arrays), not an .npy file. HINT: save each array on its own with "
          "numpy.save, e.g. numpy.save('x.npy', numpy.load('{}')['x'])",
          path, path);
    }
    fail<UsageError>(
        "{}: not an .npy file (it does not start with the .npy magic \\x93NUMPY). HINT: write it with "
        "numpy.save(path, array)",
        path);
  }
  if (prelude.size() < 8) fail<UsageError>("{}: truncated .npy file: it ends inside the version bytes", path);
  NpyArray array;
  array.versionMajor = static_cast<unsigned char>(prelude[6]);
  array.versionMinor = static_cast<unsigned char>(prelude[7]);
  if (array.versionMinor != 0 || array.versionMajor < 1 || array.versionMajor > 3) {
    fail<UsageError>(
        "{}: .npy format version {}.{} is not supported (1.0, 2.0 and 3.0 are). HINT: write it with numpy.save, "
        "or numpy.lib.format.write_array(f, array, version=(1, 0))",
        path, array.versionMajor, array.versionMinor);
  }
  const size_t lengthBytes = array.versionMajor == 1 ? 2 : 4;
  if (prelude.size() < 8 + lengthBytes) {
    fail<UsageError>("{}: truncated .npy file: it ends inside the header length ({} bytes)", path, fileSize);
  }
  uint64_t headerLength = 0;
  for (size_t i = 0; i < lengthBytes; ++i) {
    headerLength |= static_cast<uint64_t>(static_cast<unsigned char>(prelude[8 + i])) << (8 * i);
  }
  const uint64_t headerStart = 8 + lengthBytes;
  const uint64_t dataOffset = headerStart + headerLength;
  if (dataOffset > fileSize) {
    fail<UsageError>("{}: truncated .npy header: it says {} bytes, the file ends {} bytes into it", path,
                     headerLength, fileSize - headerStart);
  }

  // The header dict.
  const std::string header = readAt(path, fd.get(), headerStart, headerLength);
  HeaderParser parser(path, header);
  const auto dict = parser.parse();
  for (const char* key : {"descr", "fortran_order", "shape"}) {
    if (!dict.count(key)) parser.malformed(fmt::format("no '{}' key", key));
  }
  for (const auto& [key, value] : dict) {
    if (key != "descr" && key != "fortran_order" && key != "shape") {
      parser.malformed(fmt::format("an unknown key '{}'", key));
    }
  }
  const HeaderValue& descr = dict.at("descr");
  const HeaderValue& fortran = dict.at("fortran_order");
  const HeaderValue& shape = dict.at("shape");
  if (fortran.kind != HeaderValue::Bool) parser.malformed("'fortran_order' is not True or False");
  if (shape.kind != HeaderValue::IntTuple) parser.malformed("'shape' is not a tuple of integers");
  if (descr.kind == HeaderValue::List) {
    fail<UsageError>(
        "{}: a structured dtype (a record array with named fields) is not supported; supported: {}. HINT: save "
        "each field as its own array",
        path, kSupported);
  }
  if (descr.kind != HeaderValue::String) parser.malformed("'descr' is not a string");
  array.descr = descr.text;
  array.shape = shape.ints;

  std::string what;
  const auto dtype = dtypeOf(array.descr, &what);
  if (!dtype) {
    if (what.rfind("an object array", 0) == 0) {
      fail<UsageError>(
          "{}: dtype '{}' is {}. HINT: allow_pickle data cannot be read; save a numeric array, e.g. "
          "numpy.save(path, numpy.asarray(a, dtype=numpy.float32))",
          path, array.descr, what);
    }
    fail<UsageError>("{}: dtype '{}' ({}) is not supported; supported: {}. HINT: convert before saving, e.g. "
                     "numpy.save(path, a.astype(numpy.float32))",
                     path, array.descr, what, kSupported);
  }
  array.dtype = *dtype;
  if (fortran.flag && array.shape.size() > 1) {
    fail<UsageError>(
        "{}: the array is in Fortran order (fortran_order: True); only C order is read. HINT: save "
        "numpy.ascontiguousarray(a) instead of a",
        path);
  }

  // The data: the shape's count of elements right after the header.
  const auto itemSize = static_cast<uint64_t>(c10::elementSize(array.dtype));
  uint64_t count = 1;
  for (int64_t d : array.shape) {
    const auto dim = static_cast<uint64_t>(d);
    if (dim != 0 && count > std::numeric_limits<uint64_t>::max() / itemSize / dim) {
      parser.malformed(fmt::format("the shape {} is too large", npyShapeText(array.shape)));
    }
    count *= dim;
  }
  const uint64_t dataBytes = count * itemSize;
  if (fileSize - dataOffset < dataBytes) {
    fail<UsageError>(
        "{}: truncated .npy data: shape {} of {} needs {} bytes after the header, the file has {}. HINT: the file "
        "was cut short; write it again",
        path, npyShapeText(array.shape), array.descr, dataBytes, fileSize - dataOffset);
  }
  if (dataBytes == 0) {
    array.data = at::empty(array.shape, at::TensorOptions().dtype(array.dtype));
    return array;
  }
  const auto mapBytes = static_cast<size_t>(dataOffset + dataBytes);
  void* base = ::mmap(nullptr, mapBytes, PROT_READ, MAP_PRIVATE, fd.get(), 0);
  if (base == MAP_FAILED) fail<UsageError>("{}: cannot map {} bytes: {}", path, mapBytes, errnoText(errno));
  char* data = static_cast<char*>(base) + dataOffset;
  const auto options = at::TensorOptions().dtype(array.dtype);
  if (dataOffset % itemSize != 0) {
    // Not aligned for its type (numpy aligns to 64 bytes; a hand-made file
    // may not): copied once, so that every kernel may read it.
    array.data = at::empty(array.shape, options);
    std::memcpy(array.data.data_ptr(), data, static_cast<size_t>(dataBytes));
    ::munmap(base, mapBytes);
    return array;
  }
  array.data = at::from_blob(
      data, array.shape, [base, mapBytes](void*) { ::munmap(base, mapBytes); }, options);
  return array;
}

}  // namespace ddp::plugins
