// `launch CONFIG --node NAME`: one node of a cluster. It proves the cluster secret to the head's
// gate, runs its evaluators for the head's dispatcher and its samplers for the head's supervisor
// and learner, and stops when the head is gone.
#include "launch/cluster.hpp"
#include "launch/commands.hpp"
#include "launch/learning.hpp"
#include "launch/samplers.hpp"
#include "launch/setup.hpp"

#include "actors/gate.hpp"
#include "actors/monitor.hpp"
#include "actors/sampler.hpp"
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

namespace {

std::string sanitize_id(std::string s) {
  for (auto& c : s)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_' && c != '.') c = '_';
  return s;
}

}  // namespace

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

caf::expected<uint16_t> publish_gate(const caf::actor& gate, uint16_t port, const std::string& host) {
  if (gate.home_system().has_openssl_manager()) return caf::openssl::publish(gate, port, host.c_str(), true);
  return gate.home_system().middleman().publish(gate, port, host.c_str(), true);
}

void unpublish_gate(const caf::actor& gate) {
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

namespace {

// Whether a node renders the tasks' prompts: a sampler, or the learner of self-distillation (its
// teacher's prompts).
bool renders_prompts(const Config& cfg, const NodeConfig& node) {
  return has_role(node, "sampler") || (has_role(node, "learner") && cfg.experiment.mode == Mode::sdpo);
}

// What a node prepares before it joins: its log folder (and what of it this process made), and
// for a sampler or a self-distilling learner the tasks' prompts as the head renders them, and
// the sampler's models (a model that does not load is a clear error here, not a dead sampler
// later).
struct NodePreparation {
  std::string log_dir;
  std::vector<fs::path> made;  // created here: removed again (when still empty) if the head never takes it
  std::vector<RenderedPrompt> rendered;
  SamplerArgs sampling;
  std::vector<std::shared_ptr<SamplerBackend>> backends;
};

bool prepare_node(const Config& cfg, const NodeConfig& node, NodePreparation& out, std::string& err) {
  out.log_dir = (fs::path(cfg.experiment.run_root) / ("node-" + sanitize_id(node.name))).string();
  std::error_code probe;
  for (auto p : {fs::path(cfg.experiment.run_root), fs::path(out.log_dir)})
    if (!fs::exists(p, probe)) out.made.push_back(p);
  fs::create_directories(out.log_dir);
  if (renders_prompts(cfg, node)) {
    TaskSet tasks, eval_tasks;
    if (!load_experiment_tasks(cfg, tasks, eval_tasks, err) ||
        !render_task_prompts(cfg, tasks, eval_tasks, out.rendered, err))
      return false;
  }
  if (has_role(node, "sampler")) {
    out.sampling = sampler_settings(cfg);
    for (auto& p : out.rendered) out.sampling.prompts.push_back({p.task_id, p.prompt, p.prompt_tokens, p.user});
    try {
      out.backends = make_backends(cfg, out.log_dir, node, false);
    } catch (const std::exception& e) {
      err = e.what();
      return false;
    }
  }
  return true;
}

// The learner role on a joined node: the head names the run directory (its checkpoints go there,
// on this machine) and whether the run resumes; the model loads, then the learner registers.
// Returns 0, or the process's exit code.
int start_learner(caf::scoped_actor& self, const caf::actor& gate, const Config& cfg, const NodeConfig& node,
                  const std::string& how, const std::vector<RenderedPrompt>& rendered, LearningActors& learning) {
  auto lg = log::get("node");
  auto& sys = self->home_system();
  std::string run_dir, fail;
  bool resume = false;
  self->request(gate, std::chrono::seconds(30), learner_atom::value)
      .receive(
          [&](std::string& dir, bool r) {
            run_dir = std::move(dir);
            resume = r;
          },
          [&](caf::error& e) { fail = error_text(sys, e); });
  if (!fail.empty()) {
    std::fprintf(stderr, "launch: %s: the head did not take this node's learner: %s\n", how.c_str(), fail.c_str());
    return 2;
  }
  std::map<std::string, std::string> users;
  for (auto& p : rendered) users[p.task_id] = p.user;
  try {
    fs::create_directories(fs::path(run_dir) / "checkpoints");
    learning = spawn_learning(sys, cfg, users, run_dir, make_engine(cfg, run_dir, resume));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "launch: %s: %s\n", how.c_str(), e.what());
    return 2;
  }
  bool registered = false;
  self->request(gate, std::chrono::seconds(30), register_atom::value, learner_atom::value, learning.learner,
                caf::actor_cast<caf::actor>(learning.selector))  // typed handles cross nodes untyped
      .receive([&](bool) { registered = true; },
               [&](caf::error& e) {
                 lg->error("node {}: the head did not take its learner: {}", node.name, error_text(sys, e));
               });
  if (!registered) {
    self->send_exit(learning.learner, caf::exit_reason::user_shutdown);
    self->send_exit(learning.selector, caf::exit_reason::user_shutdown);
    return 1;
  }
  lg->info("node {}: the learner runs here; checkpoints in {}/checkpoints", node.name, run_dir);
  return 0;
}

// The monitor role on a joined node: the head names the run directory (metrics.jsonl goes there,
// on this machine) and the supervisor that stores the snapshots; the gate hands it every source.
// Returns 0, or the process's exit code.
int start_monitor(caf::scoped_actor& self, const caf::actor& gate, const Config& cfg, const NodeConfig& node,
                  const std::string& how, caf::actor& monitor) {
  auto lg = log::get("node");
  auto& sys = self->home_system();
  std::string run_dir, fail;
  caf::actor recorder;
  self->request(gate, std::chrono::seconds(30), monitor_atom::value)
      .receive(
          [&](std::string& dir, caf::actor& r) {
            run_dir = std::move(dir);
            recorder = std::move(r);
          },
          [&](caf::error& e) { fail = error_text(sys, e); });
  if (!fail.empty()) {
    std::fprintf(stderr, "launch: %s: the head did not take this node's monitor: %s\n", how.c_str(), fail.c_str());
    return 2;
  }
  std::error_code ec;
  fs::create_directories(run_dir, ec);
  auto ma = monitor_settings(cfg, run_dir);
  if (!ma) return 2;
  monitor = spawn_monitor(sys, std::move(*ma), {}, recorder);
  bool registered = false;
  self->request(gate, std::chrono::seconds(30), register_atom::value, monitor_atom::value, monitor)
      .receive([&](bool) { registered = true; },
               [&](caf::error& e) {
                 lg->error("node {}: the head did not take its monitor: {}", node.name, error_text(sys, e));
               });
  if (!registered) {
    self->send_exit(monitor, caf::exit_reason::user_shutdown);
    return 1;
  }
  lg->info("node {}: the monitor runs here; metrics in {}/{}", node.name, run_dir, cfg.monitor.metrics_file);
  return 0;
}

// The node's samplers, each registered with the head (one it does not take is stopped): appended
// to `actors`.
void start_samplers(caf::scoped_actor& self, const caf::actor& gate, const NodeConfig& node,
                    const NodePreparation& prep, std::vector<caf::actor>& actors) {
  auto lg = log::get("node");
  auto& sys = self->home_system();
  const std::string digest = prompts_digest(prep.rendered);
  for (size_t i = 0; i < prep.backends.size(); ++i) {
    SamplerArgs one = prep.sampling;
    one.backend = prep.backends[i];
    one.id = sampler_name(node, false, i);
    const std::string id = one.id;
    auto s = spawn_sampler(sys, std::move(one), gate);  // its rollouts go through the gate
    bool registered = false;
    self->request(gate, std::chrono::seconds(30), register_atom::value, sampler_atom::value, s, id, digest)
        .receive([&](bool) { registered = true; },
                 [&](caf::error& e) {
                   lg->error("node {}: the head did not take sampler {}: {}", node.name, id, error_text(sys, e));
                 });
    if (!registered) {
      self->send_exit(s, caf::exit_reason::user_shutdown);
      continue;
    }
    actors.push_back(s);
  }
}

// Runs until the head is gone (the run ended, or the link went silent past peer_timeout_s) or
// every one of `actors` stopped (1); stops them.
int run_until_the_head_is_gone(caf::scoped_actor& self, const caf::actor& gate, const std::string& name,
                               const std::vector<caf::actor>& actors) {
  auto lg = log::get("node");
  auto& sys = self->home_system();
  self->monitor(gate);
  for (auto& a : actors) self->monitor(a);
  size_t alive = actors.size();
  int rc = 0;
  bool head_gone = false;
  while (!head_gone && alive > 0) {
    self->receive([&](caf::down_msg& dm) {
      if (dm.source == gate.address()) {
        head_gone = true;
        // In words: CAF's exit reasons are not for people.
        const std::string why =
            !dm.reason || dm.reason == caf::exit_reason::user_shutdown || dm.reason == caf::exit_reason::normal
                ? "the run ended"
            : dm.reason == caf::exit_reason::remote_link_unreachable ? "the connection to it was lost"
                                                                     : sys.render(dm.reason);
        lg->info("node {}: the head is gone ({}); stopping", name, why);
      } else {
        --alive;
      }
    });
  }
  if (alive == 0 && !head_gone) {
    lg->error("node {}: every evaluator, sampler, learner and monitor stopped (see the errors above)", name);
    rc = 1;
  }
  for (auto& a : actors) self->send_exit(a, caf::exit_reason::user_shutdown);
  return rc;
}

// Runs `node`'s roles for the head until the head is gone.
int serve_node(const Config& cfg, const NodeConfig& node, const std::string& how) {
  auto lg = log::get("node");
  const std::string& name = node.name;
  std::string err;
  auto secret = read_cluster_secret(cfg.cluster, err);
  NodePreparation prep;
  if (!secret || !prepare_node(cfg, node, prep, err)) {
    std::fprintf(stderr, "launch: %s: %s\n", how.c_str(), err.c_str());
    return 2;
  }
  std::string host;
  uint16_t port = 0;
  head_address(cfg, host, port);

  caf::actor_system_config sys_cfg;
  add_message_types(sys_cfg);
  configure_middleman(sys_cfg, cfg.cluster);
  sys_cfg.set("logger.verbosity", caf::atom("quiet"));
  auto sysp = std::make_unique<caf::actor_system>(sys_cfg);
  auto& sys = *sysp;
  const int code = [&]() -> int {
    bool refused = false;
    // The join is made by an actor that lives as long as this node: the head watches it, and
    // its connection dropping ends this node's membership.
    caf::scoped_actor self{sys};
    auto joined = join_cluster(self, host, port, name, cfg.cluster.name, *secret,
                               std::max(1.0, cfg.cluster.join_wait_s), err, refused, nullptr);
    if (!joined) {
      std::fprintf(stderr, "launch: %s: %s\n", how.c_str(), err.c_str());
      std::error_code ignored;
      for (auto it = prep.made.rbegin(); it != prep.made.rend(); ++it) fs::remove(*it, ignored);  // (only if empty)
      return refused ? 2 : 1;
    }
    caf::actor gate = *joined;
    std::printf("node %s joined cluster %s at %s:%u\n", name.c_str(), cfg.cluster.name.c_str(), host.c_str(),
                unsigned(port));
    std::fflush(stdout);

    LearningActors learning;
    if (has_role(node, "learner") && traits(cfg.experiment.mode).learns)
      if (int rc = start_learner(self, gate, cfg, node, how, prep.rendered, learning)) return rc;
    caf::actor monitor;
    if (has_role(node, "monitor"))
      if (int rc = start_monitor(self, gate, cfg, node, how, monitor)) return rc;
    std::vector<caf::actor> actors;  // evaluators, then samplers, then the learner and its selector
    for (auto& ea : node_evaluators(cfg, node, prep.log_dir)) actors.push_back(spawn_evaluator(sys, ea, gate));
    const size_t evaluators = actors.size();
    start_samplers(self, gate, node, prep, actors);
    lg->info("node {}: {} evaluator(s) and {} sampler(s) started; logs in {}", name, evaluators,
             actors.size() - evaluators, prep.log_dir);
    if (learning.learner) {
      actors.push_back(learning.learner);
      actors.push_back(caf::actor_cast<caf::actor>(learning.selector));
    }
    if (monitor) actors.push_back(monitor);
    return run_until_the_head_is_gone(self, gate, name, actors);
  }();
  stop_actor_system(std::move(sysp), std::chrono::seconds(10), code);
  return code;
}

}  // namespace

