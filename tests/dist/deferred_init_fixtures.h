#pragma once
// What the deferred-initialization tests share (CPU and GPU): a small transformer's shape and
// the initialization both materialize it with.
#include <cstdint>

#include <fsdpp/deferred_init.h>

#include "transformer.h"

namespace fsdpp::testing {

// 4 blocks of dim 16 over a vocabulary of 40: small, with more blocks than the largest world size.
inline examples::TransformerArgs small_transformer_args() {
  examples::TransformerArgs args;
  args.n_layers = 4;
  args.dim = 16;
  args.vocab_size = 40;
  return args;
}

inline MaterializeOptions transformer_init_options(uint64_t seed = 0) {
  return MaterializeOptions().seed(seed).param_init_fn(examples::init_transformer_module);
}

}  // namespace fsdpp::testing
