// HSDP (seed 001's TestFullyShardHSDPTraining) and FSDP1's sharding strategies (NO_SHARD,
// SHARD_GRAD_OP, HYBRID_SHARD; seed 002's mixed sharding): parity with DDP on the same data,
// the collectives and bytes of a step, state dicts and checkpoints across layouts, misuse.
#include <fsdpp/activation_checkpointing.h>
#include <fsdpp/checkpoint.h>
#include <fsdpp/comm_debug_mode.h>
#include <fsdpp/distributed_data_parallel.h>
#include <fsdpp/error.h>
#include <fsdpp/state_dict.h>

#include "dist/fsdp_test_util.h"
#include "dist/hsdp_fixtures.h"

namespace fsdpp {
namespace {

namespace ckpt = fsdpp::checkpoint;

// test_train_parity_hsdp at world size 4: a 2 x 2 mesh.
TEST(FullyShardHSDP, TrainParityHsdp2x2) {
  run_ranks(4, [](RankContext& ctx) {
    const auto options = FullyShardOptions().mesh(hsdp_mesh(ctx, 2, 2));
    for (const auto& c : seed_sweep()) {
      check_parity_with_ddp(ctx, options, 2, c);
      if (::testing::Test::HasFailure()) return;
    }
  });
}

// At world size 2: replicate only (2 x 1) and shard only (1 x 2).
TEST(FullyShardHSDP, TrainParityHsdp2x1And1x2) {
  run_ranks(2, [](RankContext& ctx) {
    for (int shard_size : {1, 2}) {
      const auto options = FullyShardOptions().mesh(hsdp_mesh(ctx, 2 / shard_size, shard_size));
      for (const auto& c : seed_sweep()) {
        check_parity_with_ddp(ctx, options, shard_size, c);
        if (::testing::Test::HasFailure()) return;
      }
    }
  });
}

// Seed 001's test_gradient_accumulation with reduce_scatter_only on the 2 x 2 mesh: the
// microbatches before the last reduce-scatter, and only the last all-reduces their sum.
TEST(FullyShardHSDP, GradientAccumulationReduceScatterOnly) {
  run_ranks(4, [](RankContext& ctx) {
    const auto options = FullyShardOptions().mesh(hsdp_mesh(ctx, 2, 2));
    for (bool raf : {false, true})
      for (int64_t dim : {3, 17}) {
        HSDPCase c;
        c.reshard_after_forward = raf;
        c.mlp_dim = dim;
        c.reduce_scatter_only = true;
        check_parity_with_ddp(ctx, options, 2, c);
        if (::testing::Test::HasFailure()) return;
      }
  });
}

// One step on the 2 x 2 mesh: each unit all-gathers and reduce-scatters within its shard group
// ((S - 1) / S of its padded size per rank) and all-reduces only its gradient shard across the
// replicate group: summed over the ranks, 2 (R - 1) x the shard bytes per replicate group, so
// on average 2 (R - 1) / R x Psi / S per rank. Without gradient sync nothing is reduced.
TEST(FullyShardHSDP, CollectivesAndBytesOfAStep) {
  run_ranks(4, [](RankContext& ctx) {
    const int64_t dim = 16;
    const auto options = FullyShardOptions().mesh(hsdp_mesh(ctx, 2, 2)).reshard_after_forward(false);
    FSDPSequential model = make_hsdp_sharded(dim, options, false);
    auto units = fsdp_units(*model);
    ASSERT_EQ(units.size(), 4u);
    int64_t padded = 0;
    for (auto* u : units) padded += u->unsharded_padded_numel();
    const int64_t shard_bytes = padded / 2 * 4;

    model->set_requires_gradient_sync(false);
    {
      CommDebugMode comm;
      model->forward(torch::randn({8, dim})).sum().backward();
      EXPECT_EQ(comm.count("reduce_scatter_tensor"), 0);
      EXPECT_EQ(comm.count("all_reduce"), 0);
      EXPECT_EQ(comm.count("all_gather_into_tensor"), 4);
    }
    // A backward without sync still reshards (reshard_after_backward): the next forward gathers again.
    model->set_requires_gradient_sync(true);
    CommDebugMode comm;
    model->forward(torch::randn({8, dim})).sum().backward();
    EXPECT_EQ(comm.count("all_gather_into_tensor"), 4);
    EXPECT_EQ(comm.bytes_sent("all_gather_into_tensor"), shard_bytes) << "(S - 1) / S of each unit";
    EXPECT_EQ(comm.count("reduce_scatter_tensor"), 4);
    EXPECT_EQ(comm.count("all_reduce"), 4);
    EXPECT_EQ(comm.bytes_sent("reduce_scatter_tensor"), shard_bytes) << "(S - 1) / S of each unit";
    at::Tensor all_reduce_bytes = at::tensor({comm.bytes_sent("all_reduce")}, at::kLong);
    all_reduce(all_reduce_bytes, ReduceOp::SUM, ctx.world);
    EXPECT_EQ(all_reduce_bytes.item<int64_t>(), 2 * 2 * shard_bytes) << "two replicate groups, 2 (R - 1) x shard each";
  });
}

// FULL state dicts of an HSDP model hold the plain model's keys and values; a SHARDED
// checkpoint saved by the 2 x 2 model (each shard written once though held twice) loads into
// 1-D FSDP over all four ranks and into the plain model.
TEST(FullyShardHSDP, StateDictsAndCheckpointAcrossLayouts) {
  run_ranks(4, [](RankContext& ctx) {
    const int64_t dim = 17;
    FSDPSequential model = make_hsdp_sharded(dim, FullyShardOptions().mesh(hsdp_mesh(ctx, 2, 2)), false);
    torch::optim::Adam opt(model->parameters(), 1e-2);
    torch::manual_seed(5);  // the same data on every rank: the replicas agree anyway
    model->forward(torch::randn({8, dim})).sum().backward();
    opt.step();
    auto trained = full_params(*model);

    StateDict full = get_model_state_dict(*model, StateDictOptions().full_state_dict(true));
    Sequential plain = make_hsdp_plain(dim);
    ASSERT_EQ(full.size(), plain->named_parameters().size() + plain->named_buffers().size());
    size_t i = 0;
    for (const auto& p : plain->named_parameters()) {
      ASSERT_TRUE(full.contains(p.key())) << p.key();
      EXPECT_TRUE(at::equal(full.at(p.key()).tensor(), trained[i++])) << p.key();
    }

    const std::string dir = ctx.temp_dir + "/hsdp";
    ckpt::save(get_model_state_dict(*model), dir);
    FSDPSequential flat = make_hsdp_sharded(dim, FullyShardOptions(), false);
    StateDict sd = get_model_state_dict(*flat);
    ckpt::load(sd, dir);
    set_model_state_dict(*flat, sd);
    auto loaded = full_params(*flat);
    for (size_t k = 0; k < trained.size(); ++k) EXPECT_TRUE(at::equal(loaded[k], trained[k])) << "1-D param " << k;

    StateDict plain_sd = get_model_state_dict(*plain);
    ckpt::load(plain_sd, dir);
    set_model_state_dict(*plain, plain_sd);
    auto plain_params = plain->parameters();
    for (size_t k = 0; k < trained.size(); ++k)
      EXPECT_TRUE(at::equal(plain_params[k], trained[k])) << "plain param " << k;
  });
}

class FullyShardShardingStrategy : public testing::WorldSizeTest {};

// NO_SHARD: every rank holds the whole parameters and gradients are all-reduced: DDP's
// results, at every world size.
TEST_P(FullyShardShardingStrategy, NoShardTrainsAsDDP) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    const auto options = FullyShardOptions().sharding_strategy(ShardingStrategy::NO_SHARD);
    for (bool sync_last : {true, false}) {
      HSDPCase c;
      c.sync_gradients_at_last_batch = sync_last;
      c.mlp_dim = 17;
      check_parity_with_ddp(ctx, options, 1, c);
    }
    FSDPSequential model = make_hsdp_sharded(5, options, false);
    const auto plain = make_hsdp_plain(5)->parameters();
    auto params = model->parameters();
    for (size_t i = 0; i < params.size(); ++i) EXPECT_EQ(params[i].sizes(), plain[i].sizes()) << "whole on every rank";
    CommDebugMode comm;
    model->forward(torch::randn({4, 5})).sum().backward();
    EXPECT_EQ(comm.count("all_reduce"), ctx.world_size > 1 ? 4 : 0);
    EXPECT_EQ(comm.bytes_sent("all_gather_into_tensor"), 0);
    EXPECT_EQ(comm.bytes_sent("reduce_scatter_tensor"), 0);
  });
}

