// Writes the real part of the seed corpus: small checkpoints and safetensors files saved by
// fsdpp itself (every dtype, 0-d and empty tensors, row, column and grid chunks, every kind of
// plain value). Built and run by fuzz/seeds/make_corpus.sh against the main build.
//   save_seed_checkpoints OUT_DIR   ->  OUT_DIR/<name>/ (checkpoints), OUT_DIR/<name>.safetensors
#include <cmath>
#include <cstdio>
#include <string>

#include <ATen/ATen.h>

#include <fsdpp/checkpoint.h>

namespace ckpt = fsdpp::checkpoint;

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUT_DIR\n", argv[0]);
    return 2;
  }
  const std::string out = argv[1];
  const at::Tensor w = at::arange(32, at::kFloat).reshape({8, 4});
  // Rows in two chunks, a whole tensor, and every kind of plain value.
  ckpt::save({{"w", ckpt::Entry::sharded({8, 4}, {ckpt::LocalShard{w.slice(0, 0, 4).clone(), {0, 0}},
                                                  ckpt::LocalShard{w.slice(0, 4, 8).clone(), {4, 0}}})},
              {"b", at::linspace(-1, 1, 4)},
              {"step", int64_t{7}},
              {"lr", 1e-3},
              {"loss_scale", std::nan("")},
              {"max_norm", INFINITY},
              {"name", "gpt-tiny"},
              {"rng", ckpt::Entry::bytes(std::string("\x00\x01\xfe\xff", 4))}},
             out + "/rows");
  // Column chunks, a 2x2 grid, a 0-d tensor and an empty one.
  const at::Tensor g = at::arange(24, at::kDouble).reshape({4, 6});
  ckpt::save({{"cols", ckpt::Entry::sharded({4, 6}, {ckpt::LocalShard{g.slice(1, 0, 2).clone(), {0, 0}},
                                                     ckpt::LocalShard{g.slice(1, 2, 6).clone(), {0, 2}}})},
              {"grid", ckpt::Entry::sharded({4, 6}, {ckpt::LocalShard{g.slice(0, 0, 2).slice(1, 0, 3).clone(), {0, 0}},
                                                     ckpt::LocalShard{g.slice(0, 0, 2).slice(1, 3, 6).clone(), {0, 3}},
                                                     ckpt::LocalShard{g.slice(0, 2, 4).slice(1, 0, 3).clone(), {2, 0}},
                                                     ckpt::LocalShard{g.slice(0, 2, 4).slice(1, 3, 6).clone(), {2, 3}}})},
              {"scalar", at::scalar_tensor(3.5, at::kFloat)},
              {"empty", at::zeros({0, 3}, at::kFloat)}},
             out + "/grid");
  // One small tensor of every dtype the format names.
  std::map<std::string, at::Tensor> dtypes;
  for (auto t : {at::kDouble, at::kFloat, at::kHalf, at::kBFloat16, at::kLong, at::kInt, at::kShort, at::kChar,
                 at::kByte, at::kBool})
    dtypes[c10::toString(t)] = at::arange(3, at::kFloat).to(t);
  ckpt::State s;
  for (const auto& [name, t] : dtypes) s[name] = t;
  ckpt::save(s, out + "/dtypes");
  ckpt::save_safetensors(dtypes, out + "/dtypes.safetensors", {{"format", "pt"}});
  ckpt::save_safetensors({{"a", at::zeros({0}, at::kFloat)}, {"b", at::ones({2, 2}, at::kHalf)}},
                         out + "/empty_first.safetensors");
  ckpt::save_safetensors({}, out + "/no_tensors.safetensors");
  return 0;
}