int run_node(const Config& cfg, const std::string& name) {
  const NodeConfig* node = nullptr;
  std::string names;
  for (auto& n : cfg.nodes) {
    names += (names.empty() ? "" : ", ") + n.name;
    if (n.name == name) node = &n;
  }
  if (!node) {
    std::fprintf(stderr,
                 "launch: --node %s: %s has no such [[node]] (it has %s); a machine not in the "
                 "file joins with --join\n",
                 name.c_str(), cfg.source_file.c_str(), names.c_str());
    return 2;
  }
  if (&head_node(cfg) == node) {
    std::fprintf(stderr,
                 "launch: --node %s: that is the head (it has the supervisor role); start it with `launch %s`\n",
                 name.c_str(), cfg.source_file.c_str());
    return 2;
  }
  for (auto& r : node->roles) {
    if (r != "evaluator" && r != "sampler" && r != "learner" && r != "monitor") {
      std::fprintf(stderr,
                   "launch: --node %s: role \"%s\" runs on the head only; "
                   "a node of its own runs evaluators, samplers, the learner and the monitor\n",
                   name.c_str(), r.c_str());
      return 2;
    }
  }
  if (!check_listed_gpus(cfg, *node)) return 2;
  return serve_node(cfg, *node, "--node " + name);
}