// SHARD_GRAD_OP: FULL_SHARD without the all-gathers of backward.
TEST_P(FullyShardShardingStrategy, ShardGradOpKeepsParametersFromForwardToBackward) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    const auto options = FullyShardOptions().sharding_strategy(ShardingStrategy::SHARD_GRAD_OP);
    HSDPCase c;
    c.reshard_after_forward = true;  // overridden by the strategy
    check_parity_with_ddp(ctx, FullyShardOptions(options), ctx.world_size, c);
    FSDPSequential model = make_hsdp_sharded(16, options, false);
    CommDebugMode comm;
    model->forward(torch::randn({4, 16})).sum().backward();
    EXPECT_EQ(comm.count("all_gather_into_tensor"), 4) << "forward only";
    EXPECT_EQ(comm.count("reduce_scatter_tensor"), 4);
  });
}

// HYBRID_SHARD without a mesh: nodes of LOCAL_WORLD_SIZE consecutive ranks, the same training
// as the (2, 2) mesh bit for bit.
TEST(FullyShardShardingStrategyHybrid, HybridShardShardsWithinNodes) {
  testing::RunOptions run;
  run.env = {"LOCAL_WORLD_SIZE=2"};
  run_ranks(
      4,
      [](RankContext& ctx) {
        const auto hybrid = FullyShardOptions().sharding_strategy(ShardingStrategy::HYBRID_SHARD);
        HSDPCase c;
        c.mlp_dim = 3;
        check_parity_with_ddp(ctx, hybrid, 2, c);
        auto train = [&](const FullyShardOptions& options) {
          FSDPSequential model = make_hsdp_sharded(16, options, false);
          torch::optim::SGD opt(model->parameters(), 0.1);
          torch::manual_seed(9 + ctx.rank);
          for (int i = 0; i < 3; ++i) {
            opt.zero_grad();
            model->forward(torch::randn({4, 16})).sum().backward();
            opt.step();
          }
          EXPECT_EQ(model->parameters()[0].size(0), 8) << "16 rows over 2 ranks";
          return full_params(*model);
        };
        auto by_node = train(hybrid);
        auto by_mesh = train(FullyShardOptions().mesh(hsdp_mesh(ctx, 2, 2)));
        for (size_t i = 0; i < by_node.size(); ++i) EXPECT_TRUE(at::equal(by_node[i], by_mesh[i])) << i;
      },
      run);
}

