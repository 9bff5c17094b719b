#include "learner/data_parallel.hpp"

#ifdef KERNELRL_HAVE_GLOO
#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#endif

#include <cstdlib>
#include <stdexcept>

namespace kernelrl {

#ifdef KERNELRL_HAVE_GLOO
namespace {

class GlooReducer : public GradientReducer {
 public:
  GlooReducer(c10::intrusive_ptr<c10d::ProcessGroupGloo> pg, int rank, int size)
      : pg_(std::move(pg)), rank_(rank), size_(size) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void sum(torch::Tensor& flat) override {
    std::vector<at::Tensor> t{flat};
    pg_->allreduce(t)->wait();
  }

 private:
  c10::intrusive_ptr<c10d::ProcessGroupGloo> pg_;
  int rank_, size_;
};

}  // namespace

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
  return std::make_unique<GlooReducer>(std::move(pg), rank, size);
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

}  // namespace kernelrl
