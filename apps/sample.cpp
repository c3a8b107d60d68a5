#include "apps/sample.hpp"

#include <ATen/ATen.h>

#include <cmath>
#include <fstream>
#include <sstream>

#include "framework/core/errors.hpp"
#include "framework/experiment/trained_model.hpp"
#include "plugins/datasets/text.hpp"

namespace ddp::apps {
// The length of the longest prefix of `text` that ends on a character
// boundary: an incomplete UTF-8 sequence at the end is left out (invalid
// bytes elsewhere pass as they are).
size_t completeUtf8(const std::string& text) {
  size_t n = text.size();
  // Back over up to three continuation bytes to the sequence's lead byte.
  size_t lead = n;
  for (size_t back = 1; back <= 4 && back <= n; ++back) {
    const auto c = static_cast<unsigned char>(text[n - back]);
    if ((c & 0xC0) != 0x80) {
      lead = n - back;
      break;
    }
  }
  if (lead == n) return n;
  const auto c = static_cast<unsigned char>(text[lead]);
  const size_t need = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 1;
  return n - lead >= need ? n : lead;
}


std::string sampleText(const SampleOptions& options, PluginRegistry& registry, std::ostream& out) {
  if (options.tokens < 0) fail<UsageError>("--tokens {}: expected 0 or more", options.tokens);
  if (!(options.temperature >= 0) || !std::isfinite(options.temperature)) {
    fail<UsageError>("--temperature {}: expected a finite number, 0 or more", options.temperature);
  }
  if (options.topK < 0) fail<UsageError>("--top-k {}: expected 0 (all) or more", options.topK);
  const TrainedModel trained = loadTrainedModel(options.runDir, registry, options.checkpoint);
  const std::string vocabPath = options.runDir + "/vocab.json";
  std::ifstream vocabFile(vocabPath);
  if (trained.context.vocabSize == 0 || trained.context.sampleShape.size() != 1 || !vocabFile) {
    fail<UsageError>("--sample: {} did not train a language model (no token vocabulary, {}). HINT: a run of "
                     "experiments/char_gpt.json, or any run on the text dataset",
                     options.runDir, vocabFile ? "vocab_size 0" : "no vocab.json");
  }
  std::stringstream json;
  json << vocabFile.rdbuf();
  const auto vocab = plugins::ByteVocabulary::fromJson(json.str(), vocabPath);
  if (vocab.size() != trained.context.vocabSize) {
    fail<UsageError>("{}: {} tokens, but the model was trained on {}", vocabPath, vocab.size(),
                     trained.context.vocabSize);
  }
  if (options.prompt.empty()) fail<UsageError>("--prompt: empty; the model needs at least one token to continue");
  std::vector<int64_t> ids = vocab.encode(options.prompt);
  const int64_t block = trained.context.sampleShape[0];

  torch::NoGradGuard noGrad;
  at::Generator generator = at::detail::createCPUGenerator(static_cast<uint64_t>(options.seed));
  out << options.prompt << std::flush;
  std::vector<int64_t> generated;
  std::string pending;  // bytes of a character not yet complete
  for (int64_t i = 0; i < options.tokens; ++i) {
    const auto start = static_cast<int64_t>(ids.size()) > block ? static_cast<int64_t>(ids.size()) - block : 0;
    const std::vector<int64_t> window(ids.begin() + start, ids.end());
    const at::Tensor input = at::tensor(window, at::kLong).unsqueeze(0);
    const at::Tensor logits = trained.model->forward(input).select(0, 0).select(0, -1).to(at::kDouble);
    int64_t next = 0;
    if (options.temperature == 0) {
      next = logits.argmax().item<int64_t>();
    } else {
      at::Tensor scaled = logits / options.temperature;
      if (options.topK > 0 && options.topK < scaled.size(0)) {
        const at::Tensor kth = std::get<0>(scaled.topk(options.topK)).select(0, -1);
        scaled = scaled.masked_fill(scaled < kth, -std::numeric_limits<double>::infinity());
      }
      next = at::multinomial(at::softmax(scaled, 0), 1, /*replacement=*/false, generator).item<int64_t>();
    }
    ids.push_back(next);
    generated.push_back(next);
    // Byte tokens: print whole UTF-8 characters only, so the output never
    // holds half of one.
    pending += vocab.decode({next});
    const size_t whole = completeUtf8(pending);
    out << pending.substr(0, whole) << std::flush;
    pending.erase(0, whole);
  }
  // A character the tokens left unfinished is dropped.
  out << "\n";
  std::string text = vocab.decode(generated);
  return text.substr(0, completeUtf8(text));
}

}  // namespace ddp::apps
