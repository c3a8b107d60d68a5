// The built-in sections' declarations: training, training.early_stopping and
// distributed parameters, and the metrics early stopping and keep_best follow.
#include <optional>
#include <string>
#include <vector>

#include "framework/experiment/experiment_config.hpp"
#include "framework/parallel/strategy.hpp"

namespace ddp {
namespace {

ParamSpec intParam(std::string name, int64_t def, std::optional<double> min, std::string doc) {
  ParamSpec p;
  p.name = std::move(name);
  p.type = ParamType::Int;
  p.defaultValue = def;
  p.min = min;
  p.doc = std::move(doc);
  return p;
}

ParamSpec floatParam(std::string name, double def, double min, bool exclusive, std::string doc) {
  ParamSpec p;
  p.name = std::move(name);
  p.type = ParamType::Float;
  p.defaultValue = def;
  p.min = min;
  p.minExclusive = exclusive;
  p.doc = std::move(doc);
  return p;
}

ParamSpec boolParam(std::string name, bool def, std::string doc) {
  ParamSpec p;
  p.name = std::move(name);
  p.type = ParamType::Bool;
  p.defaultValue = def;
  p.doc = std::move(doc);
  return p;
}

ParamSpec stringParam(std::string name, std::string def, std::vector<std::string> choices, std::string doc) {
  ParamSpec p;
  p.name = std::move(name);
  p.type = ParamType::String;
  p.defaultValue = def;
  p.choices = std::move(choices);
  p.doc = std::move(doc);
  return p;
}

}  // namespace

const std::vector<ParamSpec>& trainingParamSpecs() {
  static const std::vector<ParamSpec> specs = {
      intParam("epochs", 1, 1, "passes over the training split"),
      intParam("batch_size", 32, 1, "samples per rank per step"),
      intParam("seed", 0, 0, "seeds the split, the initialization and the shuffling"),
      intParam("save_every", 0, 0, "epochs between checkpoints (0: none)"),
      intParam("eval_every", 1, 0, "epochs between evaluations on the test split (0: only after the last)"),
      intParam("max_steps", 0, 0, "stop after this many optimizer steps (0: no limit)"),
      intParam("eval_batch_size", 512, 1, "samples per rank per forward pass when evaluating"),
      intParam("log_every", 0, 0, "optimizer steps between records of steps.jsonl (0: about four per epoch)"),
      intParam("accumulate_grad_batches", 1, 1, "micro-batches per optimizer step"),
      [] {
        ParamSpec p = intParam("threads", 0, 0,
                               "intra-op threads per rank (0: LibTorch's setting; ranks that ddp-run starts get cores "
                               "/ local ranks through OMP_NUM_THREADS)");
        p.max = 1024;  // LibTorch's thread pool with 100,000 threads does not come back
        return p;
      }(),
      boolParam("drop_last", false, "drop the last incomplete batch and shard"),
      boolParam("join", true,
                "uneven shards (drop_last false, a size the world does not divide): ranks that run out shadow their "
                "peers' last steps and the gradients average over the ranks with data (strategy ddp); false: pad "
                "the shards by repeating samples"),
      stringParam("on_nonfinite_loss", "stop", {"stop", "continue"},
                  "a NaN or infinite training loss: stop the run (exit code 3) or continue"),
      stringParam("checkpoint_format", "auto", {"auto", "consolidated", "sharded"},
                  "consolidated: rank 0 gathers the model and optimizer and writes one file; sharded: every rank "
                  "writes what it holds, in parallel, and an index is written last (a folder epoch_N.shards); auto: "
                  "sharded for zero1, zero2, fsdp and hsdp, consolidated for ddp. Either resumes on any world size "
                  "and strategy"),
      boolParam("async_checkpoint", false,
                "periodic checkpoints copy each rank's state to host memory at the step boundary and write it on a "
                "background thread while training goes on (sharded checkpoints; the next save waits for the "
                "previous one; the last checkpoint and one on a signal stay synchronous)"),
      boolParam("checkpoint_on_signal", false,
                "on SIGTERM or SIGINT, finish the step and save a checkpoint of it before exiting"),
      boolParam("tensorboard", false,
                "also write every scalar of metrics.jsonl and steps.jsonl, and the resolved experiment as text, to "
                "events.out.tfevents.* in the run folder (tensorboard --logdir runs/)"),
      boolParam("trace", false,
                "record a timeline of a few steps (data, forward, backward, each bucket's collective, optimizer) "
                "into trace.json, for Perfetto or chrome://tracing (also: environment DDP_TRACE=1)"),
      intParam("trace_start", 2, 1, "the first optimizer step the trace records (1-based; the first is warm-up)"),
      intParam("trace_steps", 3, 1, "optimizer steps the trace records"),
      floatParam("clip_grad_norm", 0, 0, false,
                 "clip the gradients' global L2 norm (over all parameters, ranks and shards) to this before each "
                 "optimizer step, as torch.nn.utils.clip_grad_norm_; the norm before clipping goes into steps.jsonl "
                 "as grad_norm (0: off)"),
      stringParam("precision", "fp32", {"fp32", "bf16"},
                  "bf16: forward and backward compute in bfloat16 where the kernels allow it (autocast); weights, "
                  "gradients and optimizer state stay fp32"),
      intParam("keep_best", 0, 0,
               "keep the K best checkpoints by keep_best_by in checkpoints/best/, beside the latest (0: off); "
               "ddp-run --sample RUN --checkpoint best loads the best"),
      stringParam("keep_best_by", "", {},
                  "the metric keep_best ranks by (\"\": early_stopping's monitor, else test_loss); lower is better "
                  "except for test_accuracy"),
  };
  return specs;
}

const std::vector<std::string>& monitorNames() {
  static const std::vector<std::string> names = {"test_loss", "test_accuracy", "test_perplexity", "test_rmse",
                                                 "train_loss"};
  return names;
}

bool largerIsBetter(const std::string& monitor) { return monitor == "test_accuracy"; }

const std::vector<ParamSpec>& earlyStoppingParamSpecs() {
  static const std::vector<ParamSpec> specs = {
      stringParam("monitor", "test_loss", monitorNames(),
                  "the metric to follow (test_* metrics count on evaluation epochs only: see eval_every)"),
      stringParam("mode", "auto", {"auto", "min", "max"},
                  "whether lower (min) or higher (max) is better; auto: max for test_accuracy, else min"),
      intParam("patience", 3, 1, "evaluations without improvement before training stops"),
      floatParam("min_delta", 0, 0, false, "a change smaller than this is no improvement"),
  };
  return specs;
}

const std::vector<ParamSpec>& distributedParamSpecs() {
  static std::vector<ParamSpec> specs = [] {
    std::vector<ParamSpec> s = {
        stringParam("backend", "gloo", {"gloo", "nccl"}, "communication backend"),
        stringParam("device", "cpu", {"cpu", "cuda"}, "where each rank computes (cuda: cuda:LOCAL_RANK)"),
        intParam("nproc_per_node", 1, 1,
                 "ranks per node: what ddp-run starts without --nproc-per-node; a run's config.json records the "
                 "ranks it ran with"),
        intParam("nnodes", 1, 1, "nodes: a run's config.json records how many the job ran on (--nnodes)"),
        floatParam("timeout_s", 300, 0, true, "seconds before a collective fails"),
        boolParam("find_unused_parameters", false, "allow parameters that get no gradient"),
        floatParam("bucket_cap_mb", 25, 0, true, "gradient bucket size"),
        floatParam("first_bucket_cap_mb", 1, 0, true, "first gradient bucket size, small to start early"),
        stringParam("strategy", "ddp", {}, "how ranks share the training (parallel strategy)"),
        boolParam("fsdp_backward_prefetch", true,
                  "fsdp: gather the next unit for backward while one computes (faster, one unit more memory)"),
        floatParam("fsdp_unit_mb", 0, 0, false,
                   "fsdp: join the model's consecutive units until each holds this many MiB (0: each alone)"),
        intParam("shard_size", 0, 0,
                 "hsdp: ranks that shard the model among them (a row of the rank mesh; it must divide the world "
                 "size); the rows replicate it. 0: the ranks of one node (nproc_per_node)"),
    };
    return s;
  }();
  // Strategies may be registered after the first call: choices are current.
  for (ParamSpec& spec : specs) {
    if (spec.name == "strategy") spec.choices = builtinStrategies().names();
  }
  return specs;
}

}  // namespace ddp
