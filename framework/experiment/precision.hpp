// Precision: what training.precision means for the code that runs the
// model (the trainer's steps, its evaluation, and the check that the
// plugins fit).
//
// Contract
// - "fp32" (the default): nothing changes.
// - "bf16": while a ComputePrecision scope lives on a thread, the ops that
//   LibTorch's autocast lists for lower precision (linear, matmul, conv,
//   bmm, ...) run in bfloat16 on the scope's device type (CPU or CUDA);
//   the rest stay fp32. Parameters, their gradients (autograd casts them
//   back to the parameter's dtype), the optimizer's state and the
//   collectives stay fp32: these are master weights. The scope covers the
//   forward pass only; backward runs outside it, as PyTorch advises.
// - lossInput(output): the model's output as the loss should see it, fp32
//   where autocast made it bf16, so the loss and its reduction are fp32.
// - Scopes nest; each restores what it found, and clears autocast's cache
//   of cast weights when it turns autocast off (so a step's casts are not
//   reused by the next step, after the optimizer changed the weights).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <string>

namespace ddp {

enum class Precision { Fp32, Bf16 };

// "fp32" or "bf16"; anything else is a UsageError naming it.
Precision parsePrecision(const std::string& name);

class ComputePrecision {
 public:
  ComputePrecision(Precision precision, c10::DeviceType device);
  ~ComputePrecision();
  ComputePrecision(const ComputePrecision&) = delete;
  ComputePrecision& operator=(const ComputePrecision&) = delete;

 private:
  bool active_ = false;
  c10::DeviceType device_;
  bool wasEnabled_ = false;
  c10::ScalarType oldType_{};
};

// Whether autocast is on for `device` on this thread (a ComputePrecision
// scope is open): for models with kernels of their own, which autocast does
// not reach, to take ATen's ops instead.
bool autocastActive(c10::DeviceType device);

// The output made fp32 if autocast left it in a lower floating precision.
at::Tensor lossInput(const at::Tensor& output);

}  // namespace ddp
