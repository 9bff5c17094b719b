#include "gpu/worker_client.hpp"

#include "core/log.hpp"
#include "core/paths.hpp"

#include <zmq.hpp>

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <filesystem>
#include <mutex>
#include <set>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

extern char** environ;

namespace kernelrl {

namespace {

std::atomic<uint64_t> next_endpoint{0};

zmq::context_t& zmq_context() {
  static zmq::context_t ctx(1);
  return ctx;
}

// Looks up `key` in a msgpack map; nullptr when absent.
const msgpack::object* field(const msgpack::object& map, const char* key) {
  if (map.type != msgpack::type::MAP) return nullptr;
  for (uint32_t i = 0; i < map.via.map.size; ++i) {
    const auto& kv = map.via.map.ptr[i];
    if (kv.key.type == msgpack::type::STR && std::string_view(kv.key.via.str.ptr, kv.key.via.str.size) == key)
      return &kv.val;
  }
  return nullptr;
}

template <class T>
void read(const msgpack::object& map, const char* key, T& out) {
  if (auto* v = field(map, key); v && v->type != msgpack::type::NIL) v->convert(out);
}

// The msgpack form of a request that carries only its op: {"op": op}.
std::string op_message(const char* op) {
  msgpack::sbuffer buf;
  msgpack::packer<msgpack::sbuffer> pk(buf);
  pk.pack_map(1);
  pk.pack("op");
  pk.pack(op);
  return std::string(buf.data(), buf.size());
}

std::string describe_exit(int status) {
  if (WIFSIGNALED(status)) {
    int sig = WTERMSIG(status);
    return "killed by signal " + std::to_string(sig) + " (" + strsignal(sig) + ")";
  }
  if (WIFEXITED(status)) return "exited with code " + std::to_string(WEXITSTATUS(status));
  return "ended (status " + std::to_string(status) + ")";
}

}  // namespace

// Environment variables the worker keeps: names, or prefixes ending in '_'. Everything else
// (KERNELRL_CLUSTER_SECRET, API keys, tokens) stays with launch.
const char* const kWorkerEnvAllow[] = {"PATH",
                                       "HOME",
                                       "USER",
                                       "LOGNAME",
                                       "LANG",
                                       "LANGUAGE",
                                       "TZ",
                                       "TMPDIR",
                                       "XDG_CACHE_HOME",
                                       "LC_",
                                       "CUDA_",
                                       "NVIDIA_",
                                       "TORCH_CUDA_ARCH_LIST",
                                       "TORCH_EXTENSIONS_DIR",
                                       "PYTORCH_",
                                       "TRITON_",
                                       "LD_LIBRARY_PATH",
                                       "PYTHONPATH",
                                       "PYTHONHOME",
                                       "PYTHONHASHSEED",
                                       "VIRTUAL_ENV",
                                       "CC",
                                       "CXX",
                                       "NVCC_",
                                       "MAX_JOBS",
                                       "OMP_NUM_THREADS",
                                       "MKL_NUM_THREADS",
                                       "KERNELRL_PYTHON"};

static std::vector<std::string> worker_environment() {
  std::vector<std::string> out;
  for (char** e = environ; e && *e; ++e) {
    std::string kv = *e;
    auto eq = kv.find('=');
    if (eq == std::string::npos) continue;
    std::string name = kv.substr(0, eq);
    for (const char* a : kWorkerEnvAllow) {
      std::string allow = a;
      bool prefix = !allow.empty() && allow.back() == '_';
      if (prefix ? name.rfind(allow, 0) == 0 : name == allow) {
        out.push_back(kv);
        break;
      }
    }
  }
  return out;
}

struct WorkerClient::Impl {
  std::unique_ptr<zmq::socket_t> sock;
};

WorkerClient::WorkerClient(WorkerOptions opts) : opts_(std::move(opts)), impl_(new Impl) {
  // The worker's folder, under this process's temp folder (removed with it): its TMPDIR (locks,
  // candidates' folders) and, in a subfolder only this user can enter, its socket (candidates
  // run as another uid, in a mount namespace where the temp folder is their own).
  const std::string& parent = process_temp_dir();
  const std::filesystem::path base =
      parent.empty() ? std::filesystem::temp_directory_path() : std::filesystem::path(parent);
  std::string dir = (base / ("worker-" + std::to_string(next_endpoint++) + "-XXXXXX")).string();
  std::string sock_dir = dir;
  if (mkdtemp(dir.data()) != nullptr) {
    chmod(dir.c_str(), 0711);
    worker_dir_ = dir;
    sock_dir = (std::filesystem::path(dir) / "socket").string();
    mkdir(sock_dir.c_str(), 0700);
  } else {
    sock_dir = base.string();
  }
  endpoint_ = "ipc://" + (std::filesystem::path(sock_dir) / "worker.sock").string();
}

WorkerClient::~WorkerClient() { stop(); }

namespace {
// Every live worker of this process (its pid = its process group), for stop_all_workers.
std::mutex live_mu;
std::set<pid_t> live_workers;
}  // namespace

void stop_all_workers() {
  std::lock_guard lk(live_mu);
  for (pid_t p : live_workers) ::kill(-p, SIGKILL);  // reaped by their clients, which see them die
}

void WorkerClient::kill_worker() {
  if (pid_ > 0) {
    ::kill(-pid_, SIGKILL);  // the whole process group: compilers and helpers too
    ::kill(pid_, SIGKILL);
    int status = 0;
    waitpid(pid_, &status, 0);
    std::lock_guard lk(live_mu);
    live_workers.erase(pid_);
  }
  pid_ = -1;
  impl_->sock.reset();
}

void WorkerClient::stop() {
  if (pid_ > 0 && impl_->sock) {
    std::string reply;
    round_trip(op_message("exit"), mono_s() + 2.0, reply);
  }
  kill_worker();
  std::error_code ec;
  std::filesystem::remove(endpoint_.substr(6), ec);
  std::string err;
  if (!worker_dir_.empty()) remove_tree(worker_dir_, err);  // its locks and candidates' folders too
}

bool WorkerClient::ensure_started(std::string& err) {
  if (pid_ > 0) return true;
  auto lg = log::get("evaluator");
  std::vector<std::string> args = {opts_.python, opts_.script,
                                   "--endpoint", endpoint_,
                                   "--device",   opts_.device,
                                   "--threads",  std::to_string(opts_.threads),
                                   "--parent",   std::to_string(getpid())};
  if (!opts_.cache_dir.empty()) {
    args.push_back("--cache");
    args.push_back(opts_.cache_dir);
  }
  if (!opts_.isolate_network) args.push_back("--no-netns");
  if (!worker_dir_.empty() && !process_temp_dir().empty()) {
    args.push_back("--shared-dir");  // this process's workers share what they measure of a device
    args.push_back(process_temp_dir());
  }
  for (auto& h : opts_.hide) {
    if (h.empty()) continue;
    args.push_back("--hide");
    args.push_back(std::filesystem::absolute(h).string());
  }
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);

  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  std::string log_path = opts_.log_path.empty() ? "/dev/null" : opts_.log_path;
  posix_spawn_file_actions_addopen(&fa, 1, log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);
  posix_spawnattr_setpgroup(&attr, 0);
  pid_t pid = -1;
  // The worker gets an allow-listed environment: no cluster key, no API keys reach it or the
  // candidates it forks (a forked process can read the environment it was started with).
  std::vector<std::string> env_store = worker_environment();
  if (!worker_dir_.empty()) {  // its temporary files go to its own folder
    std::erase_if(env_store, [](const std::string& kv) { return kv.rfind("TMPDIR=", 0) == 0; });
    env_store.push_back("TMPDIR=" + worker_dir_);
  }
  std::vector<char*> envp;
  for (auto& e : env_store) envp.push_back(e.data());
  envp.push_back(nullptr);
  int rc = posix_spawn(&pid, opts_.python.c_str(), &fa, &attr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  if (rc != 0) {
    err = "cannot start worker " + opts_.python + " " + opts_.script + ": " + strerror(rc);
    return false;
  }
  pid_ = pid;
  ++starts_;
  {
    std::lock_guard lk(live_mu);
    live_workers.insert(pid_);
  }
  // Bound once the worker's pid is known: the socket accepts a connection from that process
  // only (the kernel's peer credentials, checked by ZeroMQ at accept), whoever else reaches its
  // folder. The worker retries its connection until the endpoint exists.
  impl_->sock = std::make_unique<zmq::socket_t>(zmq_context(), zmq::socket_type::req);
  impl_->sock->set(zmq::sockopt::linger, 0);
  try {
    int peer = static_cast<int>(pid_);
    if (zmq_setsockopt(impl_->sock->handle(), ZMQ_IPC_FILTER_PID, &peer, sizeof peer) != 0) throw zmq::error_t();
    impl_->sock->bind(endpoint_);
  } catch (const zmq::error_t& e) {
    err = "cannot bind worker endpoint " + endpoint_ + ": " + e.what();
    kill_worker();
    return false;
  }

  std::string reply;
  std::string why = round_trip(op_message("ping"), mono_s() + opts_.startup_timeout_s, reply);
  if (!why.empty()) {
    err = "worker " + opts_.script + " on " + opts_.device + " did not start: " + why +
          (opts_.log_path.empty() ? "" : " (see " + opts_.log_path + ")");
    kill_worker();
    return false;
  }
  try {
    auto h = msgpack::unpack(reply.data(), reply.size());
    read(h.get(), "torch_version", torch_version_);
    read(h.get(), "device", device_name_);
    read(h.get(), "capability", capability_);
    read(h.get(), "network", network_);
    read(h.get(), "sandbox", sandbox_);
  } catch (const std::exception& e) {
    err = std::string("worker sent an unreadable hello: ") + e.what();
    kill_worker();
    return false;
  }
  lg->debug("worker pid {} on {} ready (torch {}, {})", pid_, opts_.device, torch_version_, device_name_);
  return true;
}

std::string WorkerClient::round_trip(const std::string& payload, double deadline, std::string& reply) {
  auto& sock = *impl_->sock;
  // Waits until `events` is ready on the socket, the worker dies, or the deadline passes.
  // (A REQ socket cannot send before its peer connects: a worker that dies during start-up
  // must not leave us blocked in send.)
  auto wait_for = [&](short events) -> std::string {
    zmq::pollitem_t items[] = {{static_cast<void*>(sock), 0, events, 0}};
    while (true) {
      double left = deadline - mono_s();
      if (left <= 0) return "timeout";
      long slice_ms = std::min<long>(100, static_cast<long>(left * 1000) + 1);
      zmq::poll(items, 1, std::chrono::milliseconds(slice_ms));
      if (items[0].revents & events) return "";
      int status = 0;
      if (pid_ > 0 && waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return "died: worker process " + describe_exit(status);
      }
    }
  };
  try {
    if (auto why = wait_for(ZMQ_POLLOUT); !why.empty()) return why;
    sock.send(zmq::buffer(payload), zmq::send_flags::dontwait);
    if (auto why = wait_for(ZMQ_POLLIN); !why.empty()) return why;
    zmq::message_t msg;
    (void)sock.recv(msg, zmq::recv_flags::dontwait);
    reply.assign(static_cast<const char*>(msg.data()), msg.size());
    return "";
  } catch (const zmq::error_t& e) {
    return std::string("io: ") + e.what();
  }
}

bool declares_build(const std::string& action) {
  for (const char* s : {"load_inline", "cpp_extension", "triton"})
    if (action.find(s) != std::string::npos) return true;
  return false;
}

EvalResult WorkerClient::evaluate(const EvalRequest& req, const EvaluatorConfig& s, const StageOptions& stage) {
  bool retry = false;
  EvalResult first = call("eval", req, s, stage, false, &retry);
  if (!retry) return first;
  // It ran out of device memory while another worker evaluated on the same GPU: the shortage may
  // have been theirs, so the verdict is that of a second run with the memory to itself.
  EvalResult again = call("eval", req, s, stage, true);
  std::string why =
      "evaluated again with the device's memory to itself: the first run, beside another evaluator's, "
      "ended " +
      to_string(first.status) + " (" + first.error.substr(0, 200) + ")";
  again.note = again.note.empty() ? why : again.note + "; " + why;
  again.wall_s += first.wall_s;
  return again;
}

EvalResult WorkerClient::compile(const EvalRequest& req, const EvaluatorConfig& s, const StageOptions& stage) {
  return call("compile", req, s, stage);
}

EvalResult WorkerClient::call(const char* op, const EvalRequest& req, const EvaluatorConfig& s,
                              const StageOptions& stage, bool alone, bool* retry_alone) {
  EvalResult res;
  res.sample_id = req.sample_id;
  res.task_id = req.task_id;
  res.device = opts_.device;
  double t0 = mono_s();
  std::string err;
  if (!ensure_started(err)) {
    res.status = EvalStatus::runtime_error;
    res.error = err;
    res.wall_s = mono_s() - t0;
    return res;
  }
  bool compile_op = std::string_view(op) == "compile";
  std::string size = s.task_size;
  if (size == "auto") size = opts_.device.rfind("cuda", 0) == 0 ? "gpu" : "cpu";
  // The worker enforces these limits on the candidate's process; we add a grace period.
  double limit = compile_op
                     ? s.compile_timeout_s
                     : s.timeout_s + (declares_build(req.action) && !stage.precompiled ? s.compile_timeout_s : 0.0);
  constexpr double grace_s = 30;
  // An evaluation may first wait, at most its own limit, for the device's memory (gpu/worker.py).
  const double memory_wait_s = compile_op ? 0.0 : s.timeout_s;

  msgpack::sbuffer buf;
  msgpack::packer<msgpack::sbuffer> pk(buf);
  pk.pack_map(3);
  pk.pack("op");
  pk.pack(op);
  pk.pack("request");
  pk.pack(req);
  pk.pack("settings");
  pk.pack_map(25);
  pk.pack("correctness_trials");
  pk.pack(s.correctness_trials);
  pk.pack("warmup");
  pk.pack(s.warmup);
  pk.pack("fast_trials");
  pk.pack(s.fast_trials);
  pk.pack("full_trials");
  pk.pack(s.full_trials);
  pk.pack("timing_precision");
  pk.pack(s.timing_precision);
  pk.pack("atol_fp32");
  pk.pack(s.atol_fp32);
  pk.pack("rtol_fp32");
  pk.pack(s.rtol_fp32);
  pk.pack("atol_half");
  pk.pack(s.atol_half);
  pk.pack("rtol_half");
  pk.pack(s.rtol_half);
  pk.pack("timeout_s");
  pk.pack(s.timeout_s);
  pk.pack("compile_timeout_s");
  pk.pack(s.compile_timeout_s);
  pk.pack("memory_limit_mb");
  pk.pack(s.memory_limit_mb);
  pk.pack("reverify_speedup");
  pk.pack(s.reverify_speedup);
  pk.pack("review_speedup");
  pk.pack(s.review_speedup);
  pk.pack("input_distributions");
  pk.pack(s.input_distributions);
  pk.pack("scale_tol_fp32");
  pk.pack(s.scale_tol_fp32);
  pk.pack("scale_tol_half");
  pk.pack(s.scale_tol_half);
  pk.pack("bandwidth_bound");
  pk.pack(s.bandwidth_bound);
  pk.pack("bound_min_output_mb");
  pk.pack(s.bound_min_output_mb);
  pk.pack("reference_cache_mb");
  pk.pack(s.reference_cache_mb);
  pk.pack("size");
  pk.pack(size);
  pk.pack("precompiled");
  pk.pack(stage.precompiled);
  pk.pack("cuda_arch");
  pk.pack(stage.cuda_arch);
  pk.pack("mode");
  pk.pack(req.mode);
  pk.pack("alone");
  pk.pack(alone);

  std::string reply;
  std::string why = round_trip(std::string(buf.data(), buf.size()), t0 + limit + memory_wait_s + grace_s, reply);
  res.wall_s = mono_s() - t0;
  if (why == "timeout") {
    kill_worker();
    res.status = compile_op ? EvalStatus::compile_error : EvalStatus::timeout;
    char msg[128];
    std::snprintf(msg, sizeof msg, "%s exceeded the %.1f s limit and its grace period; worker killed",
                  compile_op ? "build" : "evaluation", limit);
    res.error = msg;
    return res;
  }
  if (!why.empty()) {
    kill_worker();
    res.status = EvalStatus::runtime_error;
    res.error = why.rfind("died: ", 0) == 0 ? why.substr(6) + " while running the candidate"
                                            : "worker connection failed: " + why;
    return res;
  }
  try {
    auto h = msgpack::unpack(reply.data(), reply.size());
    const auto& m = h.get();
    std::string status = "runtime_error";
    read(m, "status", status);
    if (!from_string(status, res.status)) {
      res.status = EvalStatus::runtime_error;
      res.error = "worker reported an unknown status \"" + status + "\"";
      return res;
    }
    read(m, "error", res.error);
    read(m, "assembled_code", res.assembled_code);
    read(m, "compile_log", res.compile_log);
    read(m, "output", res.output);
    read(m, "correctness", res.correctness);
    read(m, "runtime", res.runtime);
    read(m, "ref_runtime", res.ref_runtime);
    read(m, "speedup", res.speedup);
    read(m, "device", res.device);
    read(m, "kernel_coverage", res.kernel_coverage);
    read(m, "compile_s", res.compile_s);
    read(m, "compile_cached", res.compile_cached);
    read(m, "reverified", res.reverified);
    read(m, "gpu_peak_bytes", res.device_peak_bytes);
    read(m, "review", res.review);
    read(m, "note", res.note);
    read(m, "output_bytes", res.output_bytes);
    read(m, "bound_ms", res.bound_ms);
    if (retry_alone) read(m, "retry_alone", *retry_alone);
    if (auto* iso = field(m, "isolation")) read(*iso, "child_start_s", res.isolation_s);
  } catch (const std::exception& e) {
    res = EvalResult{};
    res.sample_id = req.sample_id;
    res.task_id = req.task_id;
    res.status = EvalStatus::runtime_error;
    res.error = std::string("worker sent an unreadable reply: ") + e.what();
    kill_worker();
  }
  res.wall_s = mono_s() - t0;
  return res;
}

}  // namespace kernelrl
