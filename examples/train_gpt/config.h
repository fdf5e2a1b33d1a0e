#pragma once
// The trainer's flags. Those that define the run (model shape, data, batch, schedule, seed) are
// recorded in every checkpoint; --resume takes them from there, and a flag given again with
// another value is an error naming it. The others (parallelism, intervals, paths) may change
// between runs, world size included.
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace train_gpt {

struct Config {
  // The run (recorded in checkpoints).
  std::string data;            // any UTF-8 (or other) text file
  // The model: a Llama-architecture decoder (fsdpp::LlamaForCausalLM), from the shape flags, from
  // a Hugging Face config.json (--config), or a Hugging Face directory to fine-tune (--init-from).
  std::string model_config;
  std::string init_from;
  // A directory (or file) with tokenizer.json or tokenizer.model; "bytes": the file's bytes are
  // the tokens (vocabulary 256); empty: --init-from's tokenizer where it has one, else bytes.
  std::string tokenizer;
  int64_t layers = 4, dim = 128, heads = 4, kv_heads = 0, ffn_dim = 0, seq = 64;
  int64_t batch = 16;          // sequences per optimizer step over all ranks
  int64_t grad_accum = 1;      // micro-batches per step on each rank (batch / world / grad_accum sequences each)
  int64_t steps = 1000;        // length of the learning-rate schedule
  double lr = 1e-3, min_lr = 1e-4, weight_decay = 0.1;
  int64_t warmup = 50;         // linear warm-up steps, then --lr-schedule down to min_lr at `steps`
  std::string lr_schedule = "cosine";  // cosine, linear or constant after the warm-up
  double clip = 1.0;           // max global gradient norm (0: no clipping)
  double val_fraction = 0.1;   // the file's tail held out for validation
  int64_t seed = 1337;
  std::string param_dtype = "float32";  // or bfloat16: FSDP mixed precision (float32 master weights)

  // This run only.
  bool reduce_every_micro_batch = false;  // with --grad-accum: reduce-scatter each micro-batch (less memory)
  std::string init = "deferred";  // or eager: the whole model on every rank before sharding
  std::string device = "auto";  // cuda (cuda:LOCAL_RANK), cpu, or auto: cuda where a GPU is present
  double peak_tflops = 0;      // the device's dense peak for the MFU; 0: an H100's on CUDA, none on the CPU
  int64_t memory_limit = 0;    // bytes of tensor memory per rank (fsdpp::set_memory_limit); 0: none
  bool activation_checkpointing = false;
  int64_t replicate = 1;       // HSDP: a (replicate, world / replicate) mesh
  int64_t log_every = 10, eval_every = 100, eval_batches = 8;
  std::string ckpt_dir;        // empty: no checkpoints
  int64_t ckpt_every = 100, keep = 3;
  bool resume = false;
  std::string resume_from;     // a checkpoint folder to continue from (instead of the newest)
  int64_t stop_after = -1;     // end this run after that step, as if preempted
  std::string exit_signal = "SIGTERM";  // besides SIGTERM: save the step reached and exit 75 on it
  std::string out;             // model.safetensors path; empty: <ckpt_dir>/model.safetensors or none
  std::string export_hf;       // a Hugging Face directory written at the end (weights, config, tokenizer)
  std::string metrics_file;    // JSON lines, one per logged step (rank 0), kept across resumes
  std::string tensorboard;     // a TensorBoard log directory (rank 0)
  std::string loss_curve;      // the loss curves' picture (SVG); empty: <ckpt_dir>/loss-curve.svg or none
  int64_t sample_tokens = 300;
  std::string prompt = "\n";
  bool progress_bar = true;    // when stdout is a terminal

  std::set<std::string> given;  // the flags given on the command line

  // "name=value" lines of the recorded flags (what a checkpoint stores).
  std::string run_record() const;
  // Takes the recorded flags from a checkpoint's record; throws naming the flag when one given
  // on the command line differs.
  void adopt_run_record(const std::string& record, const std::string& where);
  // Throws std::invalid_argument naming the first flag out of range.
  void validate() const;
};

// Throws std::invalid_argument naming the bad flag; prints usage and exits for --help.
Config parse_flags(int argc, char** argv);
std::string usage();

}  // namespace train_gpt
