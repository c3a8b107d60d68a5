// training.precision (precision.hpp): autocast scopes across LibTorch 1.x
// and 2.x, whose autocast functions are spelled differently.
#include "framework/experiment/precision.hpp"

#include <ATen/autocast_mode.h>
#include <torch/version.h>

#include "framework/core/errors.hpp"

namespace ddp {
namespace {

// LibTorch 2.4 took the device type as an argument; 1.x has a function
// per device type.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
bool autocastEnabled(c10::DeviceType d) { return at::autocast::is_autocast_enabled(d); }
void setAutocastEnabled(c10::DeviceType d, bool on) { at::autocast::set_autocast_enabled(d, on); }
c10::ScalarType autocastType(c10::DeviceType d) { return at::autocast::get_autocast_dtype(d); }
void setAutocastType(c10::DeviceType d, c10::ScalarType t) { at::autocast::set_autocast_dtype(d, t); }
#else
bool autocastEnabled(c10::DeviceType d) {
  return d == c10::DeviceType::CUDA ? at::autocast::is_enabled() : at::autocast::is_cpu_enabled();
}
void setAutocastEnabled(c10::DeviceType d, bool on) {
  if (d == c10::DeviceType::CUDA) {
    at::autocast::set_enabled(on);
  } else {
    at::autocast::set_cpu_enabled(on);
  }
}
c10::ScalarType autocastType(c10::DeviceType d) {
  return d == c10::DeviceType::CUDA ? at::autocast::get_autocast_gpu_dtype() : at::autocast::get_autocast_cpu_dtype();
}
void setAutocastType(c10::DeviceType d, c10::ScalarType t) {
  if (d == c10::DeviceType::CUDA) {
    at::autocast::set_autocast_gpu_dtype(t);
  } else {
    at::autocast::set_autocast_cpu_dtype(t);
  }
}
#endif

}  // namespace

Precision parsePrecision(const std::string& name) {
  if (name == "fp32") return Precision::Fp32;
  if (name == "bf16") return Precision::Bf16;
  fail<UsageError>("training.precision: expected \"fp32\" or \"bf16\", got \"{}\"", name);
}

ComputePrecision::ComputePrecision(Precision precision, c10::DeviceType device) : device_(device) {
  if (precision != Precision::Bf16) return;
  active_ = true;
  wasEnabled_ = autocastEnabled(device_);
  oldType_ = autocastType(device_);
  setAutocastType(device_, at::kBFloat16);
  setAutocastEnabled(device_, true);
  at::autocast::increment_nesting();
}

ComputePrecision::~ComputePrecision() {
  if (!active_) return;
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  setAutocastEnabled(device_, wasEnabled_);
  setAutocastType(device_, oldType_);
}

bool autocastActive(c10::DeviceType device) { return autocastEnabled(device); }

at::Tensor lossInput(const at::Tensor& output) {
  if (output.defined() && (output.scalar_type() == at::kBFloat16 || output.scalar_type() == at::kHalf)) {
    return output.to(at::kFloat);
  }
  return output;
}

}  // namespace ddp
