// train_gpt: trains a small GPT on a text file across ranks, as nanoGPT or torchtitan are used.
// Byte tokens, FSDP with every block a unit (HSDP with --replicate, bf16 with --param-dtype,
// activation checkpointing), AdamW with warm-up + cosine and global gradient clipping, progress
// and validation lines, background checkpoints that --resume continues from at any world size,
// and at the end one model.safetensors, a text sample generated from it and a summary. On a GPU
// (--device, cuda:LOCAL_RANK where one is present) the shards live there and NCCL moves them.
//   build/tools/fsdpp-run --nproc-per-node 4 build/examples/train_gpt --data corpus.txt --ckpt-dir run
// docs/train_gpt.md lists the flags and shows a run.
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>

#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <fsdpp/checkpoint.h>
#include <fsdpp/fsdpp.h>

#include "checkpoint_dir.h"
#include "config.h"
#include "progress.h"
#include "sample_text.h"
#include "text_corpus.h"
#include "transformer.h"

namespace ckpt = fsdpp::checkpoint;
using fsdpp::examples::Transformer;
using fsdpp::examples::TransformerArgs;
using fsdpp::examples::TransformerBlockImpl;

namespace train_gpt {
namespace {

using Clock = std::chrono::steady_clock;
using Model = fsdpp::FullyShardedDataParallel<fsdpp::examples::TransformerImpl>;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }
double mib(double bytes) { return bytes / (1 << 20); }

TransformerArgs model_args(const Config& c) {
  TransformerArgs args;
  args.n_layers = c.layers;
  args.vocab_size = 256;
  args.max_seq_len = c.seq;
  args.dim = c.dim;
  args.n_heads = c.heads;
  return args;
}

// --device: cuda:LOCAL_RANK (ranks beyond the node's GPUs share them round-robin), or the CPU.
at::Device compute_device(const Config& c) {
  if (c.device == "cpu" || (c.device == "auto" && !torch::cuda::is_available())) return at::kCPU;
  const int64_t gpus = static_cast<int64_t>(torch::cuda::device_count());
  if (gpus == 0) throw std::invalid_argument("--device cuda: this process sees no CUDA device");
  return at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(fsdpp::get_local_rank() % gpus));
}

// NCCL for the GPU's tensors where each rank has a GPU of its own; Gloo, staging through host
// memory, where ranks share one (NCCL refuses two ranks on one device).
std::string backend_for(const at::Device& device) {
  if (device.is_cpu()) return "gloo";
  return fsdpp::get_local_world_size() <= static_cast<int>(torch::cuda::device_count()) ? "cpu:gloo,cuda:nccl" : "gloo";
}

// Parameters of the model the flags describe (for the MFU), counted on the meta device.
int64_t parameter_count(const Config& c) {
  Transformer net = fsdpp::deferred_init([&] { return Transformer(model_args(c)); });
  int64_t n = 0;
  for (const auto& p : net->parameters()) n += p.numel();
  return n;
}

// --init deferred: built on the meta device, sharded, then each rank initializes its shards one
// block at a time (or leaves them to the checkpoint it resumes from); eager: the whole model on
// every rank first. The two give different (equally distributed) initial weights. On a GPU only
// the shards land there (FSDP1's device_id).
Model build_model(const Config& c, const fsdpp::ProcessGroup& world, const at::Device& device, bool resuming) {
  const bool deferred = c.init == "deferred";
  torch::manual_seed(c.seed);  // the same initial weights on every rank
  Transformer net = deferred ? fsdpp::deferred_init([&] { return Transformer(model_args(c)); }) : Transformer(model_args(c));
  auto options = fsdpp::FullyShardOptions().auto_wrap_policy(fsdpp::ModuleWrapPolicy<TransformerBlockImpl>());
  if (!device.is_cpu()) options.device_id(device);
  if (c.activation_checkpointing) {
    fsdpp::apply_activation_checkpointing(*net, fsdpp::ModuleWrapPolicy<TransformerBlockImpl>());
    options.auto_wrap_policy(fsdpp::ModuleWrapPolicy<fsdpp::CheckpointWrapperImpl<TransformerBlockImpl>>());
  }
  if (c.replicate > 1) {
    if (world.size() % c.replicate != 0)
      throw std::invalid_argument("--replicate " + std::to_string(c.replicate) + " does not divide the world size " +
                                  std::to_string(world.size()));
    options.mesh(fsdpp::init_device_mesh(world, {c.replicate, world.size() / c.replicate}, {"replicate", "shard"}));
  }
  if (c.param_dtype == "bfloat16")
    options.mp_policy(fsdpp::MixedPrecisionPolicy().param_dtype(at::kBFloat16).reduce_dtype(at::kFloat));
  Model model = fsdpp::fully_shard(net, options);
  if (deferred && resuming) fsdpp::to_empty(*model);
  else if (deferred)
    fsdpp::materialize_module(*model, fsdpp::MaterializeOptions()
                                          .seed(static_cast<uint64_t>(c.seed))
                                          .param_init_fn(fsdpp::examples::init_transformer_module));
  return model;
}

