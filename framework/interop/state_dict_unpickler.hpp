// The pickle of a PyTorch state_dict, read without Python: what
// torch.save(model.state_dict()) writes as the data.pkl of its zip file.
//
// Why our own: LibTorch 1.13's unpickler (torch::pickle_load) turns
// collections.OrderedDict into None, so the OrderedDict that state_dict()
// returns fails to load, and it is the one thing people save.
//
// Contract
// - Reads pickle protocols 2 to 5 as far as a state_dict needs: None, bools,
//   ints, floats, strings and bytes, tuples, lists, dicts and OrderedDicts,
//   the memo, persistent ids, and these callables: collections.OrderedDict,
//   torch._utils._rebuild_tensor_v2, _rebuild_parameter and
//   _rebuild_parameter_with_state. Any other global becomes an opaque object;
//   it is an error only where a tensor is expected.
// - A persistent id ('storage', torch.<T>Storage, key, location, numel)
//   calls `storage(key, dtype, numel)`, which returns a 1-D CPU tensor of
//   that many elements (the caller reads the zip record data/<key>). The
//   same key gives the same storage, so tied weights stay tied.
// - The result is the top-level dict's string keys and tensors, in pickle
//   order. A top level that is not a dict of tensors (a checkpoint dict
//   with "model" and "optimizer", a whole pickled module) is a UsageError
//   naming `where`, what was found, and a HINT with the Python line that
//   saves a state_dict. Malformed or truncated pickles, unknown opcodes and
//   views outside their storage are UsageErrors naming `where` and the byte
//   offset; nothing reads outside the pickle's bytes.
#pragma once

#include <functional>
#include <string>

#include "framework/interop/named_tensors.hpp"

namespace ddp {

using StorageLoader = std::function<at::Tensor(const std::string& key, at::ScalarType dtype, int64_t numel)>;

NamedTensors unpickleStateDict(const std::string& pickle, const StorageLoader& storage, const std::string& where);

}  // namespace ddp
