#pragma once
// The run's loss curve as a self-contained SVG picture (about 800x480): training and validation
// loss against the step, and an optional dashed reference line (e.g. the unigram entropy).
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace train_gpt {

using Curve = std::vector<std::pair<int64_t, double>>;  // (step, loss)

// Points whose loss is NaN or infinite are left out; any curve may be empty. Writes a temporary
// file beside `path` and renames it into place; throws std::runtime_error naming `path`.
void write_loss_curve_svg(const std::string& path, const Curve& train, const Curve& validation,
                          const std::string& title, std::optional<double> reference_line = {},
                          const std::string& reference_label = "");

}  // namespace train_gpt
