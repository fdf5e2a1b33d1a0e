#include "config.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <stdexcept>
#include <variant>

namespace train_gpt {
namespace {

using Target = std::variant<std::string*, int64_t*, double*, bool*>;

struct Flag {
  const char* name;
  Target target;
  bool recorded;  // part of the run: stored in checkpoints
  const char* help;
};

std::vector<Flag> flags(Config& c) {
  return {
      {"data", &c.data, true, "text file to train on (required)"},
      {"config", &c.model_config, true, "a Hugging Face Llama config.json: the model, trained from scratch"},
      {"init-from", &c.init_from, true, "a Hugging Face Llama directory to fine-tune (config.json, weights, tokenizer)"},
      {"tokenizer", &c.tokenizer, true, "a folder or file with tokenizer.json or tokenizer.model, or bytes (empty: "
                                         "--init-from's, else bytes)"},
      {"layers", &c.layers, true, "decoder layers (without --config / --init-from)"},
      {"dim", &c.dim, true, "model width"},
      {"heads", &c.heads, true, "attention heads"},
      {"kv-heads", &c.kv_heads, true, "key/value heads (grouped-query attention; 0: --heads)"},
      {"ffn-dim", &c.ffn_dim, true, "the MLP's width (0: 8/3 x dim rounded up to a multiple of 32)"},
      {"seq", &c.seq, true, "tokens per sequence"},
      {"batch", &c.batch, true, "sequences per optimizer step over all ranks (a multiple of world size x "
                                "--grad-accum)"},
      {"grad-accum", &c.grad_accum, true, "micro-batches per step on each rank (gradients accumulated)"},
      {"steps", &c.steps, true, "training steps (the learning-rate schedule's length)"},
      {"lr", &c.lr, true, "peak learning rate (AdamW)"},
      {"min-lr", &c.min_lr, true, "learning rate at the end of the schedule"},
      {"warmup", &c.warmup, true, "linear warm-up steps"},
      {"lr-schedule", &c.lr_schedule, true, "after the warm-up: cosine, linear (both down to --min-lr) or constant"},
      {"weight-decay", &c.weight_decay, true, "AdamW weight decay"},
      {"clip", &c.clip, true, "max global gradient norm over all shards (0: off)"},
      {"val-fraction", &c.val_fraction, true, "fraction of the file (its end) held out for validation"},
      {"seed", &c.seed, true, "initial weights and batch sampling"},
      {"param-dtype", &c.param_dtype, true, "float32 or bfloat16 (FSDP mixed precision; float32 master weights)"},
      {"reduce-every-micro-batch", &c.reduce_every_micro_batch, false,
       "with --grad-accum: reduce-scatter every micro-batch's gradients (sharded accumulation, less memory, "
       "more traffic) instead of the last one's only"},
      {"init", &c.init, false, "deferred: each rank allocates only its shards, initializing one block at a time; eager: "
                              "the whole model on every rank first"},
      {"device", &c.device, false, "cuda (each rank cuda:LOCAL_RANK), cpu, or auto: cuda where a GPU is present"},
      {"peak-tflops", &c.peak_tflops, false, "the device's dense peak for the MFU (0: an H100's, 989 in bfloat16 and "
                                             "67 in float32, on CUDA; none on the CPU)"},
      {"memory-limit", &c.memory_limit, false, "bytes of tensor memory per rank; past it, out of memory (0: none)"},
      {"activation-checkpointing", &c.activation_checkpointing, false, "recompute each block in backward"},
      {"replicate", &c.replicate, false, "HSDP: replicas (mesh replicate x world/replicate); 1: plain FSDP"},
      {"log-every", &c.log_every, false, "steps between progress lines"},
      {"eval-every", &c.eval_every, false, "steps between validation losses"},
      {"eval-batches", &c.eval_batches, false, "global batches of the validation split per evaluation"},
      {"ckpt-dir", &c.ckpt_dir, false, "where checkpoints go (step-NNNNNNN/ each); empty: none"},
      {"ckpt-every", &c.ckpt_every, false, "steps between checkpoints (saved in the background)"},
      {"keep", &c.keep, false, "complete checkpoints kept"},
      {"resume", &c.resume, false, "continue from the newest checkpoint in --ckpt-dir that loads (incomplete or "
                                   "damaged ones are skipped, each named)"},
      {"resume-from", &c.resume_from, false, "continue from this checkpoint folder (a step-NNNNNNNN)"},
      {"stop-after", &c.stop_after, false, "end this run after that step, as if preempted (then --resume)"},
      {"exit-signal", &c.exit_signal, false, "on this signal (as on SIGTERM) finish the step, save it and exit 75 "
                                             "(preempted: continue with --resume); e.g. SIGUSR1"},
      {"out", &c.out, false, "model.safetensors to export at the end (default <ckpt-dir>/model.safetensors)"},
      {"export-hf", &c.export_hf, false, "a Hugging Face directory to write at the end (weights, config.json, "
                                          "tokenizer files)"},
      {"metrics-file", &c.metrics_file, false, "JSON lines, one per logged step, appended across resumes"},
      {"tensorboard", &c.tensorboard, false, "a TensorBoard log directory for the same metrics"},
      {"loss-curve", &c.loss_curve, false, "the loss curves' picture, SVG (default <ckpt-dir>/loss-curve.svg)"},
      {"sample-tokens", &c.sample_tokens, false, "tokens of text generated at the end (0: none)"},
      {"prompt", &c.prompt, false, "text the sample starts from"},
      {"progress-bar", &c.progress_bar, false, "draw a progress bar when stdout is a terminal"},
  };
}

// Exact (17 digits: a checkpoint's record reads back the same double) or, for --help, short.
std::string value_string(const Target& t, int precision = 17) {
  std::ostringstream out;
  out.precision(precision);
  std::visit([&](auto* p) { out << *p; }, t);
  return out.str();
}

void set_value(const Flag& flag, const std::string& text) {
  const std::string name = std::string("--") + flag.name;
  auto bad = [&](const char* what) {
    return std::invalid_argument(name + " " + text + ": " + what);
  };
  std::visit(
      [&](auto* p) {
        using T = std::remove_pointer_t<decltype(p)>;
        if constexpr (std::is_same_v<T, std::string>) {
          *p = text;
        } else if constexpr (std::is_same_v<T, bool>) {
          if (text == "1" || text == "true") *p = true;
          else if (text == "0" || text == "false") *p = false;
          else throw bad("expected true or false");
        } else {
          std::istringstream in(text);
          T v{};
          if (!(in >> v) || !in.eof()) throw bad(std::is_same_v<T, double> ? "not a number" : "not an integer");
          *p = v;
        }
      },
      flag.target);
}

}  // namespace

void Config::validate() const {
  const Config& c = *this;
  auto fail = [](const std::string& m) { throw std::invalid_argument(m); };
  if (c.data.empty()) fail("--data PATH is required (a text file to train on)");
  for (auto [name, v] : {std::pair{"--layers", c.layers}, {"--dim", c.dim}, {"--heads", c.heads}, {"--seq", c.seq},
                         {"--batch", c.batch}, {"--grad-accum", c.grad_accum}, {"--steps", c.steps}, {"--log-every", c.log_every},
                         {"--eval-every", c.eval_every}, {"--eval-batches", c.eval_batches},
                         {"--ckpt-every", c.ckpt_every}, {"--keep", c.keep}, {"--replicate", c.replicate}})
    if (v <= 0) fail(std::string(name) + " must be positive, not " + std::to_string(v));
  if (c.dim % c.heads != 0)
    fail("--dim " + std::to_string(c.dim) + " is not a multiple of --heads " + std::to_string(c.heads));
  if (c.kv_heads < 0 || (c.kv_heads > 0 && c.heads % c.kv_heads != 0))
    fail("--kv-heads " + std::to_string(c.kv_heads) + " does not divide --heads " + std::to_string(c.heads));
  if (c.ffn_dim < 0) fail("--ffn-dim must not be negative");
  if (!c.model_config.empty() && !c.init_from.empty())
    fail("--config and --init-from both give the model: --init-from DIR already has its config.json");
  if (!c.model_config.empty() || !c.init_from.empty())
    for (const char* shape : {"layers", "dim", "heads", "kv-heads", "ffn-dim"})
      if (given.count(shape))
        fail(std::string("--") + shape + " with " + (c.model_config.empty() ? "--init-from" : "--config") +
             ": the model's shape comes from its config.json");
  if (c.lr_schedule != "cosine" && c.lr_schedule != "linear" && c.lr_schedule != "constant")
    fail("--lr-schedule " + c.lr_schedule + ": expected cosine, linear or constant");
  if (c.warmup < 0) fail("--warmup must not be negative");
  if (!(c.val_fraction > 0 && c.val_fraction < 1)) fail("--val-fraction must be between 0 and 1");
  if (c.param_dtype != "float32" && c.param_dtype != "bfloat16")
    fail("--param-dtype " + c.param_dtype + ": expected float32 or bfloat16");
  if (c.init != "deferred" && c.init != "eager") fail("--init " + c.init + ": expected deferred or eager");
  if (c.memory_limit < 0) fail("--memory-limit must not be negative");
  if (c.device != "auto" && c.device != "cpu" && c.device != "cuda")
    fail("--device " + c.device + ": expected cuda, cpu or auto");
  if (c.peak_tflops < 0) fail("--peak-tflops must not be negative");
  if (c.sample_tokens < 0) fail("--sample-tokens must not be negative");
  if (c.clip < 0) fail("--clip must not be negative (0: no clipping)");
  if (c.lr < 0 || c.min_lr < 0) fail(std::string(c.lr < 0 ? "--lr" : "--min-lr") + " must not be negative");
  if (c.weight_decay < 0) fail("--weight-decay must not be negative");
  if (c.resume && c.ckpt_dir.empty()) fail("--resume needs --ckpt-dir");
}

std::string usage() {
  Config defaults;
  std::string text = "usage: train_gpt --data FILE [--flag value]...\n";
  for (const Flag& f : flags(defaults)) {
    std::string shown = value_string(f.target, 6);
    for (size_t at = shown.find('\n'); at != std::string::npos; at = shown.find('\n', at)) shown.replace(at, 1, "\\n");
    const std::string flag = "  --" + std::string(f.name) + " (" + shown + ")";
    text += flag + std::string(flag.size() < 34 ? 34 - flag.size() : 1, ' ') + f.help + "\n";
  }
  return text;
}

Config parse_flags(int argc, char** argv) {
  Config c;
  auto table = flags(c);
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      std::fputs(usage().c_str(), stdout);
      std::exit(0);
    }
    if (arg.rfind("--", 0) != 0) throw std::invalid_argument("unexpected argument '" + arg + "'\n" + usage());
    std::string name = arg.substr(2), text;
    bool has_value = false;
    if (auto eq = name.find('='); eq != std::string::npos) {
      text = name.substr(eq + 1);
      name = name.substr(0, eq);
      has_value = true;
    }
    auto flag = std::find_if(table.begin(), table.end(), [&](const Flag& f) { return name == f.name; });
    if (flag == table.end()) throw std::invalid_argument("unknown flag --" + name + "\n" + usage());
    if (!has_value) {
      if (std::holds_alternative<bool*>(flag->target)) text = "true";
      else if (i + 1 < argc) text = argv[++i];
      else throw std::invalid_argument("--" + name + " needs a value");
    }
    set_value(*flag, text);
    c.given.insert(name);
  }
  // A resumed run's other flags come from its checkpoint.
  if (!c.resume && c.resume_from.empty()) c.validate();
  else if (c.resume && c.ckpt_dir.empty()) throw std::invalid_argument("--resume needs --ckpt-dir");
  return c;
}

