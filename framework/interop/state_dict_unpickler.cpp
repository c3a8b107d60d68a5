// The pickle of a PyTorch state_dict (state_dict_unpickler.hpp): a small
// stack machine over the opcodes that torch.save emits for one.
#include "framework/interop/state_dict_unpickler.hpp"

#include <fmt/format.h>

#include <cstring>
#include <map>
#include <memory>
#include <set>
#include <unordered_map>
#include <variant>
#include <vector>

#include "framework/core/errors.hpp"
#include "framework/core/strings.hpp"

namespace ddp {
namespace {

struct Value;
using ValuePtr = std::shared_ptr<Value>;

struct Global {
  std::string module, name;
  std::string full() const { return module + "." + name; }
};
struct Tuple {
  std::vector<ValuePtr> items;
};
struct List {
  std::vector<ValuePtr> items;
};
struct Dict {
  std::vector<std::pair<ValuePtr, ValuePtr>> items;
};
struct Object {
  std::string type;  // the global that made it
};
struct None {};

struct Value {
  std::variant<None, bool, int64_t, double, std::string, Tuple, List, Dict, Global, at::Tensor, Object> v;
  int depth = 0;  // containers nested inside it (destroying deep chains recurses)
};

ValuePtr make(decltype(Value::v) v, int depth = 0) { return std::make_shared<Value>(Value{std::move(v), depth}); }

int depthOf(const std::vector<ValuePtr>& items) {
  int depth = 0;
  for (const auto& item : items) depth = std::max(depth, item->depth + 1);
  return depth;
}

const std::map<std::string, at::ScalarType>& storageTypes() {
  static const std::map<std::string, at::ScalarType> types = {
      {"FloatStorage", at::kFloat}, {"DoubleStorage", at::kDouble},     {"HalfStorage", at::kHalf},
      {"BFloat16Storage", at::kBFloat16}, {"LongStorage", at::kLong}, {"IntStorage", at::kInt},
      {"ShortStorage", at::kShort}, {"CharStorage", at::kChar},         {"ByteStorage", at::kByte},
      {"BoolStorage", at::kBool},
  };
  return types;
}

std::string describe(const ValuePtr& v) {
  struct {
    std::string operator()(const None&) const { return "None"; }
    std::string operator()(bool) const { return "a bool"; }
    std::string operator()(int64_t) const { return "an int"; }
    std::string operator()(double) const { return "a float"; }
    std::string operator()(const std::string&) const { return "a string"; }
    std::string operator()(const Tuple&) const { return "a tuple"; }
    std::string operator()(const List&) const { return "a list"; }
    std::string operator()(const Dict&) const { return "a dict"; }
    std::string operator()(const Global& g) const { return printable(g.full()); }
    std::string operator()(const at::Tensor&) const { return "a tensor"; }
    std::string operator()(const Object& o) const { return "a " + printable(o.type) + " object"; }
  } visitor;
  return std::visit(visitor, v->v);
}

class Machine {
 public:
  Machine(const std::string& bytes, const StorageLoader& storage, const std::string& where)
      : b_(bytes), storage_(storage), where_(where) {}

