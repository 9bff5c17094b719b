// The pieces of a run's wiring that the head (launch CONFIG) and the other nodes (launch CONFIG
// --node NAME, --join) share: roles, the head's address, the middleman, the gate's publication,
// a node's evaluators and its memory plan, joining a cluster, and the actor system's shutdown.
#include "wiring/cluster.hpp"

#include "actors/gate.hpp"
#include "actors/monitor.hpp"
#include "core/auth.hpp"
#include "core/curve.hpp"
#include "core/log.hpp"
#include "core/machine.hpp"
#include "core/paths.hpp"
#include "messages/messages.hpp"

#include <caf/all.hpp>
#include <caf/io/all.hpp>
#include <caf/openssl/all.hpp>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <cstdio>
#include <filesystem>
#include <thread>

#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

namespace fs = std::filesystem;

namespace kernelrl {

std::string sanitize_id(std::string s) {
  for (auto& c : s)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_' && c != '.') c = '_';
  return s;
}

bool has_role(const NodeConfig& n, const std::string& role) {
  for (auto& r : n.roles)
    if (r == role) return true;
  return false;
}

bool is_cluster(const Config& cfg) {
  for (auto& n : cfg.nodes)
    if (n.port != 0) return true;
  return false;
}

const NodeConfig& head_node(const Config& cfg) {
  for (auto& n : cfg.nodes)
    if (has_role(n, "supervisor")) return n;
  return cfg.nodes.front();
}

const NodeConfig* learner_node(const Config& cfg) {
  if (!is_cluster(cfg) || has_role(head_node(cfg), "learner")) return nullptr;
  for (auto& n : cfg.nodes)
    if (has_role(n, "learner")) return &n;
  return nullptr;
}

const NodeConfig* monitor_node(const Config& cfg) {
  if (!is_cluster(cfg)) return nullptr;
  for (auto& n : cfg.nodes)
    if (&n != &head_node(cfg) && has_role(n, "monitor")) return &n;
  return nullptr;
}

std::optional<MonitorArgs> monitor_settings(const Config& cfg, const std::string& run_dir) {
  auto lg = log::get("launch");
  MonitorArgs ma;
  ma.progress = cfg.monitor.progress;
  ma.interval_s = cfg.monitor.interval_s;
  ma.metrics_path = (fs::path(run_dir) / cfg.monitor.metrics_file).string();
  ma.label = name(cfg.experiment.mode);
  if (!cfg.monitor.publish.empty()) {
    std::string perr;
    std::optional<std::string> key;
    std::optional<std::vector<std::string>> readers;
    if (!cfg.monitor.publish_key.empty()) {  // checked when read; read again here, as the run starts
      key = read_curve_key(cfg.monitor.publish_key, true, perr);
      if (key) readers = read_curve_clients(cfg.monitor.publish_clients, perr);
      if (!key || !readers) {
        lg->error("[monitor] {}", perr);
        return std::nullopt;
      }
    }
    ma.publisher = TelemetryPublisher::bind(cfg.monitor.publish, perr, key.value_or(""),
                                            readers.value_or(std::vector<std::string>{}));
    if (!ma.publisher) {
      lg->error("{}", perr);
      return std::nullopt;
    }
    if (key)
      lg->info(
          "telemetry published on {} (ZeroMQ PUB, topic \"{}\", msgpack; CURVE: encrypted, {} reader key(s) "
          "admitted, server public key {})",
          ma.publisher->endpoint(), telemetry_topic, readers->size(), curve_public_of(*key));
    else
      lg->info("telemetry published on {} (ZeroMQ PUB, topic \"{}\", msgpack)", ma.publisher->endpoint(),
               telemetry_topic);
  }
  return ma;
}

void head_address(const Config& cfg, std::string& host, uint16_t& port) {
  if (!cfg.cluster.head.empty() && parse_host_port(cfg.cluster.head, host, port)) return;  // validated at load
  auto& h = head_node(cfg);
  host = h.host;
  port = h.port;
}

void configure_middleman(caf::actor_system_config& sys_cfg, const ClusterConfig& cluster) {
  sys_cfg.load<caf::io::middleman>();
  auto ms = [](double s) { return caf::timespan{std::chrono::milliseconds(static_cast<int64_t>(s * 1000))}; };
  sys_cfg.set("middleman.heartbeat-interval", ms(cluster.heartbeat_s));
  sys_cfg.set("middleman.connection-timeout", ms(cluster.peer_timeout_s));
  if (cluster.tls) {  // every link through CAF's OpenSSL transport, certificates required both ways
    sys_cfg.load<caf::openssl::manager>();
    sys_cfg.openssl_certificate = cluster.tls_cert;
    sys_cfg.openssl_key = cluster.tls_key;
    sys_cfg.openssl_cafile = cluster.tls_ca;
  }
}

caf::expected<uint16_t> publish_gate(const gate_actor& typed, uint16_t port, const std::string& host) {
  // Published without its interface: CAF refuses a dynamically typed remote handle to an actor
  // published with one (unexpected_actor_messaging_interface), and a peer reaches the gate
  // before it knows the head's version (hello and join answer any version clearly).
  auto gate = caf::actor_cast<caf::actor>(typed);
  if (gate.home_system().has_openssl_manager()) return caf::openssl::publish(gate, port, host.c_str(), true);
  return gate.home_system().middleman().publish(gate, port, host.c_str(), true);
}

void unpublish_gate(const gate_actor& gate) {
  if (gate.home_system().has_openssl_manager())
    // (Debian's caf/openssl/unpublish.hpp does not compile against 0.17; this is what it means.)
    caf::anon_send(gate.home_system().openssl_manager().actor_handle(), caf::unpublish_atom::value, gate.address(),
                   uint16_t{0});
  else
    gate.home_system().middleman().unpublish(gate, 0);
}

std::vector<std::string> evaluator_devices(const NodeConfig& node) {
  std::vector<std::string> devices;
  if (!has_role(node, "evaluator")) return devices;
  for (uint32_t i = 0; i < node.cpu_slots; ++i) devices.push_back("cpu-" + std::to_string(i));
  // per_gpu evaluators on each GPU: "cuda:N", then "cuda:N#2", "cuda:N#3"... (their ids differ; one worker
  // each, sharing the GPU through its lock, gpu/devlock.py).
  for (auto g : node.gpus)
    for (uint32_t k = 0; k < std::max<uint32_t>(1, node.per_gpu); ++k)
      devices.push_back("cuda:" + std::to_string(g) + (k ? "#" + std::to_string(k + 1) : ""));
  return devices;
}

MemoryPlan node_memory_plan(const Config& cfg, const NodeConfig& node, std::string* shared_with) {
  // The config's other nodes on the same host run on this machine too (configs/cluster-local.toml
  // puts every node on 127.0.0.1): their candidates share its memory. A machine that joined with
  // --join is none of them.
  const auto own = uint32_t(evaluator_devices(node).size());
  uint32_t at_once = std::max<uint32_t>(1, own);
  const bool listed = std::any_of(cfg.nodes.begin(), cfg.nodes.end(), [&](const NodeConfig& n) { return &n == &node; });
  std::string beside;
  if (listed && own > 0)
    for (auto& n : cfg.nodes) {
      const auto d = uint32_t(evaluator_devices(n).size());
      if (&n == &node || n.host != node.host || d == 0) continue;
      at_once += d;
      beside += (beside.empty() ? "" : ", ") + n.name;
    }
  if (shared_with)
    *shared_with = beside.empty()
                       ? ""
                       : " (shared with node" + std::string(beside.find(',') != std::string::npos ? "s " : " ") +
                             beside + ", also at " + node.host + ")";
  return plan_candidate_memory(cfg.evaluator, at_once, machine_memory_mb());
}

std::vector<EvaluatorArgs> node_evaluators(const Config& cfg, const NodeConfig& node, const std::string& log_dir) {
  std::vector<EvaluatorArgs> out;
  const std::vector<std::string> devices = evaluator_devices(node);
  // The candidates' memory limit on this machine (memory_limit_mb = "auto": shared out over every
  // candidate that can run at once), said at start-up; a sum larger than the machine is warned of.
  std::string shared;
  const MemoryPlan mem = node_memory_plan(cfg, node, &shared);
  if (!devices.empty()) {
    auto lg = log::get("launch");
    lg->info("node {}: {}{}", node.name, mem.describe(), shared);
    if (mem.exceeds())
      lg->warn(
          "node {}: the candidates' memory limits add up to more than this machine has for them ({}): a batch of "
          "memory-hungry candidates can exhaust it; {}",
          node.name, mem.describe(), mem.advice());
  }
  for (auto& d : devices) {
    EvaluatorArgs ea;
    ea.id = node.name + "/" + d;
    ea.settings = cfg.evaluator;
    ea.settings.memory_limit_mb = mem.per_candidate_mb;
    ea.worker.python = cfg.evaluator.python;
    ea.worker.script = source_dir() + "/gpu/worker.py";
    ea.worker.device = d.rfind("cpu", 0) == 0 ? "cpu" : d.substr(0, d.find('#'));
    ea.worker.threads = cfg.evaluator.torch_threads;
    ea.worker.log_path = (fs::path(log_dir) / (sanitize_id(ea.id) + ".log")).string();
    ea.worker.cache_dir = cfg.evaluator.cache_dir;
    ea.worker.isolate_network = cfg.evaluator.isolate_network;
    // Out of candidates' sight: every run's folder and store (the run root, and this run's folder
    // wherever --run-dir put it: the workers' logs are in RUN_DIR/workers) and the cluster's secrets.
    ea.worker.hide = {cfg.experiment.run_root, fs::path(log_dir).parent_path().string()};
    for (const std::string* secret : {&cfg.cluster.secret_file, &cfg.cluster.tls_key, &cfg.monitor.publish_key})
      if (!secret->empty()) ea.worker.hide.push_back(fs::absolute(*secret).string());
    out.push_back(ea);
  }
  return out;
}

void stop_actor_system(std::unique_ptr<caf::actor_system> sys, std::chrono::seconds grace, int code) {
  // The system is destroyed here, on this thread, as it would be without the watch; a watchdog
  // ends the process if that takes longer than `grace`.
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  std::thread watchdog([&] {
    std::unique_lock lk(mu);
    if (cv.wait_for(lk, grace, [&] { return done; })) return;
    log::get("launch")->warn("the actor system did not stop within {} s after the work ended; leaving without it",
                             grace.count());
    spdlog::apply_all([](const std::shared_ptr<spdlog::logger>& l) { l->flush(); });
    std::fflush(stdout);
    std::fflush(stderr);
    std::_Exit(code);
  });
  sys.reset();
  {
    std::lock_guard lk(mu);
    done = true;
  }
  cv.notify_all();
  watchdog.join();
}

namespace {

// Whether something accepts a TCP connection at host:port within timeout_ms (a head that is not
// up yet refuses it; one that is up but ends CAF's handshake, over TLS or not, accepts it).
bool port_answers(const std::string& host, uint16_t port, int timeout_ms) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found) != 0) return false;
  bool answered = false;
  for (auto* a = found; a && !answered; a = a->ai_next) {
    int fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    if (connect(fd, a->ai_addr, a->ai_addrlen) == 0) {
      answered = true;
    } else if (errno == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      int err = 0;
      socklen_t len = sizeof(err);
      answered = poll(&p, 1, timeout_ms) == 1 && getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err == 0;
    }
    close(fd);
  }
  freeaddrinfo(found);
  return answered;
}

}  // namespace

