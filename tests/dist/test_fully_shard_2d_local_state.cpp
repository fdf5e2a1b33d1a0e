// LOCAL_STATE_DICT of tensor-parallel models: each rank's own tensors. A TP parameter outside
// FSDP units is its TP-local part, whole; an FSDP unit's parameters are its '_flat_param' as
// for any FSDP model (for a 2-D model, the flat FSDP shards of this tp rank's TP-local parts).
// They load back into the same layout, and a dict of another layout is refused naming the key
// and both shapes.
#include <functional>
#include <map>
#include <string>

#include <fsdpp/state_dict.h>

#include "dist/fully_shard_2d_fixtures.h"
#include "harness/error_of.h"

namespace fsdpp {
namespace {

using testing::error_of;

constexpr int64_t kDim = 17;  // in_proj [51, 17]: TP rows 26 / 25 at tp 2, 13 / 13 / 13 / 12 at tp 4

void train_one_step(torch::nn::Module& model, const std::function<at::Tensor(const at::Tensor&)>& forward) {
  torch::optim::Adam opt(model.parameters(), 1e-2);
  torch::manual_seed(3);
  forward(torch::randn({4, kDim})).sum().backward();
  opt.step();
}

StateDict local_state_dict(torch::nn::Module& model) {
  auto scope = state_dict_type(model, StateDictType::LOCAL_STATE_DICT);
  return state_dict(model);
}

IncompatibleKeys load_local(torch::nn::Module& model, const StateDict& sd) {
  auto scope = state_dict_type(model, StateDictType::LOCAL_STATE_DICT);
  return load_state_dict(model, sd);
}

std::string shape_of(const std::vector<int64_t>& shape) {
  std::string out;
  for (int64_t s : shape) out += (out.empty() ? "" : ", ") + std::to_string(s);
  return "[" + out + "]";
}

// A TP-only model (tp 2 of a 2 x 2 mesh): LOCAL holds every parameter as the module does (TP
// Shard: this rank's part; Replicate: whole), round-trips, and a tp 4 model refuses it.
TEST(FullyShard2DLocalStateDict, TensorParallelRoundTripAndOtherLayout) {
  run_ranks(4, [](RankContext& ctx) {
    const DeviceMesh mesh = init_device_mesh(ctx.world, {2, 2}, {"dp", "tp"});
    const int tp = mesh.get_local_rank("tp");
    Sequential model = make_mlp_stack(kDim);
    parallelize_module(*model, mesh["tp"], mlp_stack_plan(model->size()));
    train_one_step(*model, [&](const at::Tensor& x) { return model->forward(x); });
    const auto expected = global_params(*model);

    const StateDict sd = local_state_dict(*model);
    EXPECT_TRUE(sd.type == StateDictType::LOCAL_STATE_DICT);
    ASSERT_EQ(sd.keys(), model->named_parameters().keys());
    const at::Tensor w = sd.at("0.in_proj.weight").tensor();  // a whole tensor: this rank's rows
    EXPECT_EQ(w.sizes().vec(), (std::vector<int64_t>{tp == 0 ? 26 : 25, kDim}));
    EXPECT_TRUE(w.equal(expected.at("0.in_proj.weight").narrow(0, 26 * tp, w.size(0))));
    EXPECT_EQ(sd.at("0.out_proj.bias").tensor().sizes().vec(), (std::vector<int64_t>{kDim}));  // Replicate

    Sequential fresh = make_mlp_stack(kDim);
    parallelize_module(*fresh, mesh["tp"], mlp_stack_plan(fresh->size()));
    ASSERT_FALSE(global_params(*fresh).at("0.in_proj.weight").equal(expected.at("0.in_proj.weight")));
    load_local(*fresh, sd);
    for (const auto& [key, value] : global_params(*fresh)) EXPECT_TRUE(value.equal(expected.at(key))) << key;

    // Another layout (tp 4 over the world): this rank's part has another shape.
    Sequential wide = make_mlp_stack(kDim);
    parallelize_module(*wide, init_device_mesh(ctx.world, {4}, {"tp"}), mlp_stack_plan(wide->size()));
    const std::string e = error_of([&] { load_local(*wide, sd); });
    const int64_t wide_rows = ctx.rank == 3 ? 12 : 13;
    EXPECT_NE(e.find("size mismatch for '0.in_proj.weight': the LOCAL_STATE_DICT holds shape " +
                     shape_of({tp == 0 ? 26 : 25, kDim}) + ", but the model's LOCAL layout is this rank's "
                     "tensor-parallel part of '0.in_proj.weight' (global shape [51, 17], Shard(0) over the TP group "
                     "of 4 ranks), shape " + shape_of({wide_rows, kDim})),
              std::string::npos)
        << e;
    // A SHARDED value (a ShardedTensor) where LOCAL holds the part whole.
    StateDict sharded_value = sd;
    sharded_value.set("0.in_proj.weight", get_model_state_dict(model).at("0.in_proj.weight"));
    const std::string s = error_of([&] { load_local(*fresh, sharded_value); });
    EXPECT_NE(s.find("'0.in_proj.weight' is a ShardedTensor of global shape [51, 17], but a LOCAL_STATE_DICT holds "
                     "this rank's tensor-parallel part"),
              std::string::npos)
        << s;
  });
}

// FSDP x TP (dp 2 x tp 2): LOCAL holds each unit's flat parameter (a ShardedTensor over the dp
// group of this tp rank's TP-local parts), round-trips, and a (1, 4) model's units refuse it.
TEST(FullyShard2DLocalStateDict, TwoDRoundTripAndOtherLayout) {
  run_ranks(4, [](RankContext& ctx) {
    const DeviceMesh mesh = init_device_mesh(ctx.world, {2, 2}, {"dp", "tp"});
    const Case2D c{true, false, kDim};
    FSDPSequential model = make_2d(kDim, mesh["dp"], mesh["tp"], c);
    train_one_step(*model, [&](const at::Tensor& x) { return model->forward(x); });
    const auto expected = global_params(*model);

    const StateDict sd = local_state_dict(*model);
    ASSERT_EQ(sd.keys(), (std::vector<std::string>{"0._flat_param", "1._flat_param", "2._flat_param"}));
    const ShardedTensor& flat = sd.at("0._flat_param").sharded_tensor();
    EXPECT_EQ(flat.process_group().ranks(), mesh["dp"].ranks());
    const int tp = mesh.get_local_rank("tp");
    const int64_t rows = tp == 0 ? 26 : 25;  // in_proj's TP rows; out_proj's TP columns
    EXPECT_EQ(flat.size(), (std::vector<int64_t>{rows * kDim + rows + kDim * rows + kDim}));

    FSDPSequential fresh = make_2d(kDim, mesh["dp"], mesh["tp"], c);
    ASSERT_FALSE(global_params(*fresh).at("0.in_proj.weight").equal(expected.at("0.in_proj.weight")));
    load_local(*fresh, sd);
    for (const auto& [key, value] : global_params(*fresh)) EXPECT_TRUE(value.equal(expected.at(key))) << key;

    const DeviceMesh wide_mesh = init_device_mesh(ctx.world, {1, 4}, {"dp", "tp"});
    FSDPSequential wide = make_2d(kDim, wide_mesh["dp"], wide_mesh["tp"], c);
    const std::string e = error_of([&] { load_local(*wide, sd); });
    const int64_t wide_rows = ctx.rank == 3 ? 12 : 13;
    EXPECT_NE(e.find("size mismatch for '0._flat_param': copying a param with shape " +
                     shape_of({rows * kDim + rows + kDim * rows + kDim}) +
                     " from the state dict, the shape in the current model is " +
                     shape_of({wide_rows * kDim + wide_rows + kDim * wide_rows + kDim})),
              std::string::npos)
        << e;
  });
}

}  // namespace
}  // namespace fsdpp
