#pragma once
// Text generated from an exported model.safetensors: the file is read back into a plain
// (unsharded) Transformer, which is how another tool would use it.
#include <cstdint>
#include <string>

#include "transformer.h"

namespace train_gpt {

// `count` bytes continuing `prompt`, each drawn from the model's distribution at temperature
// 0.8 (a generator seeded with `seed`, so the sample repeats).
std::string sample_text(const std::string& safetensors_file, const fsdpp::examples::TransformerArgs& args,
                        const std::string& prompt, int64_t count, uint64_t seed);
// Bytes that are not well-formed UTF-8, and control bytes other than newline and tab, shown as
// '?', so a sample never garbles a terminal.
std::string printable(const std::string& text);

}  // namespace train_gpt
