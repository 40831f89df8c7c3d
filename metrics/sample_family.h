// Families of samples taken at a scrape (gauges and counters read from the process's own state,
// not kept in a registry), in prometheus-cpp's types for its serializer: for collectables that
// read state owned elsewhere (the daemon's jobs, the store, the front door).
#pragma once

#include <prometheus/metric_family.h>

#include <string>
#include <utility>
#include <vector>

namespace ddprun {

class SampleFamily {
 public:
  SampleFamily(std::string name, std::string help, prometheus::MetricType type) {
    family_.name = std::move(name);
    family_.help = std::move(help);
    family_.type = type;
  }
  // One sample; labels as name/value pairs.
  SampleFamily& add(double value, std::vector<std::pair<std::string, std::string>> labels = {}) {
    prometheus::ClientMetric m;
    for (auto& [name, v] : labels) m.label.push_back({std::move(name), std::move(v)});
    if (family_.type == prometheus::MetricType::Counter) {
      m.counter.value = value;
    } else {
      m.gauge.value = value;
    }
    family_.metric.push_back(std::move(m));
    return *this;
  }
  // Moves the family into `out` (a family without samples is left out, as the text format wants).
  void into(std::vector<prometheus::MetricFamily>* out) {
    if (!family_.metric.empty()) out->push_back(std::move(family_));
  }

 private:
  prometheus::MetricFamily family_;
};

}  // namespace ddprun