std::optional<caf::actor> join_cluster(caf::scoped_actor& self, const std::string& host, uint16_t port,
                                       const std::string& name, const std::string& cluster, const std::string& secret,
                                       double wait_s, std::string& err, bool& refused, std::string* cluster_seen) {
  refused = false;
  auto& sys = self->system();
  // The head may start after this peer: keep trying for wait_s.
  caf::actor gate;
  bool said_waiting = false;
  int ended_by_peer = 0;  // attempts in a row where the port took the connection, the handshake failed
  auto deadline =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(static_cast<int64_t>(std::max(0.0, wait_s) * 1000));
  while (!gate) {
    const bool tls = sys.has_openssl_manager();
    auto r = tls ? caf::openssl::remote_actor(sys, host, port) : sys.middleman().remote_actor(host, port);
    if (r) {
      gate = *r;
      break;
    }
    // Up, but ending the handshake: a TLS mismatch (a certificate it does not trust, TLS on one
    // side only) or not a kernelrl head at all. Waiting longer changes nothing: refused.
    ended_by_peer = port_answers(host, port, 1000) ? ended_by_peer + 1 : 0;
    if (ended_by_peer >= 3) {
      refused = true;
      err = "the head at " + host + ":" + std::to_string(port) +
            " took the connection but ended the handshake: " + sys.render(r.error()) +
            (tls ? " (this peer uses TLS: a head without [cluster] tls, or whose certificate is not signed by this "
                   "peer's tls_ca, or that does not trust this peer's certificate, ends the handshake; the head "
                   "logs nothing of it)"
                 : " (if the head uses [cluster] tls, so must this peer; else what listens there is not a kernelrl "
                   "head)");
      return std::nullopt;
    }
    if (!said_waiting && ended_by_peer == 0 &&
        std::chrono::steady_clock::now() < deadline) {  // once: what this process waits for
      said_waiting = true;
      std::fprintf(stderr, "launch: waiting for the head at %s:%u (up to %.0f s, [cluster] join_wait_s): %s\n",
                   host.c_str(), unsigned(port), wait_s, sys.render(r.error()).c_str());
      std::fflush(stderr);
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      err = "cannot reach the head at " + host + ":" + std::to_string(port) + ": " + sys.render(r.error()) +
            (tls ? " (this peer uses TLS: a head without [cluster] tls, or whose certificate is not signed by this "
                   "peer's tls_ca, or that does not trust this peer's certificate, ends the handshake)"
                 : " (if the head uses [cluster] tls, so must this peer)");
      return std::nullopt;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
  }
  std::string fail, nonce, cluster_name = cluster;
  if (cluster_name.empty()) {  // a monitor given only HOST:PORT learns the name from the head
    self->request(gate, std::chrono::seconds(30), hello_atom::value)
        .receive([&](std::vector<std::string>& hello) { cluster_name = hello.empty() ? "" : hello[0]; },
                 [&](caf::error& e) { fail = error_text(sys, e); });
  }
  const std::string ours = random_nonce();
  std::string theirs;
  if (fail.empty())
    self->request(gate, std::chrono::seconds(30), challenge_atom::value, ours)
        .receive(
            [&](std::vector<std::string>& r) {
              nonce = r.size() == 2 ? r[0] : "";
              theirs = r.size() == 2 ? r[1] : "";
            },
            [&](caf::error& e) { fail = error_text(sys, e); });
  if (fail.empty() && !proofs_equal(theirs, head_proof(secret, ours, nonce, cluster_name, protocol_version))) {
    err = "the process at " + host + ":" + std::to_string(port) +
          " could not prove the cluster secret: it is not this cluster's head (or its secret differs); "
          "nothing was sent to it";
    refused = true;
    return std::nullopt;
  }
  if (fail.empty()) {
    auto proof = join_proof(secret, nonce, name, cluster_name, protocol_version);
    self->request(gate, std::chrono::seconds(30), join_atom::value, name, cluster_name, protocol_version, proof)
        .receive([&](bool) {}, [&](caf::error& e) { fail = error_text(sys, e); });
  }
  if (!fail.empty()) {
    refused = true;
    err = "the head at " + host + ":" + std::to_string(port) + " did not accept \"" + name + "\": " + fail;
    return std::nullopt;
  }
  if (cluster_seen) *cluster_seen = cluster_name;
  return gate;
}

}  // namespace kernelrl
