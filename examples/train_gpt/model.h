#pragma once
// The trainer's model: fsdpp::LlamaForCausalLM from the shape flags, a config.json (--config) or
// a Hugging Face directory (--init-from), sharded with FSDP (every decoder layer a unit; HSDP with
// --replicate, bf16 compute with --param-dtype, activation checkpointing).
#include <torch/torch.h>

#include <fsdpp/fsdpp.h>

#include "config.h"
#include "text_corpus.h"

namespace train_gpt {

using Model = fsdpp::FullyShardedDataParallel<fsdpp::LlamaForCausalLMImpl>;

// The model's config.json: from --init-from / --config, else the shape flags with the tokenizer's
// vocabulary and special tokens. Throws naming the file when the tokenizer's ids do not fit.
fsdpp::LlamaConfig llama_config(const Config& c, const TextTokenizer& tokenizer);

// Built on the meta device and sharded; then each rank initializes its shards one layer at a time
// (from scratch), reads its rows of --init-from's weights, or is left to the checkpoint it resumes
// from (`resuming`). --init eager: the whole model on every rank first.
Model build_model(const Config& c, const fsdpp::LlamaConfig& config, const fsdpp::ProcessGroup& world,
                  const at::Device& device, bool resuming);

// Model FLOPs per token of a training step (PaLM's 6N + 12 L H Q T), for the MFU.
double training_flops_per_token(const fsdpp::LlamaConfig& config, int64_t seq);

}  // namespace train_gpt
