#pragma once
// Rank 0's record of the run: JSON lines (--metrics-file), TensorBoard events (--tensorboard),
// the points of the loss curves. Other ranks keep none.
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include <fsdpp/summary_writer.h>

#include "config.h"
#include "metrics_log.h"

namespace train_gpt {

struct RunLog {
  MetricsLog metrics;
  std::optional<fsdpp::SummaryWriter> tensorboard;
  std::vector<std::pair<int64_t, double>> train, validation;

  RunLog(const Config& c, int rank, int64_t resumed_step);
  // A resumed run's picture starts where the run started: the kept lines of the metrics file.
  void read_earlier_points(const std::string& path);
  // One logged step's record ("step", and "loss", "val_loss", ... where measured).
  void write(const nlohmann::json& record);
};

}  // namespace train_gpt