  ValuePtr run() {
    while (true) {
      opStart_ = pos_;
      const uint8_t op = u8();
      switch (op) {
        case 0x80: u8(); break;                   // PROTO
        case 0x95: take(8); break;                // FRAME
        case '.': return stopped();               // STOP
        case '(':
          if (marks_.size() >= kMaxDepth) failHere("the pickle nests too deeply");
          marks_.push_back(stack_.size());
          break;
        case ')': push(make(Tuple{})); break;
        case 't': {
          auto items = popToMark();
          const int depth = checkedDepth(items);
          push(make(Tuple{std::move(items)}, depth));
          break;
        }
        case 0x85: tupleOf(1); break;
        case 0x86: tupleOf(2); break;
        case 0x87: tupleOf(3); break;
        case ']': push(make(List{})); break;
        case 'l': {
          auto items = popToMark();
          const int depth = checkedDepth(items);
          push(make(List{std::move(items)}, depth));
          break;
        }
        case 'a': {
          ValuePtr item = pop();
          appendTo(top(0), {std::move(item)});
          break;
        }
        case 'e': {
          auto items = popToMark();
          appendTo(top(0), std::move(items));
          break;
        }
        case '}': push(make(Dict{})); break;
        case 'd': {
          auto items = popToMark();
          push(make(Dict{}));
          setItems(top(0), items);
          break;
        }
        case 's': {
          ValuePtr value = pop(), key = pop();
          setItems(top(0), {key, value});
          break;
        }
        case 'u': {
          auto items = popToMark();
          setItems(top(0), items);
          break;
        }
        case 'N': push(make(None{})); break;
        case 0x88: push(make(true)); break;
        case 0x89: push(make(false)); break;
        case 'K': push(make(int64_t{u8()})); break;
        case 'M': push(make(int64_t(littleEndian(2)))); break;
        case 'J': push(make(int64_t(int32_t(uint32_t(littleEndian(4)))))); break;
        case 0x8a: {  // LONG1
          const size_t n = u8();
          if (n > 8) failHere(fmt::format("an integer of {} bytes", n));
          uint64_t v = littleEndian(n);
          if (n > 0 && n < 8 && (v >> (8 * n - 1)) & 1) v |= ~uint64_t{0} << (8 * n);  // sign
          push(make(int64_t(v)));
          break;
        }
        case 'G': {  // BINFLOAT, big-endian
          uint64_t bits = 0;
          for (char c : take(8)) bits = (bits << 8) | uint8_t(c);
          double d;
          std::memcpy(&d, &bits, sizeof d);
          push(make(d));
          break;
        }
        case 'X': push(make(take(littleEndian(4)))); break;       // BINUNICODE
        case 0x8c: push(make(take(u8()))); break;                 // SHORT_BINUNICODE
        case 0x8d: push(make(take(littleEndian(8)))); break;      // BINUNICODE8
        case 'T': push(make(take(littleEndian(4)))); break;       // BINSTRING
        case 'U': push(make(take(u8()))); break;                  // SHORT_BINSTRING
        case 'B': push(make(take(littleEndian(4)))); break;       // BINBYTES
        case 'C': push(make(take(u8()))); break;                  // SHORT_BINBYTES
        case 0x8e: push(make(take(littleEndian(8)))); break;      // BINBYTES8
        case 'q': memo_[u8()] = top(0); break;                    // BINPUT
        case 'r': memo_[littleEndian(4)] = top(0); break;         // LONG_BINPUT
        case 0x94: memo_[memo_.size()] = top(0); break;           // MEMOIZE
        case 'h': push(recall(u8())); break;                      // BINGET
        case 'j': push(recall(littleEndian(4))); break;           // LONG_BINGET
        case 'c': {                                               // GLOBAL
          std::string module = line(), name = line();
          push(make(Global{module, name}));
          break;
        }
        case 0x93: {  // STACK_GLOBAL
          ValuePtr name = pop(), module = pop();
          push(make(Global{stringOf(module, "a module name"), stringOf(name, "a global's name")}));
          break;
        }
        case 'R': {  // REDUCE
          ValuePtr args = pop(), callable = pop();
          push(reduce(callable, args));
          break;
        }
        case 0x81: {  // NEWOBJ
          pop();
          ValuePtr cls = pop();
          push(make(Object{describe(cls)}));
          break;
        }
        case 'Q': push(persistentLoad(pop())); break;  // BINPERSID
        case 'b': pop(); break;  // BUILD: an OrderedDict's _metadata, a tensor's state: not weights
        case '0': pop(); break;
        case '2': push(top(0)); break;
        case '1': popToMark(); break;
        default:
          failHere(fmt::format("opcode 0x{:02x}, which a state_dict does not use", op));
      }
    }
  }