// Seed 002's test_full_state_dict_save_load_mixed_sharding, in its topology: a NO_SHARD root
// (holding the LayerNorm and the last MLP) over FULL_SHARD units (the first two MLPs; the seed's
// fully_shard(u1) under fully_shard(root, NO_SHARD)). Trained 3 SGD steps on each rank's slice of
// a global batch, its FULL dict equals the plain model trained the same steps on the whole batch
// (the independent reference); a model wrapped the same way with every parameter zeroed loads it,
// then holds those values and computes the reference's output.
TEST_P(FullyShardShardingStrategy, FullStateDictSaveLoadMixedSharding) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    const int n = ctx.world_size, rank = ctx.rank;
    const int64_t dim = 7, local = kGlobalBatch / n;
    auto build = [&] {
      Sequential p = make_hsdp_plain(dim);
      Sequential seq;
      seq->push_back(p->ptr<torch::nn::LayerNormImpl>(0));
      seq->push_back(fully_shard(p->ptr<MLPImpl>(1), FullyShardOptions()));
      seq->push_back(fully_shard(p->ptr<MLPImpl>(2), FullyShardOptions()));
      seq->push_back(p->ptr<MLPImpl>(3));
      return FSDPSequential(seq, FullyShardOptions().sharding_strategy(ShardingStrategy::NO_SHARD));
    };
    auto global_batch = [&](int step) {
      torch::manual_seed(11 + step);
      return torch::randn({kGlobalBatch, dim});
    };
    Sequential ref = make_hsdp_plain(dim);
    FSDPSequential model = build();
    {  // The seed's topology: the children's parameters are shards, the root's whole.
      auto ref_named = ref->named_parameters();
      auto named = model->named_parameters();
      ASSERT_EQ(named.size(), ref_named.size());
      for (size_t i = 0; i < named.size(); ++i) {
        const std::string key = ref_named[i].key();
        const bool child = key.rfind("1.", 0) == 0 || key.rfind("2.", 0) == 0;
        EXPECT_EQ(named[i].value().sizes(), child ? shard_rows(ref_named[i].value(), rank, n).sizes()
                                                  : ref_named[i].value().sizes())
            << key << (child ? " is not a shard" : " is not whole");
      }
    }
    torch::optim::SGD ref_opt(ref->parameters(), 0.1), opt(model->parameters(), 0.1);
    for (int step = 0; step < 3; ++step) {
      ref_opt.zero_grad();
      opt.zero_grad();
      at::Tensor x = global_batch(step);
      ref->forward(x).pow(2).mean().backward();
      model->forward(x.narrow(0, rank * local, local)).pow(2).mean().backward();
      ref_opt.step();
      opt.step();
    }
    StateDict full = get_model_state_dict(*model, StateDictOptions().full_state_dict(true));
    StateDict expected = get_model_state_dict(*ref);
    ASSERT_EQ(full.keys(), expected.keys());
    for (const auto& key : expected.keys()) {
      ASSERT_TRUE(full.at(key).is_tensor()) << key;
      expect_close(full.at(key).tensor(), expected.at(key).tensor(), "FULL " + key + " against the plain model");
    }

    FSDPSequential fresh = build();
    {
      torch::NoGradGuard no_grad;
      for (auto& p : fresh->parameters()) p.zero_();
    }
    for (const auto& p : full_params(*fresh)) ASSERT_EQ(p.count_nonzero().item<int64_t>(), 0) << "zeroed before the load";
    auto result = set_model_state_dict(*fresh, full, StateDictOptions().full_state_dict(true));
    EXPECT_TRUE(result.missing_keys.empty() && result.unexpected_keys.empty());
    auto loaded = full_params(*fresh);
    const auto keys = expected.keys();
    ASSERT_EQ(loaded.size(), keys.size());
    for (size_t k = 0; k < keys.size(); ++k)
      EXPECT_TRUE(at::equal(loaded[k], full.at(keys[k]).tensor())) << "loaded " << keys[k];
    at::Tensor x = global_batch(100);
    torch::NoGradGuard no_grad;
    const at::Tensor want = ref->forward(x).narrow(0, rank * local, local);
    expect_close(fresh->forward(x.narrow(0, rank * local, local)), want, "the loaded model's output");
    expect_close(model->forward(x.narrow(0, rank * local, local)), want, "the trained model's output");
  });
}

