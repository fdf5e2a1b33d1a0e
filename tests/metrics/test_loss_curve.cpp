// train_gpt::write_loss_curve_svg: a well-formed SVG whose curves map losses the right way up.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "metrics/temp_dir.h"
#include "train_gpt/loss_curve.h"

namespace fs = std::filesystem;
using train_gpt::Curve;

namespace {

using fsdpp::testing::read_all;
using fsdpp::testing::TempDir;

// A tiny XML check: every element closed in order, quotes balanced, nothing after the root.
::testing::AssertionResult well_formed(const std::string& xml) {
  std::vector<std::string> open;
  size_t roots = 0;
  for (size_t pos = xml.find('<'); pos != std::string::npos; pos = xml.find('<', pos)) {
    const size_t end = xml.find('>', pos);
    if (end == std::string::npos) return ::testing::AssertionFailure() << "unclosed tag at " << pos;
    const std::string tag = xml.substr(pos + 1, end - pos - 1);
    pos = end + 1;
    if (tag[0] == '?' || tag[0] == '!') continue;
    if (std::count(tag.begin(), tag.end(), '"') % 2 != 0) return ::testing::AssertionFailure() << "<" << tag << ">";
    if (tag[0] == '/') {
      if (open.empty() || open.back() != tag.substr(1)) return ::testing::AssertionFailure() << "stray </" << tag;
      open.pop_back();
      continue;
    }
    if (open.empty() && ++roots > 1) return ::testing::AssertionFailure() << "two root elements";
    if (tag.back() != '/') open.push_back(tag.substr(0, tag.find_first_of(" \n")));
  }
  if (!open.empty()) return ::testing::AssertionFailure() << "<" << open.back() << "> never closed";
  if (xml.find("<svg") == std::string::npos) return ::testing::AssertionFailure() << "no <svg";
  return ::testing::AssertionSuccess();
}

// The (x, y) points of the <polyline class="name">; empty if there is none.
std::vector<std::pair<double, double>> polyline(const std::string& svg, const std::string& name) {
  std::smatch match;
  std::vector<std::pair<double, double>> points;
  if (!std::regex_search(svg, match, std::regex("<polyline class=\"" + name + "\"[^>]* points=\"([^\"]*)\""))) {
    return points;
  }
  std::istringstream text(match[1].str());
  for (std::string pair; text >> pair;) {
    const size_t comma = pair.find(',');
    points.emplace_back(std::stod(pair.substr(0, comma)), std::stod(pair.substr(comma + 1)));
  }
  return points;
}

}  // namespace

TEST(LossCurve, CurvesMapHigherLossHigherUp) {
  TempDir dir;
  Curve train, validation;
  for (int64_t step = 1; step <= 200; ++step) train.push_back({step, 3.0 + 5.0 / std::sqrt(static_cast<double>(step))});
  for (int64_t step = 25; step <= 200; step += 25) validation.push_back({step, 3.2 + 5.0 / std::sqrt(static_cast<double>(step))});
  const fs::path path = dir.path / "loss.svg";
  train_gpt::write_loss_curve_svg(path.string(), train, validation, "GPT <tiny> & co", 4.17, "unigram entropy");
  const std::string svg = read_all(path);
  EXPECT_TRUE(well_formed(svg));
  EXPECT_NE(svg.find("GPT &lt;tiny&gt; &amp; co"), std::string::npos);  // the title, escaped
  EXPECT_NE(svg.find("unigram entropy"), std::string::npos);
  EXPECT_NE(svg.find("stroke-dasharray"), std::string::npos);

  const auto points = polyline(svg, "train");
  ASSERT_EQ(points.size(), train.size());
  EXPECT_LT(points.front().first, points.back().first);   // later steps further right
  EXPECT_LT(points.front().second, points.back().second); // the higher first loss drawn higher up
  for (const auto& [x, y] : points) {
    EXPECT_TRUE(x >= 0 && x <= 800 && y >= 0 && y <= 480) << x << "," << y;
  }
  EXPECT_EQ(polyline(svg, "validation").size(), validation.size());
  for (const auto& entry : fs::directory_iterator(dir.path)) EXPECT_EQ(entry.path(), path) << "temp file left";
}

TEST(LossCurve, EdgeCasesStillMakeAPicture) {
  TempDir dir;
  const double nan = std::nan(""), inf = INFINITY;
  struct Case {
    const char* name;
    Curve train, validation;
    std::optional<double> reference;
    size_t train_points;
  };
  const std::vector<Case> cases = {
      {"empty", {}, {}, std::nullopt, 0},
      {"empty-with-reference", {}, {}, 2.5, 0},
      {"one-point", {{7, 2.5}}, {}, std::nullopt, 1},
      {"constant", {{0, 1.0}, {10, 1.0}, {20, 1.0}}, {{10, 1.0}}, 1.0, 3},
      {"zero-loss", {{0, 0.0}, {1, 0.0}}, {}, std::nullopt, 2},
      {"non-finite", {{0, nan}, {1, 3.0}, {2, inf}, {3, 2.0}, {4, -inf}}, {{2, nan}}, nan, 2},
      {"huge-steps", {{1000000, 1e-4}, {2000000, 5e-5}}, {}, std::nullopt, 2},
  };
  for (const Case& c : cases) {
    const fs::path path = dir.path / (std::string(c.name) + ".svg");
    train_gpt::write_loss_curve_svg(path.string(), c.train, c.validation, c.name, c.reference, "ref");
    const std::string svg = read_all(path);
    EXPECT_TRUE(well_formed(svg)) << c.name;
    // No NaN or infinity reached a coordinate or a label.
    EXPECT_FALSE(std::regex_search(svg, std::regex(R"([\s"'>,(]-?(nan|inf))", std::regex::icase))) << c.name;
    EXPECT_EQ(polyline(svg, "train").size(), c.train_points) << c.name;
  }
}

TEST(LossCurve, UnwritablePathThrowsNamingIt) {
  TempDir dir;
  const std::string path = (dir.path / "no-such-folder" / "loss.svg").string();
  try {
    train_gpt::write_loss_curve_svg(path, {{1, 1.0}}, {}, "t");
    ADD_FAILURE() << "no error";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
  }
}