 private:
  [[noreturn]] void failHere(const std::string& what) const {
    fail<UsageError>("{}: cannot read its pickle at byte {}: {}. HINT: save the weights alone, as "
                     "torch.save(model.state_dict(), PATH)",
                     where_, opStart_, what);
  }
  uint8_t u8() { return static_cast<uint8_t>(take(1)[0]); }
  std::string take(uint64_t n) {
    if (n > b_.size() - pos_) failHere("the pickle ends early");
    std::string out = b_.substr(pos_, static_cast<size_t>(n));
    pos_ += static_cast<size_t>(n);
    return out;
  }
  uint64_t littleEndian(size_t n) {
    const std::string bytes = take(n);
    uint64_t v = 0;
    for (size_t i = n; i-- > 0;) v = (v << 8) | uint8_t(bytes[i]);
    return v;
  }
  std::string line() {
    const size_t end = b_.find('\n', pos_);
    if (end == std::string::npos) failHere("the pickle ends inside a global's name");
    std::string out = b_.substr(pos_, end - pos_);
    pos_ = end + 1;
    return out;
  }
  void push(ValuePtr v) {
    if (stack_.size() > kMaxStack) failHere("the pickle nests too deeply");
    stack_.push_back(std::move(v));
  }
  ValuePtr pop() {
    if (stack_.empty() || (!marks_.empty() && stack_.size() <= marks_.back())) failHere("the stack is empty");
    ValuePtr v = std::move(stack_.back());
    stack_.pop_back();
    return v;
  }
  ValuePtr top(size_t below) {
    if (stack_.size() <= below) failHere("the stack is empty");
    return stack_[stack_.size() - 1 - below];
  }
  std::vector<ValuePtr> popToMark() {
    if (marks_.empty()) failHere("no mark to pop to");
    const size_t mark = marks_.back();
    marks_.pop_back();
    if (mark > stack_.size()) failHere("a mark above the stack");
    std::vector<ValuePtr> items(stack_.begin() + static_cast<std::ptrdiff_t>(mark), stack_.end());
    stack_.resize(mark);
    return items;
  }
  void tupleOf(size_t n) {
    std::vector<ValuePtr> items(n);
    for (size_t i = n; i-- > 0;) items[i] = pop();
    const int depth = checkedDepth(items);
    push(make(Tuple{std::move(items)}, depth));
  }
  int checkedDepth(const std::vector<ValuePtr>& items) {
    const int depth = depthOf(items);
    if (depth > static_cast<int>(kMaxDepth)) failHere("the pickle nests too deeply");
    return depth;
  }
  void grow(const ValuePtr& container, const std::vector<ValuePtr>& items) {
    container->depth = std::max(container->depth, checkedDepth(items));
  }
  ValuePtr recall(uint64_t index) {
    const auto it = memo_.find(index);
    if (it == memo_.end()) failHere(fmt::format("memo entry {} was never stored", index));
    return it->second;
  }
  void appendTo(const ValuePtr& list, std::vector<ValuePtr> items) {
    auto* l = std::get_if<List>(&list->v);
    if (!l) failHere("append to " + describe(list));
    grow(list, items);
    for (auto& item : items) l->items.push_back(std::move(item));
  }
  void setItems(const ValuePtr& dict, const std::vector<ValuePtr>& items) {
    auto* d = std::get_if<Dict>(&dict->v);
    if (!d) failHere("setitem on " + describe(dict));
    if (items.size() % 2 != 0) failHere("an odd number of dict items");
    grow(dict, items);
    for (size_t i = 0; i < items.size(); i += 2) d->items.emplace_back(items[i], items[i + 1]);
  }
  std::string stringOf(const ValuePtr& v, const char* what) {
    const auto* s = std::get_if<std::string>(&v->v);
    if (!s) failHere(fmt::format("{} is {}", what, describe(v)));
    return *s;
  }
  int64_t intOf(const ValuePtr& v, const char* what) {
    const auto* i = std::get_if<int64_t>(&v->v);
    if (!i) failHere(fmt::format("{} is {}", what, describe(v)));
    return *i;
  }
  std::vector<int64_t> intsOf(const ValuePtr& v, const char* what) {
    const auto* t = std::get_if<Tuple>(&v->v);
    if (!t) failHere(fmt::format("{} is {}", what, describe(v)));
    std::vector<int64_t> out;
    for (const auto& item : t->items) out.push_back(intOf(item, what));
    return out;
  }
  at::Tensor tensorOf(const ValuePtr& v, const char* what) {
    const auto* t = std::get_if<at::Tensor>(&v->v);
    if (!t) failHere(fmt::format("{} is {}", what, describe(v)));
    return *t;
  }

  ValuePtr reduce(const ValuePtr& callable, const ValuePtr& argsValue) {
    const auto* g = std::get_if<Global>(&callable->v);
    const auto* args = std::get_if<Tuple>(&argsValue->v);
    if (!g || !args) return make(Object{describe(callable)});
    const std::string name = g->full();
    const auto& a = args->items;
    if (name == "collections.OrderedDict" && a.empty()) return make(Dict{});
    if (name == "torch._utils._rebuild_tensor_v2" && a.size() >= 4) {
      const at::Tensor storage = tensorOf(a[0], "a tensor's storage");
      if (!loadedStorages_.count(storage.unsafeGetTensorImpl())) failHere("a tensor built on something other than a storage");
      const int64_t offset = intOf(a[1], "a tensor's storage offset");
      if (offset < 0) failHere("a negative storage offset");
      const std::vector<int64_t> sizes = intsOf(a[2], "a tensor's size");
      const std::vector<int64_t> strides = intsOf(a[3], "a tensor's stride");
      if (sizes.size() != strides.size()) failHere("a tensor whose size and stride differ in length");
      if (sizes.size() > kMaxDims) failHere(fmt::format("a tensor of {} dimensions", sizes.size()));
      // The furthest element the view reaches must lie inside its storage.
      int64_t last = offset;
      bool empty = false;
      for (size_t i = 0; i < sizes.size(); ++i) {
        if (sizes[i] < 0 || strides[i] < 0) failHere("a negative size or stride");
        if (sizes[i] == 0) empty = true;
        else if (sizes[i] - 1 > (INT64_MAX - last) / std::max<int64_t>(strides[i], 1)) failHere("a view too large");
        else last += (sizes[i] - 1) * strides[i];
      }
      if (!empty && last >= storage.numel()) {
        failHere(fmt::format("a tensor of size {} reaches element {} of a storage of {}", fmt::join(sizes, "x"), last,
                             storage.numel()));
      }
      return make(storage.as_strided(sizes, strides, offset));
    }
    if ((name == "torch._utils._rebuild_parameter" || name == "torch._utils._rebuild_parameter_with_state") &&
        !a.empty()) {
      return make(tensorOf(a[0], "a parameter's data"));
    }
    // LibTorch's pickler tags dicts and lists with their type.
    if (name == "torch.jit._pickle.restore_type_tag" && a.size() == 2) return a[0];
    return make(Object{name});
  }

