// `ddp-run --sample RUN_DIR`: text from a trained language model.
//
// Contract
// - RUN_DIR is the folder of a run on token data (the text dataset): its
//   model is rebuilt and loaded (framework/experiment/trained_model.hpp),
//   its vocab.json turns the prompt into token ids and the ids back.
// - Each new token is drawn from the model's distribution at the last
//   position, over the last block_size tokens (the model's context):
//   logits / temperature, restricted to the top_k most likely (0: all),
//   softmax, one draw with a generator seeded by `seed`, so the same
//   command prints the same text. temperature 0 takes the most likely.
// - Prints the prompt and then each token as it is drawn, to stdout.
// - A run that is not a language model, a prompt byte outside the
//   vocabulary, a bad option: UsageError (one line, exit 2).
#pragma once

#include <cstdint>
#include <ostream>
#include <string>

#include "framework/experiment/plugin_registry.hpp"

namespace ddp::apps {

struct SampleOptions {
  std::string runDir;
  std::string checkpoint = "latest";  // "latest", "best" (training.keep_best) or a file
  std::string prompt = "\n";
  int64_t tokens = 200;
  double temperature = 1.0;
  int64_t topK = 0;
  int64_t seed = 0;  // >= 0 (ddp-run refuses a negative or too large one)
};

// The generated text (the prompt not included), also written to `out`.
std::string sampleText(const SampleOptions& options, PluginRegistry& registry, std::ostream& out);

// The length of the longest prefix of `text` that does not end inside a
// UTF-8 character (what --sample prints of byte tokens).
size_t completeUtf8(const std::string& text);

}  // namespace ddp::apps