int run_join(const Config& cfg, const JoinOptions& o) {
  NodeConfig node;
  node.name = o.name;
  if (node.name.empty()) {
    char buf[256] = {0};
    gethostname(buf, sizeof buf - 1);
    node.name = buf[0] ? buf : "joined";
  }
  for (auto& n : cfg.nodes) {
    if (n.name == node.name) {
      std::fprintf(stderr,
                   "launch: --join: %s already has a [[node]] named \"%s\"; start it with --node %s, "
                   "or give this machine another name with --name\n",
                   cfg.source_file.c_str(), node.name.c_str(), node.name.c_str());
      return 2;
    }
  }
  node.roles = {"evaluator"};
  node.cpu_slots = o.cpu_slots;
  node.gpus = o.gpus;
  if (node.cpu_slots == 0 && node.gpus.empty()) {
    std::fprintf(stderr, "launch: --join: say what this machine evaluates on: --gpus 0,1 or --cpu-slots N\n");
    return 2;
  }
  if (!check_listed_gpus(cfg, node)) return 2;
  return serve_node(cfg, node, "--join (as " + node.name + ")");
}

int cmd_node(const std::string& config_path, const std::string& node, const std::string& log_level) {
  // The chat template is resolved (and said) only where this node renders prompts.
  auto cfg = load_with_level(config_path, log_level, false);
  if (!cfg) return 2;
  for (auto& n : cfg->nodes)
    if (n.name == node && renders_prompts(*cfg, n)) resolve_chat_template(*cfg);
  return run_node(*cfg, node);
}

int cmd_join(const std::string& config_path, const JoinOptions& o, const std::string& log_level) {
  auto cfg = load_with_level(config_path, log_level, false);  // an evaluator only: no prompts
  if (!cfg) return 2;
  if (!is_cluster(*cfg)) {
    std::fprintf(stderr, "launch: --join: %s describes no cluster (no [[node]] has a port)\n",
                 cfg->source_file.c_str());
    return 2;
  }
  return run_join(*cfg, o);
}

}  // namespace kernelrl
