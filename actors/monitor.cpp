#include "actors/monitor.hpp"

#include "core/paths.hpp"
#include "messages/messages.hpp"

#include <caf/all.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <unistd.h>

namespace kernelrl {

namespace {

double get(const std::map<std::string, double>& m, const std::string& k, double dflt = 0) {
  auto it = m.find(k);
  return it == m.end() ? dflt : it->second;
}

std::string fmt_eta(double s) {
  if (s < 0) return "--:--";
  long t = static_cast<long>(s + 0.5);
  return fmt::format("{}:{:02d}", t / 60, int(t % 60));
}

struct monitor_state {
  std::map<std::string, double> merged;  // "source.key" -> value
  std::unique_ptr<std::ofstream> metrics;
  bool tty = false;
  double last_plain = 0;
  size_t last_len = 0;
  uint64_t ticks = 0;
  static inline const char* name = "monitor";
};

using self_ptr = caf::stateful_actor<monitor_state>*;

void emit(self_ptr self, const MonitorArgs& args, const caf::actor& recorder, bool final_line) {
  auto& st = self->state;
  std::vector<std::pair<std::string, double>> vals(st.merged.begin(), st.merged.end());
  std::string line = format_progress(args.label, vals);
  bool planned = get(st.merged, "supervisor.samples_total") > 0;
  if (args.progress && (planned || final_line)) {
    if (st.tty) {
      std::string pad = line.size() < st.last_len ? std::string(st.last_len - line.size(), ' ') : "";
      std::fprintf(stderr, "\r%s%s%s", line.c_str(), pad.c_str(), final_line ? "\n" : "");
      st.last_len = line.size();
    } else if (final_line || mono_s() - st.last_plain >= 10 * args.interval_s) {
      std::fprintf(stderr, "%s\n", line.c_str());
      st.last_plain = mono_s();
    }
    std::fflush(stderr);
  }
  Telemetry snap;
  snap.ts = now_s();
  snap.source = "monitor";
  snap.values = st.merged;
  if (st.metrics) {
    nlohmann::json j = {{"ts", snap.ts}, {"values", snap.values}};
    *st.metrics << j.dump() << "\n";
    st.metrics->flush();
  }
  if (recorder) self->send(recorder, record_atom::value, std::move(snap));
}

void poll(self_ptr self, const std::vector<caf::actor>& sources) {
  auto timeout = std::chrono::seconds(2);
  for (auto& src : sources) {
    self->request(src, timeout, stats_atom::value)
        .then([=](Telemetry& t) {
                for (auto& [k, v] : t.values) self->state.merged[t.source + "." + k] = v;
              },
              [](caf::error&) { /* busy or gone: skip this tick */ });
  }
}

caf::behavior monitor_actor(self_ptr self, MonitorArgs args, std::vector<caf::actor> sources,
                            caf::actor recorder) {
  self->state.tty = isatty(STDERR_FILENO) == 1;
  if (!args.metrics_path.empty())
    self->state.metrics = std::make_unique<std::ofstream>(args.metrics_path, std::ios::app);
  auto interval = std::chrono::milliseconds(static_cast<long>(args.interval_s * 1000));
  self->send(self, tick_atom::value);
  return {
      [=](tick_atom) {
        if (self->state.ticks++ > 0) emit(self, args, recorder, false);
        poll(self, sources);
        self->delayed_send(self, interval, tick_atom::value);
      },
      [=](finish_atom) -> caf::response_promise {
        // One last round of answers, then the final line.
        auto rp = self->make_response_promise();
        auto pending = std::make_shared<size_t>(sources.size());
        auto done = [=]() mutable {
          if (--*pending == 0) {
            emit(self, args, recorder, true);
            rp.deliver(true);
          }
        };
        if (sources.empty()) {
          emit(self, args, recorder, true);
          rp.deliver(true);
        }
        for (auto& src : sources) {
          self->request(src, std::chrono::seconds(2), stats_atom::value)
              .then([=](Telemetry& t) mutable {
                      for (auto& [k, v] : t.values) self->state.merged[t.source + "." + k] = v;
                      done();
                    },
                    [=](caf::error&) mutable { done(); });
        }
        return rp;
      },
  };
}

}  // namespace

std::string format_progress(const std::string& label,
                            const std::vector<std::pair<std::string, double>>& values) {
  std::map<std::string, double> m(values.begin(), values.end());
  double done = get(m, "supervisor.samples_done"), total = get(m, "supervisor.samples_total");
  double correct = get(m, "supervisor.correct");
  double failed = done - correct;
  return fmt::format("[{}] {}/{} samples | correct {} | failed {} | fast_1 {:.2f} | reward {:.3f} | "
                     "{:.2f} samples/s | queue {} | in flight {} | ETA {}",
                     label, uint64_t(done), uint64_t(total), uint64_t(correct),
                     uint64_t(failed < 0 ? 0 : failed), get(m, "supervisor.fast_1"),
                     get(m, "supervisor.mean_reward"), get(m, "supervisor.samples_per_s"),
                     uint64_t(get(m, "dispatcher.queue_depth")),
                     uint64_t(get(m, "dispatcher.in_flight")),
                     fmt_eta(get(m, "supervisor.eta_s", -1)));
}

caf::actor spawn_monitor(caf::actor_system& sys, MonitorArgs args, std::vector<caf::actor> sources,
                         caf::actor recorder) {
  return sys.spawn(monitor_actor, std::move(args), std::move(sources), std::move(recorder));
}

}  // namespace kernelrl
