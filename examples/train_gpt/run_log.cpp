#include "run_log.h"

#include <fstream>

namespace train_gpt {

RunLog::RunLog(const Config& c, int rank, int64_t resumed_step)
    : metrics(rank == 0 ? c.metrics_file : std::string(), resumed_step) {
  if (rank == 0 && !c.tensorboard.empty())
    tensorboard.emplace(c.tensorboard, fsdpp::SummaryWriterOptions().purge_step(resumed_step + 1));
  if (rank == 0 && !c.metrics_file.empty()) read_earlier_points(c.metrics_file);
}

void RunLog::read_earlier_points(const std::string& path) {
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    const auto record = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!record.is_object() || !record.contains("step")) continue;
    // A NaN loss is written as null: a gap in the picture.
    if (record.contains("loss") && record["loss"].is_number())
      train.emplace_back(record["step"].get<int64_t>(), record["loss"].get<double>());
    if (record.contains("val_loss") && record["val_loss"].is_number())
      validation.emplace_back(record["step"].get<int64_t>(), record["val_loss"].get<double>());
  }
}

void RunLog::write(const nlohmann::json& record) {
  const int64_t step = record["step"].get<int64_t>();
  if (record.contains("loss") && record["loss"].is_number()) train.emplace_back(step, record["loss"].get<double>());
  if (record.contains("val_loss") && record["val_loss"].is_number())
    validation.emplace_back(step, record["val_loss"].get<double>());
  metrics.write(record);
  if (!tensorboard) return;
  for (const auto& [key, value] : record.items())
    if (key != "step" && value.is_number())
      tensorboard->add_scalar(key == "val_loss" ? "validation/loss" : "train/" + key, value.get<double>(), step);
  tensorboard->flush();
}

}  // namespace train_gpt
