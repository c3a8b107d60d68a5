// Reading one NumPy .npy file: its dtype, its shape and its data as a tensor
// over the memory-mapped file, nothing copied.
//
// Contract
// - The format, as NumPy documents it (numpy.lib.format): the 6 bytes
//   "\x93NUMPY", a major and a minor version byte, the header's length
//   (2 bytes little-endian in version 1.0, 4 bytes in 2.0 and 3.0), the
//   header (a Python dict literal {'descr': ..., 'fortran_order': ...,
//   'shape': (...)}, padded with spaces, ending in a newline), then the data.
//   Versions 1.0, 2.0 and 3.0 are read.
// - Data types: float32 '<f4', float64 '<f8', uint8 '|u1' (or '<u1'), int32
//   '<i4', int64 '<i8', in C order, on a little-endian machine.
// - readNpy maps the file read-only (MAP_PRIVATE, PROT_READ) and returns a
//   tensor of the header's shape and dtype over it; the tensor's deleter
//   unmaps the file, so the mapping lives exactly as long as some tensor
//   shares its storage. The tensor must not be written: the pages are
//   read-only, and a write faults. (Only a file whose data offset is not a
//   multiple of the element size, which numpy never writes, is copied.)
// - Every problem with the file is one UsageError line that names the file
//   and what is wrong, with a HINT where the user can fix it: not an .npy
//   file, an unknown version, a header or data cut short, a malformed
//   header, Fortran order, object (pickled) arrays, or any other dtype
//   (named, with the supported ones listed).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

namespace ddp::plugins {

struct NpyArray {
  std::string descr;  // the header's dtype, e.g. "<f4"
  at::ScalarType dtype = at::kFloat;
  std::vector<int64_t> shape;
  int versionMajor = 1;
  int versionMinor = 0;
  at::Tensor data;  // shape and dtype as above, over the mapped file; read-only
};

NpyArray readNpy(const std::string& path);

// A shape the way numpy prints it: "(60000, 28, 28)", "(5,)", "()".
std::string npyShapeText(const std::vector<int64_t>& shape);

// numpy's name of a dtype this reader serves: "float32", "uint8", ...
std::string npyTypeName(at::ScalarType dtype);

}  // namespace ddp::plugins
