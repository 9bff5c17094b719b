// `launch monitor HOST:PORT`: attaches to a running cluster's head, proves the cluster secret,
// and shows its live telemetry (or one snapshot with --once). It only asks the head's gate for
// the monitor's latest snapshot: attaching and detaching never touch the run's actors.
#include "wiring/cluster.hpp"
#include "launch/cli.hpp"
#include "launch/commands.hpp"

#include "actors/monitor.hpp"
#include "core/auth.hpp"
#include "core/config.hpp"
#include "core/curve.hpp"
#include "core/files.hpp"
#include "core/log.hpp"
#include "core/tls.hpp"
#include "messages/messages.hpp"

#include <caf/all.hpp>
#include <caf/io/all.hpp>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <unistd.h>

namespace kernelrl {

int cmd_monitor(const MonitorOptions& o) {
  std::string host;
  uint16_t port = 0;
  if (!parse_host_port(o.address, host, port) || port == 0) {
    std::fprintf(stderr, "launch monitor: expected HOST:PORT (the head's), got \"%s\"\n", o.address.c_str());
    return 2;
  }
  ClusterConfig cc;
  cc.secret_file = o.secret_file;
  std::string err;
  auto secret = read_cluster_secret(cc, err);
  if (!secret) {
    std::fprintf(stderr, "launch monitor: %s\n", err.c_str());
    return 2;
  }
  log::set_level(o.log_level.empty() ? "warn" : o.log_level);
  const int given = !o.tls_cert.empty() + !o.tls_key.empty() + !o.tls_ca.empty();
  if (given != 0 && given != 3) {
    std::fprintf(stderr, "launch monitor: a head with TLS needs all three of --tls-cert, --tls-key and --tls-ca\n");
    return 2;
  }
  if (given == 3) {
    cc.tls = true;
    cc.tls_cert = o.tls_cert;
    cc.tls_key = o.tls_key;
    cc.tls_ca = o.tls_ca;
    std::string why = tls_problem(TlsFiles{cc.tls_cert, cc.tls_key, cc.tls_ca});
    if (!why.empty()) {
      std::fprintf(stderr, "launch monitor: --%s\n", why.replace(why.find('_'), 1, "-").c_str());
      return 2;
    }
  }

  caf::actor_system_config sys_cfg;
  add_message_types(sys_cfg);
  cc.peer_timeout_s = 10;
  configure_middleman(sys_cfg, cc);
  sys_cfg.set("logger.verbosity", caf::atom("quiet"));
  caf::actor_system sys{sys_cfg};
  caf::scoped_actor self{sys};
  char hn[256] = {0};
  gethostname(hn, sizeof hn - 1);
  std::string name = "monitor@" + std::string(hn) + ":" + std::to_string(getpid());
  bool refused = false;
  std::string cluster;
  auto gate = join_cluster(self, host, port, name, "", *secret, o.wait_s, err, refused, &cluster);
  if (!gate) {
    std::fprintf(stderr, "launch monitor: %s\n", err.c_str());
    return refused ? 2 : 1;
  }
  self->monitor(*gate);
  auto interval = std::chrono::milliseconds(static_cast<int64_t>(o.interval_s * 1000));
  int rc = 0;
  for (bool first = true;; first = false) {
    std::optional<Telemetry> snap;
    std::string fail;
    self->request(*gate, std::chrono::seconds(10), stats_atom::value)
        .receive([&](Telemetry& t) { snap = std::move(t); }, [&](caf::error& e) { fail = error_text(sys, e); });
    if (!snap) {
      if (first) {
        std::fprintf(stderr, "launch monitor: the head at %s did not answer: %s\n", o.address.c_str(), fail.c_str());
        return 1;
      }
      std::printf("the head at %s is gone (%s)\n", o.address.c_str(), fail.c_str());
      break;
    }
    std::vector<std::pair<std::string, double>> vals(snap->values.begin(), snap->values.end());
    if (o.json) {
      nlohmann::json j = {
          {"ts", snap->ts}, {"cluster", cluster}, {"head", o.address}, {"step", snap->step}, {"values", snap->values}};
      std::printf("%s\n", j.dump().c_str());
    } else {
      std::printf("%s%s", first ? "" : "\n", format_snapshot(cluster, vals).c_str());
    }
    std::fflush(stdout);
    if (o.once) break;
    bool gone = false;
    self->receive([&](caf::down_msg&) { gone = true; }, caf::after(interval) >> [] {});
    if (gone) {
      std::printf("the head at %s is gone (the run ended)\n", o.address.c_str());
      break;
    }
  }
  self->demonitor(*gate);
  return rc;
}

// `launch keygen PREFIX`: a CURVE key pair for the telemetry socket or one of its readers.
int cmd_keygen(const std::string& prefix) {
  if (!curve_available()) {
    std::fprintf(stderr, "launch keygen: this libzmq was built without CURVE\n");
    return 1;
  }
  const std::string sec_path = prefix + ".key", pub_path = prefix + ".pub";
  for (auto& p : {sec_path, pub_path}) {
    std::error_code ec;
    if (std::filesystem::exists(p, ec)) {
      std::fprintf(stderr, "launch keygen: %s exists; not overwriting a key\n", p.c_str());
      return 2;
    }
  }
  auto [pub, sec] = curve_keypair();
  const std::string note = "# ZeroMQ CURVE key (Z85), made by launch keygen\n";
  std::string err;
  if (!write_file_durably(sec_path, note + sec + "\n", err, 0600) ||
      !write_file_durably(pub_path, note + pub + "\n", err, 0644)) {
    std::fprintf(stderr, "launch keygen: %s\n", err.c_str());
    return 1;
  }
  std::printf("secret key %s (mode 600: keep it on its machine)\npublic key %s: %s\n", sec_path.c_str(),
              pub_path.c_str(), pub.c_str());
  return 0;
}

void add_monitor(CLI::App& app, cli::Action& action) {
  auto prefix = std::make_shared<std::string>();
  auto* keygen = cli::subcommand(app, "keygen",
                                 "launch keygen PREFIX\n  write a CURVE key pair, PREFIX.key (secret) and PREFIX.pub, "
                                 "for [monitor] publish_key or a telemetry reader");
  keygen->add_option("PREFIX", *prefix, "where the two files go (PREFIX.key, PREFIX.pub)")->required()->type_name("");
  keygen->callback([&action, prefix] { action = [prefix] { return cmd_keygen(*prefix); }; });

  auto o = std::make_shared<MonitorOptions>();
  auto* sub = cli::subcommand(app, "monitor",
                              "launch monitor HOST:PORT [--once] [--json] [--interval S] [--secret-file FILE] "
                              "[--wait S] [--tls-cert FILE --tls-key FILE --tls-ca FILE]\n  watch a running cluster's "
                              "telemetry (its head's HOST:PORT)");
  sub->add_option("HOST:PORT", o->address, "the head's address")->required()->type_name("");
  sub->add_flag("--once", o->once, "one snapshot, then exit");
  sub->add_flag("--json", o->json, "JSON lines instead of text");
  sub->add_option("--interval", o->interval_s, "refresh interval in seconds (default 1)")
      ->check(CLI::Range(0.05, 86400.0));
  sub->add_option("--wait", o->wait_s, "how long to keep trying to reach the head (default 10 s)")
      ->check(CLI::Range(0.0, 86400.0));
  sub->add_option("--secret-file", o->secret_file, "the cluster secret (default: $KERNELRL_CLUSTER_SECRET)")
      ->type_name("FILE");
  sub->add_option("--tls-cert", o->tls_cert, "a head with [cluster] tls: this monitor's certificate (PEM)")
      ->type_name("FILE")
      ->check(CLI::ExistingFile);
  sub->add_option("--tls-key", o->tls_key, "its private key (PEM, mode 600)")
      ->type_name("FILE")
      ->check(CLI::ExistingFile);
  sub->add_option("--tls-ca", o->tls_ca, "the cluster's CA certificate")->type_name("FILE")->check(CLI::ExistingFile);
  sub->add_option("--log-level", o->log_level, "default warn")->type_name("LEVEL");
  sub->callback([&action, o] { action = [o] { return cmd_monitor(*o); }; });
}

}  // namespace kernelrl
