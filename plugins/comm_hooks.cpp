// Communication hooks: how DDP averages each gradient bucket
// (distributed.comm_hook; the contract is framework/parallel/comm_hook.hpp).
#include "plugins/comm_hooks/cast_hook.hpp"
#include "plugins/comm_hooks/powersgd_hook.hpp"
#include "plugins/common.hpp"

namespace ddp::plugins {

void registerCommHooks(PluginRegistry& registry) {
  registry.add({"allreduce", "exact average of each bucket in one allreduce (the default)", {},
                CommHookFactory([](const Params&, Milliseconds timeout) -> CommHookPtr {
                  return std::make_shared<AllreduceAvgHook>(timeout);
                })});
  registry.add({"fp16", "divide by the world size, sum as float16, cast back: half the bytes, 11-bit precision", {},
                CommHookFactory([](const Params&, Milliseconds timeout) -> CommHookPtr {
                  return std::make_shared<CastHook>(at::kHalf, timeout);
                })});
  registry.add({"bf16", "divide by the world size, sum as bfloat16, cast back: half the bytes, 8-bit precision", {},
                CommHookFactory([](const Params&, Milliseconds timeout) -> CommHookPtr {
                  return std::make_shared<CastHook>(at::kBFloat16, timeout);
                })});
  registry.add({"powersgd",
                "low-rank compression of each matrix gradient with error feedback (PowerSGD); vectors go exact",
                {
                    Param("rank", ParamType::Int, 1, "columns of the low-rank factors (higher: closer, more bytes)")
                        .atLeast(1),
                    Param("start_steps", ParamType::Int, 10, "optimizer steps averaged exactly before compressing")
                        .atLeast(0),
                    Param("min_compression_rate", ParamType::Float, 2.0,
                          "compress a matrix only if it shrinks at least this many times")
                        .atLeast(1),
                },
                CommHookFactory([](const Params& p, Milliseconds timeout) -> CommHookPtr {
                  PowerSgdHook::Options o;
                  o.rank = p.getInt("rank");
                  o.startSteps = p.getInt("start_steps");
                  o.minCompressionRate = p.getDouble("min_compression_rate");
                  o.timeout = timeout;
                  return std::make_shared<PowerSgdHook>(o);
                })});
}

}  // namespace ddp::plugins
