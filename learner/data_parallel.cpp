#include "learner/data_parallel.hpp"

#ifdef KERNELRL_HAVE_GLOO
#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#endif
#ifdef KERNELRL_HAVE_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif
#if defined(KERNELRL_HAVE_GLOO) || defined(KERNELRL_HAVE_NCCL)
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#endif

#include <cstdlib>
#include <exception>
#include <set>
#include <stdexcept>
#include <thread>

namespace kernelrl {

#if defined(KERNELRL_HAVE_GLOO) || defined(KERNELRL_HAVE_NCCL)
namespace {

// One rank of a c10d process group (gloo or NCCL).
class BackendReducer : public GradientReducer {
 public:
  BackendReducer(c10::intrusive_ptr<c10d::Backend> pg, int rank, int size)
      : pg_(std::move(pg)), rank_(rank), size_(size) {}
  ~BackendReducer() override {
    try {
      pg_->shutdown();  // NCCL: its communicators and watchdog go with the group
    } catch (...) {}
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void sum(torch::Tensor& flat) override {
    std::vector<at::Tensor> t{flat};
    pg_->allreduce(t)->wait();
  }

 private:
  c10::intrusive_ptr<c10d::Backend> pg_;
  int rank_, size_;
};

}  // namespace
#endif

#ifdef KERNELRL_HAVE_GLOO
bool gloo_available() { return true; }

std::unique_ptr<GradientReducer> gloo_reducer(const std::string& store, int rank, int size, const std::string& host,
                                              std::chrono::milliseconds timeout) {
  if (size < 1 || rank < 0 || rank >= size)
    throw std::invalid_argument("data-parallel learner: rank " + std::to_string(rank) + " of " + std::to_string(size) +
                                " (expected 0 <= rank < size)");
  c10::intrusive_ptr<c10d::Store> st;
  if (store.rfind("file:", 0) == 0 && store.size() > 5) {
    st = c10::make_intrusive<c10d::FileStore>(store.substr(5), size);
  } else if (store.rfind("tcp://", 0) == 0) {
    const std::string hp = store.substr(6);
    const auto colon = hp.rfind(':');
    char* end = nullptr;
    const long port = colon == std::string::npos || colon == 0 ? -1 : std::strtol(hp.c_str() + colon + 1, &end, 10);
    if (end == nullptr || *end != '\0' || port <= 0 || port > 65535)
      throw std::invalid_argument("data-parallel store \"" + store + "\": expected tcp://HOST:PORT");
    c10d::TCPStoreOptions o;
    o.port = uint16_t(port);
    o.isServer = rank == 0;
    o.numWorkers = size_t(size);
    o.timeout = timeout;
    st = c10::make_intrusive<c10d::TCPStore>(hp.substr(0, colon), o);
  } else {
    throw std::invalid_argument("data-parallel store \"" + store + "\": expected file:PATH or tcp://HOST:PORT");
  }
  st->setTimeout(timeout);
  auto opts = c10d::ProcessGroupGloo::Options::create(timeout);
  opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(host));
  auto pg = c10::make_intrusive<c10d::ProcessGroupGloo>(st, rank, size, opts);
  return std::make_unique<BackendReducer>(std::move(pg), rank, size);
}

#else

bool gloo_available() { return false; }

std::unique_ptr<GradientReducer> gloo_reducer(const std::string&, int, int, const std::string&,
                                              std::chrono::milliseconds) {
  throw std::runtime_error(
      "data-parallel learner: this build has no c10d gloo backend (the gloo headers were not found when it was "
      "configured; scripts/setup unpacks them)");
}

#endif

#ifdef KERNELRL_HAVE_NCCL
bool nccl_available() { return true; }
#else
bool nccl_available() { return false; }
#endif

std::vector<std::shared_ptr<GradientReducer>> local_reducers(const std::vector<std::string>& devices,
                                                             std::chrono::milliseconds timeout) {
  const int size = int(devices.size());
  if (size < 1) throw std::invalid_argument("data-parallel learner: no devices");
  std::set<std::string> seen;
  bool cpu = false, cuda = false;
  for (auto& d : devices) {
    if (d == "cpu") {
      cpu = true;
    } else if (d.rfind("cuda:", 0) == 0 && d.size() > 5 && d.find_first_not_of("0123456789", 5) == std::string::npos) {
      cuda = true;
      if (!seen.insert(d).second)
        throw std::invalid_argument("data-parallel learner: " + d +
                                    " is listed twice (NCCL takes one GPU a rank: name each GPU once)");
    } else {
      throw std::invalid_argument("data-parallel learner: device \"" + d + "\": expected \"cpu\" or \"cuda:N\"");
    }
  }
  if (cpu && cuda)
    throw std::invalid_argument(
        "data-parallel learner: the ranks mix the CPU and GPUs (expected every device cpu, "
        "or every device cuda:N)");
  std::vector<std::shared_ptr<GradientReducer>> out(static_cast<size_t>(size));
  if (size == 1) return out;  // one rank: nothing to reduce
#if defined(KERNELRL_HAVE_GLOO) || defined(KERNELRL_HAVE_NCCL)
  auto store = c10::make_intrusive<c10d::HashStore>();
  store->setTimeout(timeout);
  std::vector<std::exception_ptr> errors(static_cast<size_t>(size));
  std::vector<std::thread> threads;
  for (int rank = 0; rank < size; ++rank)
    threads.emplace_back([&, rank] {
      try {
        c10::intrusive_ptr<c10d::Backend> pg;
        if (cpu) {
#ifdef KERNELRL_HAVE_GLOO
          auto opts = c10d::ProcessGroupGloo::Options::create(timeout);
          opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
          pg = c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, size, opts);
#else
          throw std::runtime_error(
              "data-parallel learner on the CPU: this build has no c10d gloo backend (the gloo headers were not "
              "found when it was configured; scripts/setup unpacks them)");
#endif
        } else {
#ifdef KERNELRL_HAVE_NCCL
          auto opts = c10d::ProcessGroupNCCL::Options::create();
          opts->timeout = timeout;
          pg = c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, size, opts);
#else
          throw std::runtime_error(
              "data-parallel learner on GPUs: this build has no c10d NCCL backend (nccl.h was not found beside "
              "torch when it was configured)");
#endif
        }
        out[size_t(rank)] = std::make_shared<BackendReducer>(std::move(pg), rank, size);
      } catch (...) {
        errors[size_t(rank)] = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
  return out;
#else
  (void)timeout;
  throw std::runtime_error(
      "data-parallel learner: this build has no c10d backend (neither the gloo headers nor nccl.h were found when "
      "it was configured)");
#endif
}

}  // namespace kernelrl
