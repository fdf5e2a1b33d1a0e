#include "loss_curve.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <sstream>
#include <stdexcept>

namespace train_gpt {
namespace {

constexpr double kWidth = 800, kHeight = 480;
constexpr double kLeft = 72, kRight = 24, kTop = 44, kBottom = 56;  // margins around the plot
constexpr double kPlotWidth = kWidth - kLeft - kRight, kPlotHeight = kHeight - kTop - kBottom;
constexpr const char* kTrainColor = "#1f77b4";
constexpr const char* kValidationColor = "#ff7f0e";
constexpr const char* kReferenceColor = "#555555";

struct Axis {
  double lo, hi, step;  // tick values lo, lo + step, ..., hi
};

// A "nice" tick step near x: 1, 2, 5 or 10 times a power of ten (Heckbert, Graphics Gems).
double nice_step(double x) {
  const double power = std::pow(10.0, std::floor(std::log10(x)));
  const double f = x / power;
  return (f < 1.5 ? 1 : f < 3 ? 2 : f < 7 ? 5 : 10) * power;
}

// About `ticks` nice ticks covering [lo, hi]; a single value gets room around it.
Axis nice_axis(double lo, double hi, int ticks, double min_step) {
  if (!(hi > lo)) {
    const double pad = std::max(lo != 0 ? std::abs(lo) * 0.1 : 1.0, min_step);
    lo -= pad;
    hi += pad;
  }
  const double step = std::max(nice_step((hi - lo) / (ticks - 1)), min_step);
  return {std::floor(lo / step) * step, std::ceil(hi / step) * step, step};
}

std::string tick_label(double value, double step) {
  const int decimals = std::clamp(static_cast<int>(-std::floor(std::log10(step) + 1e-9)), 0, 6);
  if (std::abs(value) < step * 1e-6) value = 0;  // no "-0.0"
  char text[64];
  std::snprintf(text, sizeof text, "%.*f", decimals, value);
  return text;
}

std::string escape(const std::string& text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

Curve finite(const Curve& curve) {
  Curve out;
  for (const auto& point : curve) {
    if (std::isfinite(point.second)) out.push_back(point);
  }
  return out;
}

std::string num(double v) {
  char text[32];
  std::snprintf(text, sizeof text, "%.2f", v);
  return text;
}

class Plot {
 public:
  Plot(Axis x, Axis y) : x_(x), y_(y) {}
  double px(double step) const { return kLeft + (step - x_.lo) / (x_.hi - x_.lo) * kPlotWidth; }
  double py(double loss) const { return kTop + (y_.hi - loss) / (y_.hi - y_.lo) * kPlotHeight; }

  void axes(std::ostream& svg) const {
    svg << "<g font-size=\"12\" fill=\"#333\">\n";
    for (double v = x_.lo; v <= x_.hi + x_.step * 1e-6; v += x_.step) {
      const std::string x = num(px(v));
      svg << "<line x1=\"" << x << "\" y1=\"" << kTop << "\" x2=\"" << x << "\" y2=\"" << kTop + kPlotHeight
          << "\" stroke=\"#e5e5e5\"/>\n<text x=\"" << x << "\" y=\"" << kTop + kPlotHeight + 18
          << "\" text-anchor=\"middle\">" << tick_label(v, x_.step) << "</text>\n";
    }
    for (double v = y_.lo; v <= y_.hi + y_.step * 1e-6; v += y_.step) {
      const std::string y = num(py(v));
      svg << "<line x1=\"" << kLeft << "\" y1=\"" << y << "\" x2=\"" << kLeft + kPlotWidth << "\" y2=\"" << y
          << "\" stroke=\"#e5e5e5\"/>\n<text x=\"" << kLeft - 8 << "\" y=\"" << y
          << "\" text-anchor=\"end\" dominant-baseline=\"middle\">" << tick_label(v, y_.step) << "</text>\n";
    }
    svg << "<rect x=\"" << kLeft << "\" y=\"" << kTop << "\" width=\"" << kPlotWidth << "\" height=\"" << kPlotHeight
        << "\" fill=\"none\" stroke=\"#333\"/>\n"
        << "<text x=\"" << kLeft + kPlotWidth / 2 << "\" y=\"" << kHeight - 14
        << "\" text-anchor=\"middle\" font-size=\"14\">step</text>\n"
        << "<text transform=\"translate(18," << kTop + kPlotHeight / 2
        << ") rotate(-90)\" text-anchor=\"middle\" font-size=\"14\">loss</text>\n</g>\n";
  }

  void curve(std::ostream& svg, const Curve& points, const char* name, const char* color, bool markers) const {
    if (points.empty()) return;
    svg << "<polyline class=\"" << name << "\" fill=\"none\" stroke=\"" << color
        << "\" stroke-width=\"1.5\" stroke-linejoin=\"round\" points=\"";
    for (size_t i = 0; i < points.size(); ++i) {
      svg << (i ? " " : "") << num(px(static_cast<double>(points[i].first))) << "," << num(py(points[i].second));
    }
    svg << "\"/>\n";
    if (!markers && points.size() > 1) return;  // a lone point would not show as a line
    for (const auto& [step, loss] : points) {
      svg << "<circle class=\"" << name << "-marker\" cx=\"" << num(px(static_cast<double>(step))) << "\" cy=\""
          << num(py(loss)) << "\" r=\"3\" fill=\"" << color << "\"/>\n";
    }
  }

 private:
  Axis x_, y_;
};

void legend_entry(std::ostream& svg, int row, const std::string& label, const char* color, const char* dash,
                  bool marker) {
  const double x = kLeft + kPlotWidth - 190, y = kTop + 18 + 18 * row;
  svg << "<line x1=\"" << x << "\" y1=\"" << y << "\" x2=\"" << x + 24 << "\" y2=\"" << y << "\" stroke=\"" << color
      << "\" stroke-width=\"1.5\"" << dash << "/>\n";
  if (marker) svg << "<circle cx=\"" << x + 12 << "\" cy=\"" << y << "\" r=\"3\" fill=\"" << color << "\"/>\n";
  svg << "<text x=\"" << x + 30 << "\" y=\"" << y << "\" dominant-baseline=\"middle\" font-size=\"12\">"
      << escape(label) << "</text>\n";
}

std::string render(const Curve& train, const Curve& validation, const std::string& title,
                   double reference, const std::string& reference_label) {
  const bool has_reference = std::isfinite(reference);  // NaN: none
  double x_lo = INFINITY, x_hi = -INFINITY, y_lo = INFINITY, y_hi = -INFINITY;
  for (const Curve* curve : {&train, &validation}) {
    for (const auto& [step, loss] : *curve) {
      x_lo = std::min(x_lo, static_cast<double>(step));
      x_hi = std::max(x_hi, static_cast<double>(step));
      y_lo = std::min(y_lo, loss);
      y_hi = std::max(y_hi, loss);
    }
  }
  if (has_reference) {
    y_lo = std::min(y_lo, reference);
    y_hi = std::max(y_hi, reference);
  }
  if (!(x_hi >= x_lo)) x_lo = 0, x_hi = 1;  // no points at all: an empty frame
  if (!(y_hi >= y_lo)) y_lo = 0, y_hi = 1;
  const double y_pad = (y_hi - y_lo) * 0.04;  // keep points and the reference line off the frame
  y_lo -= y_pad;
  y_hi += y_pad;
  const Plot plot(nice_axis(x_lo, x_hi, 8, 1.0), nice_axis(y_lo, y_hi, 6, 0.0));

  std::ostringstream svg;
  svg << "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
      << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << kWidth << "\" height=\"" << kHeight
      << "\" viewBox=\"0 0 " << kWidth << " " << kHeight << "\" font-family=\"sans-serif\">\n"
      << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
      << "<text x=\"" << kWidth / 2 << "\" y=\"26\" text-anchor=\"middle\" font-size=\"16\">" << escape(title)
      << "</text>\n";
  plot.axes(svg);
  int row = 0;
  if (has_reference) {
    const std::string y = num(plot.py(reference));
    const std::string label = reference_label.empty() ? "reference" : reference_label;
    svg << "<line class=\"reference\" x1=\"" << kLeft << "\" y1=\"" << y << "\" x2=\"" << kLeft + kPlotWidth
        << "\" y2=\"" << y << "\" stroke=\"" << kReferenceColor << "\" stroke-width=\"1.2\" stroke-dasharray=\"6,4\"/>\n"
        << "<text x=\"" << kLeft + 6 << "\" y=\"" << num(plot.py(reference) - 5) << "\" font-size=\"12\" fill=\""
        << kReferenceColor << "\">" << escape(label) << " (" << tick_label(reference, 0.001) << ")</text>\n";
  }
  plot.curve(svg, train, "train", kTrainColor, false);
  plot.curve(svg, validation, "validation", kValidationColor, true);
  const int rows = std::max(1, int{!train.empty()} + int{!validation.empty()} + int{has_reference});
  svg << "<g class=\"legend\">\n<rect x=\"" << kLeft + kPlotWidth - 198 << "\" y=\"" << kTop + 6
      << "\" width=\"190\" height=\"" << 18 * rows + 6 << "\" fill=\"white\" fill-opacity=\"0.85\" stroke=\"#cccccc\"/>\n";
  if (!train.empty()) legend_entry(svg, row++, "training loss", kTrainColor, "", false);
  if (!validation.empty()) legend_entry(svg, row++, "validation loss", kValidationColor, "", true);
  if (has_reference) {
    legend_entry(svg, row++, reference_label.empty() ? "reference" : reference_label, kReferenceColor,
                 " stroke-dasharray=\"6,4\"", false);
  }
  if (row == 0) legend_entry(svg, row++, "no data yet", "#999999", "", false);
  svg << "</g>\n</svg>\n";
  return svg.str();
}

}  // namespace

void write_loss_curve_svg(const std::string& path, const Curve& train, const Curve& validation,
                          const std::string& title, std::optional<double> reference_line,
                          const std::string& reference_label) {
  const std::string svg =
      render(finite(train), finite(validation), title, reference_line.value_or(NAN), reference_label);
  const std::string temp = path + ".tmp-" + std::to_string(getpid());
  std::FILE* file = std::fopen(temp.c_str(), "wb");
  if (file == nullptr) {
    throw std::runtime_error("cannot write the loss curve " + path + ": " + std::strerror(errno));
  }
  const bool written = std::fwrite(svg.data(), 1, svg.size(), file) == svg.size();
  const int err = errno;
  if (std::fclose(file) != 0 || !written || std::rename(temp.c_str(), path.c_str()) != 0) {
    const int why = written ? errno : err;
    std::remove(temp.c_str());
    throw std::runtime_error("cannot write the loss curve " + path + ": " + std::strerror(why));
  }
}

}  // namespace train_gpt
