// A Hugging Face directory out of and into a deferred FSDP Llama (issue 48): the model of
// --config built on the meta device, each decoder layer a unit, initialized per rank and
// exported to --dir with export_huggingface (shards of --max-shard-mib); then a fresh deferred
// model loaded from it with load_huggingface, all read before the model changes, and again in place. Per rank: seconds, tensor bytes read, and the
// tensor memory peak above the rank's shards (fsdpp's counting allocator). Run under fsdpp-run;
// rank 0 prints one line per phase with the maxima over ranks.
#include <chrono>
#include <cstdio>
#include <string>

#include <torch/torch.h>

#include <fsdpp/fsdpp.h>

#include <CLI/CLI.hpp>

namespace {

double max_over_ranks(double v, const fsdpp::ProcessGroup& world) {
  at::Tensor t = at::tensor(std::vector<double>{v}, at::kDouble);
  fsdpp::all_reduce(t, fsdpp::ReduceOp::MAX, world);
  return t.item<double>();
}

double mib(double bytes) { return bytes / (1 << 20); }

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"fsdpp: export and load a Hugging Face directory of a deferred FSDP Llama"};
  std::string config_file, dir;
  double max_shard_mib = 256;
  app.add_option("--config", config_file, "a Llama config.json")->required();
  app.add_option("--dir", dir, "the Hugging Face directory to write, then read")->required();
  app.add_option("--max-shard-mib", max_shard_mib);
  CLI11_PARSE(app, argc, argv);
  torch::set_num_threads(1);
  auto world = fsdpp::init_process_group(fsdpp::InitProcessGroupOptions().check_collectives(false));
  const fsdpp::LlamaConfig config = fsdpp::LlamaConfig::from_file(config_file);
  auto seconds_since = [](auto start) { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(); };
  double model_bytes = 0;
  {
    auto model = fsdpp::fully_shard_llama(fsdpp::deferred_init([&] { return fsdpp::LlamaForCausalLM(config); }));
    fsdpp::materialize_module(*model, fsdpp::MaterializeOptions().param_init_fn(fsdpp::llama_init_fn(config)));
    for (const auto& p : model->parameters()) model_bytes += static_cast<double>(p.numel() * p.element_size());
    fsdpp::barrier(world);
    const int64_t base = fsdpp::memory_stats().current_bytes;
    fsdpp::reset_peak_memory_stats();
    const auto start = std::chrono::steady_clock::now();
    fsdpp::checkpoint::export_huggingface(
        *model, dir,
        fsdpp::checkpoint::HuggingFaceExportOptions()
            .max_shard_size(static_cast<int64_t>(max_shard_mib * (1 << 20)))
            .config_json(config.to_json()));
    const double secs = max_over_ranks(seconds_since(start), world);
    const double peak = max_over_ranks(static_cast<double>(fsdpp::memory_stats().peak_bytes - base), world);
    const double shards = max_over_ranks(model_bytes, world);
    if (world.rank() == 0)
      std::printf("N=%d export: %.2f s, peak above the rank's shards %.1f MiB (shards %.1f MiB per rank)\n",
                  world.size(), secs, mib(peak), mib(shards));
  }
  for (const bool in_place : {false, true}) {
    auto model = fsdpp::fully_shard_llama(fsdpp::deferred_init([&] { return fsdpp::LlamaForCausalLM(config); }));
    fsdpp::to_empty(*model);
    fsdpp::barrier(world);
    const int64_t base = fsdpp::memory_stats().current_bytes;
    fsdpp::reset_peak_memory_stats();
    const auto start = std::chrono::steady_clock::now();
    const auto report =
        fsdpp::checkpoint::load_huggingface(*model, dir, fsdpp::checkpoint::HuggingFaceLoadOptions().in_place(in_place));
    const double secs = max_over_ranks(seconds_since(start), world);
    const double peak = max_over_ranks(static_cast<double>(fsdpp::memory_stats().peak_bytes - base), world);
    const double read = max_over_ranks(static_cast<double>(report.bytes_read), world);
    if (world.rank() == 0)
      std::printf("N=%d load%s: %.2f s, most bytes read by a rank %.1f MiB (%lld files), peak above the rank's shards %.1f MiB\n",
                  world.size(), in_place ? " in place" : "", secs, mib(read), static_cast<long long>(report.files), mib(peak));
  }
  return 0;
}