  ValuePtr persistentLoad(const ValuePtr& pidValue) {
    const auto* pid = std::get_if<Tuple>(&pidValue->v);
    if (!pid || pid->items.size() != 5 || stringOf(pid->items[0], "a persistent id's kind") != "storage") {
      failHere("a persistent id other than ('storage', type, key, location, numel)");
    }
    const auto* type = std::get_if<Global>(&pid->items[1]->v);
    const auto found = type ? storageTypes().find(type->name) : storageTypes().end();
    if (!type || type->module != "torch" || found == storageTypes().end()) {
      failHere(fmt::format("storage of type {}, which this reader does not handle", describe(pid->items[1])));
    }
    const std::string key = stringOf(pid->items[2], "a storage's key");
    const int64_t numel = intOf(pid->items[4], "a storage's size");
    if (numel < 0) failHere("a storage of negative size");
    const auto cached = storages_.find(key);
    if (cached != storages_.end()) {
      if (cached->second.scalar_type() != found->second || cached->second.numel() != numel) {
        failHere(fmt::format("storage {} is named again with another type or size", printable(key)));
      }
      return make(cached->second);
    }
    at::Tensor storage = storage_(key, found->second, numel);
    if (storage.scalar_type() == at::kBool) storage = storage.view(at::kByte).ne(0);  // any byte but 0 is true
    storages_[key] = storage;
    loadedStorages_.insert(storage.unsafeGetTensorImpl());
    return make(storage);
  }

  ValuePtr stopped() {
    if (stack_.size() != 1) failHere(fmt::format("{} values left on the stack at its end", stack_.size()));
    return stack_.back();
  }

  static constexpr size_t kMaxStack = 1 << 20;
  // Deeper than any state_dict; destroying deeper chains would recurse.
  static constexpr size_t kMaxDepth = 1000;
  static constexpr size_t kMaxDims = 64;
  const std::string& b_;
  const StorageLoader& storage_;
  const std::string& where_;
  size_t pos_ = 0, opStart_ = 0;
  std::vector<ValuePtr> stack_;
  std::vector<size_t> marks_;
  std::unordered_map<uint64_t, ValuePtr> memo_;
  std::unordered_map<std::string, at::Tensor> storages_;
  std::set<const void*> loadedStorages_;
};

}  // namespace

NamedTensors unpickleStateDict(const std::string& pickle, const StorageLoader& storage, const std::string& where) {
  const ValuePtr top = Machine(pickle, storage, where).run();
  const auto* dict = std::get_if<Dict>(&top->v);
  const std::string hint =
      "HINT: save the model's weights alone, as torch.save(model.state_dict(), PATH) (for a checkpoint dict: "
      "torch.save(ckpt[\"model\"], PATH))";
  if (!dict) fail<UsageError>("{}: holds {}, not a state_dict (a dict of tensors). {}", where, describe(top), hint);
  NamedTensors out;
  std::vector<std::string> notTensors;
  for (const auto& [key, value] : dict->items) {
    const auto* name = std::get_if<std::string>(&key->v);
    const auto* tensor = std::get_if<at::Tensor>(&value->v);
    if (name && tensor) {
      out.emplace_back(*name, *tensor);
    } else {
      notTensors.push_back(fmt::format("{} ({})", name ? printable(*name) : describe(key), describe(value)));
    }
  }
  if (!notTensors.empty()) {
    if (notTensors.size() > 5) notTensors.resize(5), notTensors.push_back("...");
    fail<UsageError>("{}: not a state_dict: entries that are not tensors: {}. {}", where,
                     fmt::join(notTensors, ", "), hint);
  }
  return out;
}

}  // namespace ddp