// nanoGPT's split: weight decay on matrices (and embeddings), none on biases and norms.
torch::optim::AdamW build_optimizer(Model& model, const Config& c) {
  std::vector<at::Tensor> decay, no_decay;
  for (const auto& p : model->parameters()) (p.dim() >= 2 ? decay : no_decay).push_back(p);
  auto options = [&](double wd) { return torch::optim::AdamWOptions(c.lr).betas({0.9, 0.95}).weight_decay(wd); };
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(decay, std::make_unique<torch::optim::AdamWOptions>(options(c.weight_decay)));
  groups.emplace_back(no_decay, std::make_unique<torch::optim::AdamWOptions>(options(0.0)));
  return torch::optim::AdamW(std::move(groups), options(c.weight_decay));
}

// Linear warm-up to lr, then a cosine down to min_lr at `steps` (nanoGPT's get_lr).
double learning_rate(const Config& c, int64_t step) {
  if (step < c.warmup) return c.lr * static_cast<double>(step + 1) / static_cast<double>(c.warmup);
  const double progress =
      std::min(1.0, static_cast<double>(step - c.warmup) / static_cast<double>(std::max<int64_t>(1, c.steps - c.warmup)));
  return c.min_lr + 0.5 * (c.lr - c.min_lr) * (1.0 + std::cos(M_PI * progress));
}

void set_learning_rate(torch::optim::Optimizer& opt, double lr) {
  for (auto& group : opt.param_groups()) static_cast<torch::optim::AdamWOptions&>(group.options()).lr(lr);
}

// (tokens, targets) of the windows starting at `starts`: bytes [s, s + seq) and [s + 1, s + seq + 1).
std::pair<at::Tensor, at::Tensor> windows(const TextCorpus& corpus, const std::vector<int64_t>& starts, int64_t seq) {
  at::Tensor bytes = torch::empty({static_cast<int64_t>(starts.size()), seq + 1}, torch::kUInt8);
  for (size_t i = 0; i < starts.size(); ++i) {
    auto window = corpus.read(starts[i], seq + 1);
    std::memcpy(bytes[static_cast<int64_t>(i)].data_ptr(), window.data(), window.size());
  }
  at::Tensor tokens = bytes.to(torch::kLong);
  return {tokens.narrow(1, 0, seq).contiguous(), tokens.narrow(1, 1, seq).contiguous()};
}

// The root moves the tokens to the compute device; the targets follow the logits.
at::Tensor loss_of(Model& model, const at::Tensor& tokens, const at::Tensor& targets) {
  const at::Tensor logits = model->forward(tokens).to(torch::kFloat);
  return fsdpp::examples::language_model_loss(logits, targets.to(logits.device()));
}

// Mean loss over the validation windows; each rank evaluates its slice.
double validation_loss(Model& model, const TextCorpus& corpus, const Config& c, int rank, int world) {
  torch::NoGradGuard no_grad;
  const auto all = corpus.val_windows(c.eval_batches * c.batch, c.seq + 1);
  double sum = 0;
  for (int64_t b = 0; b < c.eval_batches; ++b) {
    const auto [begin, end] = rank_slice(c.batch, rank, world);
    std::vector<int64_t> starts(all.begin() + b * c.batch + begin, all.begin() + b * c.batch + end);
    auto [tokens, targets] = windows(corpus, starts, c.seq);
    sum += loss_of(model, tokens, targets).item<double>() * static_cast<double>(starts.size());
  }
  at::Tensor total = torch::tensor({sum}, torch::kDouble);
  fsdpp::all_reduce(total);
  return total.item<double>() / static_cast<double>(c.eval_batches * c.batch);
}

ckpt::State training_state(Model& model, torch::optim::Optimizer& opt, const Config& c) {
  ckpt::State state = ckpt::to_state(fsdpp::get_model_state_dict(model), "model.");
  state.merge(ckpt::to_state(fsdpp::get_optimizer_state_dict(model, opt), "optim."));
  state["run"] = c.run_record();
  return state;
}