std::string Config::run_record() const {
  std::string record;
  for (const Flag& f : flags(const_cast<Config&>(*this)))
    if (f.recorded) record += std::string(f.name) + "=" + value_string(f.target) + "\n";
  return record;
}

void Config::adopt_run_record(const std::string& record, const std::string& where) {
  auto table = flags(*this);
  std::istringstream in(record);
  for (std::string line; std::getline(in, line);) {
    const auto eq = line.find('=');
    const std::string name = line.substr(0, eq), saved = eq == std::string::npos ? "" : line.substr(eq + 1);
    auto flag = std::find_if(table.begin(), table.end(), [&](const Flag& f) { return name == f.name; });
    if (flag == table.end() || !flag->recorded)
      throw std::invalid_argument(where + " records an unknown flag '" + name + "'");
    if (given.count(name)) {
      Config probe;
      auto probe_table = flags(probe);
      const Flag& p = *std::find_if(probe_table.begin(), probe_table.end(), [&](const Flag& f) { return name == f.name; });
      set_value(p, saved);
      if (value_string(p.target) != value_string(flag->target))
        throw std::invalid_argument("--" + name + " " + value_string(flag->target) + " differs from " + saved + " in " +
                                    where + ": a run's model, data, batch and schedule are fixed when it starts; "
                                    "drop the flag to continue the run, or start a new one");
    } else {
      set_value(*flag, saved);
    }
  }
  validate();
}

}  // namespace train_gpt
