// The names the snippets of docs/api.md and README.md use without declaring them (the model, the
// optimizer, the process group, a batch, ...), as members of context structs. Each snippet
// becomes a member function of a struct derived from its context (tests/docs/doc_snippets.py);
// nothing here is ever constructed or run: the DocSnippets.Compile test only compiles.
#pragma once
#include <string>
#include <utility>
#include <vector>

#include <torch/torch.h>

#include <fsdpp/fsdpp.h>

namespace fsdpp_doc {

namespace ckpt = fsdpp::checkpoint;  // as docs/api.md's first checkpoint snippet says

struct MyNetImpl : torch::nn::Module {
  MyNetImpl() : fc(register_module("fc", torch::nn::Linear(4, 4))) {}
  torch::Tensor forward(torch::Tensor x) { return fc->forward(x); }
  torch::nn::Linear fc;
};
TORCH_MODULE(MyNet);

struct ModelArgs {
  int64_t dim = 16;
  int64_t n_layers = 2;
};

struct TransformerBlockImpl : torch::nn::Module {
  explicit TransformerBlockImpl(const ModelArgs& args)
      : ffn(register_module("ffn", torch::nn::Linear(args.dim, args.dim))) {}
  torch::Tensor forward(torch::Tensor x) { return x + torch::relu(ffn->forward(x)); }
  torch::nn::Linear ffn;
};
TORCH_MODULE(TransformerBlock);
using BlockImpl = TransformerBlockImpl;
using Block = TransformerBlock;

struct TransformerImpl : torch::nn::Module {
  explicit TransformerImpl(const ModelArgs& args) : blocks(register_module("blocks", torch::nn::Sequential())) {
    for (int64_t i = 0; i < args.n_layers; ++i) blocks->push_back(TransformerBlock(args));
  }
  torch::Tensor forward(torch::Tensor x) { return blocks->forward(x); }
  torch::nn::Sequential blocks;
};
TORCH_MODULE(Transformer);

using Batches = std::vector<std::pair<torch::Tensor, torch::Tensor>>;

// The default context: one training program's state.
struct Training {
  fsdpp::ProcessGroup world, group, tp_group;
  int rank, r, n, k;
  ModelArgs args;
  torch::nn::Sequential model, model2, plain_model, net;
  torch::optim::Adam opt;
  torch::Tensor x, y, t, loss, bias, my_rows;
  Batches my_slice_of_the_data, my_slice_of_each_global_batch;
  int64_t step, row_offset, out_features, in_features;
  std::string dir, rng_state_bytes;
  fsdpp::DistributedDataParallel<MyNetImpl> ddp;

  void compute();
  void train_step();
  void train_some_more();
  torch::Tensor loss_fn(const torch::Tensor& output, const torch::Tensor& target);
};

// ZeroRedundancyOptimizer's section: `opt` is one.
struct Zero : Training {
  fsdpp::ZeroRedundancyOptimizer<torch::optim::Adam> opt;
};

// DDP's join section: this rank's batches (as many as it has) and a ZeRO optimizer beside DDP.
struct DdpJoin : Training {
  Batches my_batches;
  fsdpp::ZeroRedundancyOptimizer<torch::optim::Adam> zero;
};

// Deferred initialization's section: wrapping options and a user's param_init_fn.
struct DeferredInit : Training {
  fsdpp::FullyShardOptions opts;
  static bool my_init(torch::nn::Module& module);
};

}  // namespace fsdpp_doc
