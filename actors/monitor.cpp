#include "actors/monitor.hpp"
#include "actors/supervisor.hpp"
#include "actors/unexpected.hpp"

#include "core/log.hpp"
#include "core/paths.hpp"
#include "messages/messages.hpp"

#include <caf/all.hpp>
#include <fmt/format.h>
#include <msgpack.hpp>
#include <nlohmann/json.hpp>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include <array>
#include <atomic>
#include <cstdio>
#include <set>
#include <thread>
#include <fstream>
#include <algorithm>
#include <map>
#include <memory>
#include <sys/ioctl.h>
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
  std::map<std::string, double> merged;                           // "source.key" -> value
  std::map<std::string, std::map<std::string, double>> samplers;  // each sampler's last gauges
  std::vector<telemetry_source> sources;                          // asked every tick
  std::map<caf::actor_addr, std::string> names;                   // a source's telemetry name
  std::unique_ptr<std::ofstream> metrics;
  bool tty = false;
  double last_plain = 0;
  size_t last_len = 0;
  uint64_t ticks = 0;
  static inline const char* name = "monitor";
};

using self_ptr = monitor_actor::stateful_pointer<monitor_state>;

void emit(self_ptr self, const MonitorArgs& args, const telemetry_recorder& recorder, bool final_line) {
  auto& st = self->state;
  std::vector<std::pair<std::string, double>> vals(st.merged.begin(), st.merged.end());
  std::string line = format_progress(args.label, vals);
  bool planned = get(st.merged, "supervisor.samples_total") > 0;
  if (args.progress && (planned || final_line)) {
    if (st.tty) {
      // Clipped to the terminal's width (asked each time: it may be resized), so that the carriage
      // return rewrites one line and never a wrapped one.
      winsize ws{};
      if (ioctl(STDERR_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 1) line = fit_progress(line, ws.ws_col - 1);
      std::string pad = line.size() < st.last_len ? std::string(st.last_len - line.size(), ' ') : "";
      std::fprintf(stderr, "\r%s%s%s", line.c_str(), pad.c_str(), final_line ? "\n" : "");
      st.last_len = line.size();
      if (!final_line) log::progress_line_shown();
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
  if (args.publisher) args.publisher->publish(snap);
  if (recorder) caf::anon_send(recorder, record_atom::value, std::move(snap));
}

// The samplers' gauges summed as "sampler.key", and with more than one kept per sampler too.
void sum_samplers(self_ptr self) {
  auto& st = self->state;
  std::map<std::string, double> sum;
  for (auto& [src, values] : st.samplers)
    for (auto& [k, v] : values) {
      sum[k] += v;
      if (st.samplers.size() > 1) st.merged[src + "." + k] = v;
    }
  for (auto& [k, v] : sum) st.merged["sampler." + k] = v;
}

// A source's gauges into the snapshot, as "source.key". Samplers report as "sampler-...": their
// gauges are summed as "sampler.key" (rollouts, tokens, tokens/s, queues).
void merge(self_ptr self, const Telemetry& t) {
  auto& st = self->state;
  if (t.source.rfind("sampler-", 0) != 0) {
    for (auto& [k, v] : t.values) st.merged[t.source + "." + k] = v;
    return;
  }
  st.samplers[t.source] = t.values;
  sum_samplers(self);
}

// A source is gone: it is no longer asked; a sampler keeps its counts in the sums, but its rate
// and queues no longer count.
void source_gone(self_ptr self, const caf::actor_addr& a) {
  auto& st = self->state;
  st.sources.erase(std::remove_if(st.sources.begin(), st.sources.end(), [&](auto& s) { return s.address() == a; }),
                   st.sources.end());
  auto it = st.names.find(a);
  if (it == st.names.end()) return;
  auto s = st.samplers.find(it->second);
  if (s != st.samplers.end()) {
    for (const char* k : {"tokens_per_s", "waiting", "to_generate"})
      if (s->second.count(k)) s->second[k] = 0;
    sum_samplers(self);
  }
  st.names.erase(it);
}

void poll(self_ptr self, const std::vector<telemetry_source>& sources) {
  auto timeout = std::chrono::seconds(2);
  for (auto& src : sources) {
    self->request(src, timeout, stats_atom::value)
        .then(
            [=](Telemetry& t) {
              self->state.names[src.address()] = t.source;
              merge(self, t);
            },
            [](caf::error&) { /* busy or gone: skip this tick */ });
  }
}

monitor_actor::behavior_type monitor_behavior(self_ptr self, MonitorArgs args, std::vector<telemetry_source> sources0,
                                              telemetry_recorder recorder) {
  self->state.sources = std::move(sources0);
  for (auto& src : self->state.sources) self->monitor(src);
  self->set_down_handler([=](caf::down_msg& dm) { source_gone(self, dm.source); });
  log_unexpected_messages(self, "monitor");
  self->state.tty = isatty(STDERR_FILENO) == 1;
  if (!args.metrics_path.empty())
    self->state.metrics = std::make_unique<std::ofstream>(args.metrics_path, std::ios::app);
  auto interval = std::chrono::milliseconds(static_cast<long>(args.interval_s * 1000));
  self->send(self, tick_atom::value);
  return {
      [=](tick_atom) {
        if (self->state.ticks++ > 0) emit(self, args, recorder, false);
        poll(self, self->state.sources);
        self->delayed_send(self, interval, tick_atom::value);
      },
      [=](register_atom, caf::actor a, const std::string&) {  // a sampler on another node (the gate)
        auto src = caf::actor_cast<telemetry_source>(a);
        auto& v = self->state.sources;
        if (std::find(v.begin(), v.end(), src) != v.end()) return;
        self->monitor(src);
        v.push_back(std::move(src));
      },
      [=](stats_atom) {
        Telemetry t;
        t.ts = now_s();
        t.source = "cluster";
        t.values = self->state.merged;
        t.step = static_cast<uint32_t>(get(t.values, "supervisor.step"));
        return t;
      },
      [=](finish_atom) -> caf::result<bool> {
        // One last round of answers, then the final line.
        auto rp = self->make_response_promise<bool>();
        const auto sources = self->state.sources;
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
              .then(
                  [=](Telemetry& t) mutable {
                    merge(self, t);
                    done();
                  },
                  [=](caf::error&) mutable { done(); });
        }
        return rp;
      },
  };
}

}  // namespace

struct TelemetryPublisher::Impl {
  zmq::context_t ctx{1};
  zmq::socket_t sock{ctx, zmq::socket_type::pub};
  std::string endpoint;
  // CURVE: the ZAP handler (ZeroMQ's authentication protocol, RFC 27) on its own thread.
  std::set<std::string> clients;  // admitted public keys, 32 raw bytes each
  std::thread zap;
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> refused{0};

  ~Impl() {
    stop = true;
    if (zap.joinable()) zap.join();
  }

  // Answers each handshake's request: 200 for a listed key, 400 for any other.
  void serve_zap(zmq::socket_t rep) {
    auto lg = log::get("monitor");
    std::set<std::string> warned;
    while (!stop) {
      zmq::pollitem_t item{rep.handle(), 0, ZMQ_POLLIN, 0};
      if (zmq::poll(&item, 1, std::chrono::milliseconds(100)) <= 0) continue;
      std::vector<zmq::message_t> req;
      if (!zmq::recv_multipart(rep, std::back_inserter(req))) continue;
      // version, request id, domain, address, identity, mechanism, credentials...
      const bool ok = req.size() >= 7 && req[5].to_string() == "CURVE" && req[6].size() == 32 &&
                      clients.count(req[6].to_string()) > 0;
      const std::string address = req.size() > 3 ? req[3].to_string() : "?";
      if (!ok) {
        ++refused;
        if (warned.insert(address).second)
          lg->warn("telemetry: refused a reader at {} (its key is not in [monitor] publish_clients)", address);
      }
      std::array<zmq::const_buffer, 6> reply{zmq::str_buffer("1.0"),
                                             zmq::buffer(req.size() > 1 ? req[1].to_string_view() : ""),
                                             ok ? zmq::str_buffer("200") : zmq::str_buffer("400"),
                                             ok ? zmq::str_buffer("OK") : zmq::str_buffer("key not admitted"),
                                             zmq::str_buffer(""),
                                             zmq::str_buffer("")};
      zmq::send_multipart(rep, reply);
    }
  }
};

TelemetryPublisher::TelemetryPublisher() : impl_(std::make_unique<Impl>()) {}
TelemetryPublisher::~TelemetryPublisher() = default;

std::unique_ptr<TelemetryPublisher> TelemetryPublisher::bind(const std::string& endpoint, std::string& err,
                                                             const std::string& curve_secret,
                                                             const std::vector<std::string>& clients) {
  std::unique_ptr<TelemetryPublisher> p(new TelemetryPublisher());
  auto& impl = *p->impl_;
  try {
    if (!curve_secret.empty()) {
      for (auto& k : clients) {
        std::string raw(32, '\0');
        if (k.size() != 40 || !zmq_z85_decode(reinterpret_cast<uint8_t*>(raw.data()), k.c_str()))
          throw std::runtime_error("not a Z85 public key: " + k);
        impl.clients.insert(raw);
      }
      // The handler is bound before the socket that needs it, in the same context.
      zmq::socket_t rep{impl.ctx, zmq::socket_type::rep};
      rep.set(zmq::sockopt::linger, 0);
      rep.bind("inproc://zeromq.zap.01");
      impl.zap = std::thread([&impl, r = std::move(rep)]() mutable { impl.serve_zap(std::move(r)); });
      impl.sock.set(zmq::sockopt::curve_server, 1);
      impl.sock.set(zmq::sockopt::curve_secretkey, curve_secret);
      impl.sock.set(zmq::sockopt::zap_domain, "kernelrl.telemetry");
    }
    impl.sock.set(zmq::sockopt::linger, 0);
    impl.sock.set(zmq::sockopt::sndhwm, 64);  // a slow subscriber drops snapshots
    impl.sock.bind(endpoint);
    impl.endpoint = impl.sock.get(zmq::sockopt::last_endpoint);
  } catch (const std::exception& e) {
    err = "[monitor] publish = \"" + endpoint + "\": cannot bind: " + e.what();
    return nullptr;
  }
  return p;
}

uint64_t TelemetryPublisher::refused() const { return impl_->refused; }

const std::string& TelemetryPublisher::endpoint() const { return impl_->endpoint; }

void TelemetryPublisher::publish(const Telemetry& t) {
  msgpack::sbuffer buf;
  msgpack::pack(buf, t);
  try {
    impl_->sock.send(zmq::buffer(std::string_view(telemetry_topic)),
                     zmq::send_flags::sndmore | zmq::send_flags::dontwait);
    impl_->sock.send(zmq::buffer(buf.data(), buf.size()), zmq::send_flags::dontwait);
  } catch (const zmq::error_t&) {
    // PUB never blocks; an error here only loses this snapshot for subscribers.
  }
}

std::string format_progress(const std::string& label, const std::vector<std::pair<std::string, double>>& values) {
  std::map<std::string, double> m(values.begin(), values.end());
  double done = get(m, "supervisor.samples_done"), total = get(m, "supervisor.samples_total");
  double correct = get(m, "supervisor.correct");
  double failed = done - correct;
  if (m.count("supervisor.steps_total")) {  // train: where the run is, what the last step scored, the learner
    std::string held;                       // the latest periodic evaluation on held-out tasks
    if (get(m, "supervisor.eval_fast_1", -1) >= 0)
      held = fmt::format(" | held-out fast_1 {:.2f} (v{})", get(m, "supervisor.eval_fast_1"),
                         uint64_t(get(m, "supervisor.eval_version")));
    return fmt::format(
        "[{}] step {}/{} | {} samples | fast_1 last step {:.2f}{} | reward {:.3f} | loss {:.4f} | "
        "entropy {:.3f} | policy v{} | {:.2f} samples/s | queue {} | in flight {} | ETA {}",
        label, uint64_t(get(m, "supervisor.step")) + 1, uint64_t(get(m, "supervisor.steps_total")), uint64_t(done),
        std::max(0.0, get(m, "supervisor.step_fast_1")), held, get(m, "supervisor.mean_reward"), get(m, "learner.loss"),
        get(m, "learner.entropy"), uint64_t(get(m, "supervisor.policy_version")), get(m, "supervisor.samples_per_s"),
        uint64_t(get(m, "dispatcher.queue_depth")), uint64_t(get(m, "dispatcher.in_flight")),
        fmt_eta(get(m, "supervisor.eta_s", -1)));
  }
  return fmt::format(
      "[{}] {}/{} samples | correct {} | failed {} | fast_1 {:.2f} | reward {:.3f} | "
      "{:.2f} samples/s | queue {} | in flight {} | ETA {}",
      label, uint64_t(done), uint64_t(total), uint64_t(correct), uint64_t(failed < 0 ? 0 : failed),
      get(m, "supervisor.fast_1"), get(m, "supervisor.mean_reward"), get(m, "supervisor.samples_per_s"),
      uint64_t(get(m, "dispatcher.queue_depth")), uint64_t(get(m, "dispatcher.in_flight")),
      fmt_eta(get(m, "supervisor.eta_s", -1)));
}

std::string fit_progress(const std::string& line, size_t width) {
  if (line.size() <= width) return line;
  std::vector<std::string> fields;
  for (size_t at = 0;;) {
    auto bar = line.find(" | ", at);
    fields.push_back(line.substr(at, bar == std::string::npos ? std::string::npos : bar - at));
    if (bar == std::string::npos) break;
    at = bar + 3;
  }
  auto joined = [&] {
    std::string out;
    for (auto& f : fields)
      if (!f.empty()) out += (out.empty() ? "" : " | ") + f;
    return out;
  };
  // Least useful first; the first field (where the run is) and the ETA stay.
  static const char* order[] = {"in flight", "queue",   "entropy", "loss",   "policy v", "held-out",
                                "failed",    "correct", "reward",  "fast_1", "samples"};
  for (const char* name : order) {
    for (size_t i = 1; i + 1 < fields.size(); ++i)
      if (fields[i].find(name) != std::string::npos) fields[i].clear();
    auto out = joined();
    if (out.size() <= width) return out;
  }
  for (size_t i = 1; i + 1 < fields.size(); ++i) fields[i].clear();
  auto out = joined();
  if (out.size() > width) out.resize(width);
  return out;
}

std::string format_snapshot(const std::string& label, const std::vector<std::pair<std::string, double>>& values) {
  std::map<std::string, double> m(values.begin(), values.end());
  std::string out = format_progress(label, values) + "\n";
  out += fmt::format("step {} | policy version {} | staleness max {} mean {:.2f} | correct rate {:.2f}\n",
                     uint64_t(get(m, "supervisor.step")), uint64_t(get(m, "supervisor.policy_version")),
                     uint64_t(get(m, "supervisor.staleness_max")), get(m, "supervisor.staleness_mean"),
                     get(m, "supervisor.correct_rate"));
  out += fmt::format(
      "speedup (correct samples) p10 {:.2f} | p25 {:.2f} | p50 {:.2f} | p75 {:.2f} | p90 {:.2f} | max {:.2f}\n",
      get(m, "supervisor.speedup.p10"), get(m, "supervisor.speedup.p25"), get(m, "supervisor.speedup.p50"),
      get(m, "supervisor.speedup.p75"), get(m, "supervisor.speedup.p90"), get(m, "supervisor.speedup.max"));
  out += "reward histogram";
  for (auto& bin : reward_histogram_bins())
    out += fmt::format(" | {} {}", bin, uint64_t(get(m, "supervisor.reward_hist." + bin)));
  out += "\n";
  // Nodes, from the dispatcher's "node.NAME.KEY" gauges.
  std::map<std::string, std::map<std::string, double>> nodes;
  const std::string pre = "dispatcher.node.";
  for (auto& [k, v] : m) {
    if (k.rfind(pre, 0) != 0) continue;
    auto rest = k.substr(pre.size());
    auto dot = rest.rfind('.');
    if (dot == std::string::npos) continue;
    nodes[rest.substr(0, dot)][rest.substr(dot + 1)] = v;
  }
  for (auto& [node, g] : nodes)
    out += fmt::format("node {}: {} evaluator(s) | in flight {}/{} | utilisation {:.0f}% | completed {}\n", node,
                       uint64_t(g["evaluators"]), uint64_t(g["in_flight"]), uint64_t(g["capacity"]),
                       100 * g["utilisation"], uint64_t(g["completed"]));
  out += fmt::format("sampler: {} rollouts, {:.1f} tokens/s | learner idle ratio {}\n",
                     uint64_t(get(m, "sampler.rollouts")), get(m, "sampler.tokens_per_s"),
                     m.count("learner.idle_ratio") ? fmt::format("{:.2f}", m["learner.idle_ratio"])
                                                   : std::string("- (no learner in this experiment)"));
  return out;
}

monitor_actor spawn_monitor(caf::actor_system& sys, MonitorArgs args, std::vector<telemetry_source> sources,
                            telemetry_recorder recorder) {
  return sys.spawn(monitor_behavior, std::move(args), std::move(sources), std::move(recorder));
}

}  // namespace kernelrl