TEST(FullyShardHSDPErrors, MeshesAndStrategiesThatDisagreeAreRefused) {
  run_ranks(4, [](RankContext& ctx) {
    auto refused = [&](const FullyShardOptions& options, const std::string& expected) {
      Sequential plain = make_hsdp_plain(4);
      try {
        FSDPSequential model(plain, options);
        ADD_FAILURE() << "accepted; expected: " << expected;
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find(expected), std::string::npos) << e.what();
      }
    };
    // A 3-D mesh: FullyShardBadInput.MeshThatDoesNotMatchTheGroup.
    DeviceMesh two = hsdp_mesh(ctx, 2, 2);
    refused(FullyShardOptions().mesh(two).sharding_strategy(ShardingStrategy::NO_SHARD),
            "sharding_strategy NO_SHARD shards across one dimension, but the mesh has 2");
    refused(FullyShardOptions().mesh(two).process_group(ctx.world), "pass a 2-D mesh or a process_group, not both");
    refused(FullyShardOptions().mesh(init_device_mesh(ctx.world, {4})).sharding_strategy(ShardingStrategy::HYBRID_SHARD),
            "HYBRID_SHARD needs a 2-D mesh");
    try {
      init_device_mesh(ctx.world, {3, 2});
      ADD_FAILURE() << "a 3 x 2 mesh over 4 ranks was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("a mesh of 6 ranks does not match group world of size 4"), std::string::npos)
          << e.what();
    }
  });
}