// The newest complete checkpoint (rank 0 looks; every rank gets its answer), or none.
std::optional<SavedStep> checkpoint_to_resume(const Config& c, int rank) {
  std::string found;
  if (rank == 0) {
    if (auto newest = newest_complete_checkpoint(c.ckpt_dir)) found = newest->dir + "\n" + std::to_string(newest->step);
  }
  fsdpp::broadcast_bytes(found, 0);
  if (found.empty()) return std::nullopt;
  const auto nl = found.find('\n');
  return SavedStep{std::stoll(found.substr(nl + 1)), found.substr(0, nl)};
}

// Loads model, optimizer, data position and step from `saved` (any world size).
void load_training_state(Model& model, torch::optim::Optimizer& opt, BatchSampler& sampler, const SavedStep& saved) {
  fsdpp::StateDict model_sd = fsdpp::get_model_state_dict(model);
  fsdpp::OptimizerStateDict osd = ckpt::optim_state_dict_to_load(ckpt::read_metadata(saved.dir), model_sd, "optim.");
  ckpt::State state = ckpt::to_state(model_sd, "model.");
  state.merge(ckpt::to_state(osd, "optim."));
  state["sampler"] = ckpt::Entry::bytes("");
  // In place: one read buffer at a time, not a second copy of this rank's state (a model that
  // barely fits its ranks must still resume); a load that fails ends the run anyway.
  ckpt::load(state, saved.dir, ckpt::LoadOptions().in_place(true));
  fsdpp::set_model_state_dict(model, model_sd);
  fsdpp::set_optimizer_state_dict(model, opt, osd);
  sampler.set_state(state["sampler"].to_string());
}

// Fault injection for the tests: FSDPP_TRAIN_GPT_KILL_IN_SAVE=STEP makes rank 0 SIGKILL itself
// while the checkpoint of STEP is being written in the background.
bool kill_in_save(int64_t step, int rank) {
  const char* at = std::getenv("FSDPP_TRAIN_GPT_KILL_IN_SAVE");
  return at != nullptr && rank == 0 && std::atoll(at) == step;
}

