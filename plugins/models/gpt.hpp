// The built-in decoder-only transformer language model ("model.gpt"), in
// the GPT-2 layout, written with plain torch::nn modules and the attention
// spelled out, as a template to copy.
//
// Contract
// - Input int64 token ids [batch, T] with 1 <= T <= block_size and ids in
//   [0, vocab); output logits [batch, T, vocab] (for cross_entropy over the
//   next token). Anything else is a UsageError naming what was expected.
// - Layout (pre-norm): x = drop(wte(ids) + wpe(positions)); then n_layer
//   blocks of x += drop(attn(ln_1(x))); x += mlp(ln_2(x)); then ln_f and
//   the lm head, a Linear without bias.
//   attn: one Linear to q, k, v (3 * n_embd), n_head heads of
//   d = n_embd / n_head, softmax(q k^T / sqrt(d) with -inf above the
//   diagonal), attention dropout, times v, heads concatenated, the output
//   projection c_proj. mlp: Linear to 4 * n_embd, GELU (erf), Linear back
//   (c_proj), dropout. All dropouts use "dropout" and act in training mode
//   only.
// - The causal mask is built in each forward on the input's device (a
//   [T, T] bool tensor from triu), not kept as a buffer: it never lands in
//   checkpoints or in DDP's buffer broadcast, and gpt has no buffers at all.
// - "bias": whether the Linear layers and LayerNorms have biases (the lm
//   head never does). "tie_weights": the lm head multiplies by the token
//   embedding's weight (wte.weight) instead of having its own; the model then
//   registers that tensor once, as wte.weight, so model->parameters()
//   (which in LibTorch does not remove duplicates) hands it to the
//   optimizer once. Without tying the head is lm_head.weight.
// - block_size: the longest input; 0 takes the dataset's window length
//   (sampleShape[0]). A block_size shorter than the dataset's windows is a
//   UsageError. The vocabulary is the dataset's (ModelContext::vocabSize);
//   a dataset without one (vocab 0) is a UsageError with a HINT.
// - Parameter count, C = n_embd, V = vocab, T = block_size, L = n_layer:
//   V*C + T*C + L*(12*C^2 + 13*C) + 2*C with biases,
//   V*C + T*C + L*(12*C^2 + 2*C) + C without; plus V*C when not tied.
// - Initialisation as GPT-2's: Linear and Embedding weights normal(0,
//   0.02), the two residual projections (attn.c_proj, mlp.c_proj)
//   normal(0, 0.02 / sqrt(2 * n_layer)), biases 0, LayerNorm weights 1;
//   drawn from the global torch generator (training.seed), so every rank
//   builds the same model.
// - Names: wte.weight, wpe.weight, blocks.<i>.ln_1.{weight,bias},
//   blocks.<i>.attn.c_attn.{weight,bias}, blocks.<i>.attn.c_proj.*,
//   blocks.<i>.ln_2.*, blocks.<i>.mlp.c_fc.*, blocks.<i>.mlp.c_proj.*,
//   ln_f.*, lm_head.weight (untied only).
#pragma once

#include "framework/experiment/plugin_registry.hpp"

namespace ddp::plugins {

ModelPtr makeGpt(const Params& params, const ModelContext& context);

}  // namespace ddp::plugins
