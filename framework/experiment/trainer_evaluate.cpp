// The Trainer's evaluation (trainer.hpp): this rank's shard of the test split, summed.
#include <ATen/ATen.h>
#include <torch/csrc/autograd/grad_mode.h>

#include "framework/experiment/trainer_impl.hpp"

namespace ddp {

std::vector<double> Trainer::evaluate() {
  Impl& s = *impl_;
  torch::NoGradGuard noGrad;
  s.model->eval();
  // Loss sum (each batch's mean times its samples), correct predictions
  // (classes or tokens), samples, squared error, and the units the last two
  // count (tokens for next-token data, values for regression).
  std::vector<double> sums(5, 0.0);
  const auto n = static_cast<int64_t>(s.testRows.size());
  const int64_t step = config_.training.evalBatchSize;
  for (int64_t begin = 0; begin < n; begin += step) {
    const int64_t len = std::min(step, n - begin);
    const Batch batch =
        s.data.test->get(c10::ArrayRef<int64_t>(s.testRows.data() + begin, static_cast<size_t>(len)));
    const at::Tensor x = batch.inputs.to(s.device), y = batch.targets.to(s.device);
    at::Tensor out;
    {
      const ComputePrecision precision(s.precision, s.device.type());
      out = lossInput(s.model->forward(x));
    }
    sums[0] += s.lossFn(out, y).item<double>() * double(len);
    sums[2] += double(len);
    switch (s.data.task) {
      case Task::Classification:
        sums[1] += out.argmax(1).eq(y).sum().item<double>();
        break;
      case Task::NextToken:
        sums[1] += out.argmax(-1).eq(y).sum().item<double>();
        sums[4] += double(y.numel());
        break;
      case Task::Regression: {
        const at::Tensor diff = out.to(at::kDouble).reshape(y.sizes()) - y.to(at::kDouble);
        sums[3] += diff.pow(2).sum().item<double>();
        sums[4] += double(y.numel());
        break;
      }
    }
  }
  // A strategy whose forward runs collectives (fsdp gathers its units)
  // needs the same number of forwards on every rank: a rank with fewer
  // test rows runs the missing ones on one row, discarded. Rows are dealt
  // rank by rank, so rank 0 has the most: ceil(total / world).
  if (s.strategy->collectiveForward() && s.data.test->size() > 0) {
    const int64_t world = worldSize(), total = s.data.test->size();
    const int64_t most = ((total + world - 1) / world + step - 1) / step;
    const int64_t row = 0;
    for (int64_t k = (n + step - 1) / step; k < most; ++k) {
      const ComputePrecision precision(s.precision, s.device.type());
      s.model->forward(s.data.test->get(c10::ArrayRef<int64_t>(&row, 1)).inputs.to(s.device));
    }
  }
  return sums;
}

}  // namespace ddp
