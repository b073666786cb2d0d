// Test helper: reads a metric back from a prometheus-cpp registry.
#pragma once

#include <limits>
#include <string>

#include <prometheus/registry.h>

namespace asympo::testing {

// The value of metric `name` (a histogram gives its sample count): its
// first child, or with `label_value` the first child with a label of that
// value. NaN when absent.
inline double MetricValue(prometheus::Registry& r, const std::string& name,
                          const std::string& label_value = "") {
  for (const prometheus::MetricFamily& f : r.Collect()) {
    if (f.name != name) continue;
    for (const prometheus::ClientMetric& m : f.metric) {
      if (!label_value.empty()) {
        bool found = false;
        for (const auto& l : m.label) found = found || l.value == label_value;
        if (!found) continue;
      }
      switch (f.type) {
        case prometheus::MetricType::Counter:
          return m.counter.value;
        case prometheus::MetricType::Gauge:
          return m.gauge.value;
        case prometheus::MetricType::Histogram:
          return static_cast<double>(m.histogram.sample_count);
        default:
          return std::numeric_limits<double>::quiet_NaN();
      }
    }
  }
  return std::numeric_limits<double>::quiet_NaN();
}

}  // namespace asympo::testing
