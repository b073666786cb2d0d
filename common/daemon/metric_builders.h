// Short forms for registering one prometheus-cpp metric (a family with a
// single child), shared by every daemon's metrics.
#pragma once

#include <string>

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

namespace asympo::metrics {

inline prometheus::Gauge& AddGauge(prometheus::Registry& r, const std::string& name,
                                   const std::string& help, const prometheus::Labels& labels = {}) {
  return prometheus::BuildGauge().Name(name).Help(help).Register(r).Add(labels);
}

inline prometheus::Counter& AddCounter(prometheus::Registry& r, const std::string& name,
                                       const std::string& help) {
  return prometheus::BuildCounter().Name(name).Help(help).Register(r).Add({});
}

inline prometheus::Histogram& AddHistogram(prometheus::Registry& r, const std::string& name,
                                           const std::string& help,
                                           prometheus::Histogram::BucketBoundaries buckets) {
  return prometheus::BuildHistogram().Name(name).Help(help).Register(r).Add({}, std::move(buckets));
}

}  // namespace asympo::metrics
