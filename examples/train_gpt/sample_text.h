#pragma once
// Text generated at the end of a run from the sharded model itself, on every rank (each forward
// gathers one layer at a time, as in training), so the sample needs no more memory than an
// evaluation step: no rank ever holds the whole model.
#include <cstdint>
#include <string>

#include "model.h"

namespace train_gpt {

// `count` tokens continuing `prompt`, each drawn from the model's distribution at temperature
// 0.8 by rank 0 (a generator seeded with `seed`, so the sample repeats) and broadcast. Collective.
std::string sample_text(Model& model, const TextTokenizer& tokenizer, int64_t context, const std::string& prompt,
                        int64_t count, uint64_t seed);
// Bytes that are not well-formed UTF-8, and control bytes other than newline and tab, shown as
// '?', so a sample never garbles a terminal.
std::string printable(const std::string& text);

}  // namespace train_gpt