// A replicate all-reduce that fails (here the cross-rank check: the two replicas reduce in
// different dtypes, each consistent within its shard group) surfaces from backward with the
// collective's own message, as a synchronous all_reduce's failure would.
TEST(FullyShardHSDPErrors, AFailedReplicateAllReduceSurfacesFromBackward) {
  run_ranks(4, [](RankContext& ctx) {
    ASSERT_TRUE(ctx.world.check_collectives()) << "the harness checks collectives across ranks";
    const DeviceMesh mesh = hsdp_mesh(ctx, 2, 2);
    const at::ScalarType reduce_dtype = ctx.rank < 2 ? at::kDouble : at::kFloat;  // replicate coordinate 0 or 1
    const auto options = FullyShardOptions().mesh(mesh).mp_policy(MixedPrecisionPolicy().reduce_dtype(reduce_dtype));
    FSDPSequential model = make_hsdp_sharded(4, options, false);
    std::string error = "no error";
    try {
      model->forward(torch::randn({8, 4})).sum().backward();
    } catch (const std::exception& e) {
      error = e.what();
    }
    const std::string replicate = mesh.get_group("replicate").name();
    EXPECT_NE(error.find("ranks of " + replicate + " disagree on a collective"), std::string::npos) << error;
    EXPECT_NE(error.find("all_reduce #"), std::string::npos) << error;
    EXPECT_NE(error.find("Double"), std::string::npos) << error;
    EXPECT_NE(error.find("Float"), std::string::npos) << error;
  });
}

TEST(FullyShardHSDPErrors, HybridShardNeedsANodeSizeThatDividesTheGroup) {
  testing::RunOptions run;
  run.env = {"LOCAL_WORLD_SIZE=3"};
  run_ranks(
      4,
      [](RankContext&) {
        Sequential plain = make_hsdp_plain(4);
        try {
          FSDPSequential model(plain, FullyShardOptions().sharding_strategy(ShardingStrategy::HYBRID_SHARD));
          FAIL() << "accepted";
        } catch (const Error& e) {
          EXPECT_NE(std::string(e.what()).find("LOCAL_WORLD_SIZE = 3 ranks, which does not divide group"),
                    std::string::npos)
              << e.what();
        }
      },
      run);
}

FSDPP_INSTANTIATE_WORLD_SIZES(FullyShardShardingStrategy);

}  // namespace
}  // namespace fsdpp
