// The standard Prometheus process metrics of this process, read from /proc at each scrape, under
// the names every Prometheus client library uses (so dashboards for any exporter work):
// process_resident_memory_bytes, process_virtual_memory_bytes, process_open_fds, process_max_fds,
// process_cpu_seconds_total, process_start_time_seconds; and ddprun_process_threads.
#pragma once

#include <prometheus/collectable.h>
#include <prometheus/metric_family.h>

#include <string>
#include <vector>

namespace ddprun {

class ProcessCollector final : public prometheus::Collectable {
 public:
  // procRoot: where procfs is mounted ("/proc"); another folder in tests.
  explicit ProcessCollector(std::string procRoot = "/proc");

  // A metric whose source cannot be read or parsed has no sample (nor family) this time; never
  // throws.
  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  std::string procRoot_;
};

}  // namespace ddprun