int run(Config c, const fsdpp::ProcessGroup& world, const at::Device& device) {
  const int rank = world.rank(), n = world.size();
  const auto started = Clock::now();
  if (c.memory_limit > 0 && !device.is_cpu())
    throw std::invalid_argument("--memory-limit limits CPU tensor memory; on " + device.str() + " the GPU's own memory is the limit");
  if (c.memory_limit > 0) fsdpp::set_memory_limit(c.memory_limit);
  std::optional<SavedStep> resume_from;
  if (!c.resume_from.empty()) {
    resume_from = checkpoint_at(c.resume_from);
  } else if (c.resume) {
    resume_from = checkpoint_to_resume(c, rank);
    if (!resume_from && c.data.empty())
      throw std::invalid_argument("--resume: " + c.ckpt_dir + " holds no complete checkpoint to continue from; " +
                                  "to start a new run there, give --data and the run's flags");
  }
  if (resume_from) {
    try {
      ckpt::State record{{"run", std::string()}};
      ckpt::load(record, resume_from->dir);
      c.adopt_run_record(record["run"].to_string(), resume_from->dir);
    } catch (const std::invalid_argument&) {
      throw;  // a flag that differs from the run's: not the checkpoint's fault
    } catch (const std::exception& e) {
      throw std::runtime_error(cannot_resume(*resume_from, e.what()));
    }
  } else if (c.resume) {
    c.validate();  // a first run: every flag it needs must be given
  }
  if (c.batch % n != 0)
    throw std::invalid_argument("--batch " + std::to_string(c.batch) + " is not a multiple of the world size " +
                                std::to_string(n) + " (each rank takes an equal slice of every batch)");
  Progress progress(rank == 0, c.progress_bar, c.steps);
  TextCorpus corpus(c.data, c.val_fraction, c.seq + 1);
  BatchSampler sampler(static_cast<uint64_t>(c.seed), corpus.train_bytes(), c.seq + 1);
  Model model = build_model(c, world, device, resume_from.has_value());
  torch::optim::AdamW opt = build_optimizer(model, c);

  int64_t step = 0;
  if (resume_from) {
    try {
      load_training_state(model, opt, sampler, *resume_from);
    } catch (const std::exception& e) {
      throw std::runtime_error(cannot_resume(*resume_from, e.what()));
    }
    step = resume_from->step;
    progress.line(format("resumed from %s (step %lld), now on %d ranks", resume_from->dir.c_str(),
                         static_cast<long long>(step), n));
  }
  if (c.resume && !resume_from) progress.line("no complete checkpoint in " + c.ckpt_dir + ": starting at step 0");
  if (!c.ckpt_dir.empty() && rank == 0) {
    std::filesystem::create_directories(c.ckpt_dir);
    prune_checkpoints(c.ckpt_dir, c.keep);  // and what killed saves left behind
  }
  fsdpp::barrier();
  const double entropy = corpus.unigram_entropy();
  progress.line(format("train_gpt: %s, %lld bytes (%lld train / %lld validation), unigram entropy %.4f nats/byte; "
                       "%lld layers, dim %lld, %lld heads, seq %lld, batch %lld; %d ranks on %s%s%s%s",
                       c.data.c_str(), static_cast<long long>(corpus.size()), static_cast<long long>(corpus.train_bytes()),
                       static_cast<long long>(corpus.val_bytes()), entropy, static_cast<long long>(c.layers),
                       static_cast<long long>(c.dim), static_cast<long long>(c.heads), static_cast<long long>(c.seq),
                       static_cast<long long>(c.batch), n, device.is_cpu() ? "the CPU" : ("CUDA over " + backend_for(device)).c_str(),
                       c.replicate > 1 ? format(", HSDP %lld x %lld", static_cast<long long>(c.replicate),
                                                static_cast<long long>(n / c.replicate)).c_str() : "",
                       c.param_dtype == "bfloat16" ? ", bf16 compute" : "",
                       c.activation_checkpointing ? ", activation checkpointing" : ""));

  fsdpp::CommDebugMode comm;
  ckpt::SaveHandle pending;
  bool save_pending = false;
  auto finish_pending_save = [&] {
    if (!save_pending) return;
    pending.wait();
    save_pending = false;
    if (rank == 0) prune_checkpoints(c.ckpt_dir, c.keep);
  };
  const int64_t last = c.stop_after >= 0 ? std::min(c.steps, c.stop_after) : c.steps;
  const auto [begin, end] = rank_slice(c.batch, rank, n);
  std::vector<double> interval_losses;
  double interval_seconds = 0, train_seconds = 0;
  int64_t interval_bytes_start = comm.total_bytes_sent(), steps_this_run = 0;
  // The MFU: model FLOPs per second over the devices' dense peak (stated in the line).
  // An H100's / H200's dense peak for the compute dtype: bf16's tensor cores, float32's
  // CUDA cores (libtorch leaves TF32 off).
  const double gpu_peak = c.param_dtype == "bfloat16" ? 989 : 67;
  const double peak_tflops = c.peak_tflops > 0 ? c.peak_tflops : device.is_cpu() ? 0 : gpu_peak;
  const double flops_per_token = fsdpp::examples::training_flops_per_token(model_args(c), parameter_count(c));
  fsdpp::reset_peak_memory_stats(device);
  double val_loss = NAN;
  while (step < last) {
    const auto t0 = Clock::now();
    const auto starts = sampler.next(c.batch);
    auto [tokens, targets] = windows(corpus, std::vector<int64_t>(starts.begin() + begin, starts.begin() + end), c.seq);
    set_learning_rate(opt, learning_rate(c, step));
    opt.zero_grad();
    at::Tensor loss = loss_of(model, tokens, targets);
    loss.backward();
    if (c.clip > 0) fsdpp::clip_grad_norm_(model, c.clip);
    opt.step();
    ++step;
    ++steps_this_run;
    interval_losses.push_back(loss.item<double>());  // on a GPU: waits for the step's kernels
    const double dt = seconds_since(t0);
    interval_seconds += dt;
    train_seconds += dt;
    progress.step(step, interval_losses.back());

    if (step % c.log_every == 0 || step == last) {
      at::Tensor losses = torch::tensor(interval_losses, torch::kDouble);
      fsdpp::all_reduce(losses, fsdpp::ReduceOp::AVG);
      at::Tensor peaks = torch::tensor({static_cast<double>(fsdpp::memory_stats(device).peak_bytes),
                                        static_cast<double>(comm.total_bytes_sent() - interval_bytes_start)},
                                       torch::kDouble);
      fsdpp::all_reduce(peaks, fsdpp::ReduceOp::MAX);
      const double k = static_cast<double>(interval_losses.size());
      const double tokens_per_s = k * static_cast<double>(c.batch * c.seq) / interval_seconds;
      const std::string mfu = peak_tflops > 0 ? format(" | MFU %.1f%% of %.0f TFLOP/s", 100 * tokens_per_s * flops_per_token /
                                                                                          (n * peak_tflops * 1e12),
                                                      peak_tflops)
                                              : "";
      progress.line(format("step %6lld/%lld | loss %.6f | lr %.2e | %8.0f tok/s | %7.1f ms/step | peak %.1f MiB | "
                           "sent %.2f MiB/step (max over ranks)%s",
                           static_cast<long long>(step), static_cast<long long>(c.steps), losses.mean().item<double>(),
                           learning_rate(c, step - 1), tokens_per_s, 1e3 * interval_seconds / k,
                           mib(peaks[0].item<double>()), mib(peaks[1].item<double>()) / k, mfu.c_str()));
      interval_losses.clear();
      interval_seconds = 0;
      interval_bytes_start = comm.total_bytes_sent();
      fsdpp::reset_peak_memory_stats(device);
    }
    if (step % c.eval_every == 0 || step == c.steps) {
      val_loss = validation_loss(model, corpus, c, rank, n);
      progress.line(format("step %6lld/%lld | validation loss %.6f (%.3f bits/byte; unigram %.4f)",
                           static_cast<long long>(step), static_cast<long long>(c.steps), val_loss,
                           val_loss / std::log(2.0), entropy));
    }
    if (!c.ckpt_dir.empty() && (step % c.ckpt_every == 0 || step == last)) {
      finish_pending_save();
      ckpt::State state = training_state(model, opt, c);
      state["step"] = step;
      state["sampler"] = ckpt::Entry::bytes(sampler.state());
      pending = ckpt::async_save(state, step_dir(c.ckpt_dir, step));
      save_pending = true;
      if (kill_in_save(step, rank)) std::raise(SIGKILL);
    }
  }
  finish_pending_save();
  progress.finish();
  if (step < c.steps) {
    progress.line(format("stopped after step %lld of %lld (--stop-after); continue with --resume",
                         static_cast<long long>(step), static_cast<long long>(c.steps)));
    return 0;
  }

  std::string out = c.out.empty() && !c.ckpt_dir.empty() ? c.ckpt_dir + "/model.safetensors" : c.out;
  if (!out.empty()) {
    if (std::isnan(val_loss)) val_loss = validation_loss(model, corpus, c, rank, n);
    ckpt::export_safetensors(model, out, {{"train_gpt.run", c.run_record()}});
    if (rank == 0) {
      progress.line(format("wrote %s", out.c_str()));
      const std::string sample = sample_text(out, model_args(c), c.prompt, c.sample_bytes, static_cast<uint64_t>(c.seed));
      progress.line("sample from " + out + ":\n" + printable(sample));
    }
  }
  const double tokens = static_cast<double>(steps_this_run * c.batch * c.seq);
  progress.line(format("done: %lld steps in %.1f s (%.1f s training, %.0f tok/s); validation loss %.4f nats/byte "
                       "vs the corpus' unigram entropy %.4f (%.2fx); rank 0's peak tensor memory in training "
                       "%lld bytes",
                       static_cast<long long>(steps_this_run), seconds_since(started), train_seconds,
                       tokens / std::max(1e-9, train_seconds), val_loss, entropy, val_loss / entropy,
                       static_cast<long long>(fsdpp::memory_stats(device).peak_bytes)));
  return 0;
}

}  // namespace
}  // namespace train_gpt

int main(int argc, char** argv) {
  train_gpt::Config config;
  at::Device device = at::kCPU;
  try {
    config = train_gpt::parse_flags(argc, argv);
    device = train_gpt::compute_device(config);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train_gpt: %s\n", e.what());
    return 2;
  }
  // As torch.cuda.set_device(LOCAL_RANK) before init_process_group.
  if (device.is_cuda()) c10::impl::getDeviceGuardImpl(device.type())->setDevice(device);
  auto world = fsdpp::init_process_group(fsdpp::InitProcessGroupOptions().backend(train_gpt::backend_for(device)));
  int status = 1;
  try {
    status = train_gpt::run(config, world, device);
  } catch (const c10::OutOfMemoryError& e) {
    // As on a GPU: say what did not fit and what this rank held at its peak, then exit.
    std::fprintf(stderr, "train_gpt: rank %d: %s (peak tensor memory %lld bytes)\n", world.rank(),
                 e.what_without_backtrace(), static_cast<long long>(fsdpp::memory_stats(device).peak_bytes));
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train_gpt: rank %d: %s\n", world.rank(), e.what());
    return 1;
  }
  fsdpp::destroy_process_group();
  return status;
}
