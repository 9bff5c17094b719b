// The data-parallel learner (create_learner with two or more devices): one LoraLearner rank per
// device, each on a thread of its own so the ranks compute at once. A group goes whole to the rank
// with the fewest tokens queued in the step (its advantages are computed here, from the rewards,
// before it is queued: the learner actor gets its outcome at once); step() waits for every rank's
// queue, then every rank takes the step together: c10d sums the gradients and statistics of all
// ranks (LoraTrainer::step), so each rank takes the same AdamW step and holds the same adapter,
// the one a single learner gets from the whole step. Checkpoints and weights come from rank 0.
#include "learner/data_parallel.hpp"
#include "learner/lora_learner.hpp"
#include "learner/objective.hpp"

#include "core/log_line.hpp"
#include "core/paths.hpp"

#include <c10/cuda/CUDAFunctions.h>

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <mutex>
#include <thread>

namespace kernelrl {

namespace {

// One rank: its learner and the thread every call on it runs on (CUDA ranks with that thread's
// current device set to theirs, so kernels launch where the rank's tensors are).
class Rank {
 public:
  Rank(int index, std::string device) : index_(index), device_(std::move(device)) {
    thread_ = std::thread([this] { loop(); });
  }
  ~Rank() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  int index() const { return index_; }
  const std::string& device() const { return device_; }
  LoraLearner& learner() { return *learner_; }
  std::unique_ptr<LoraLearner>& slot() { return learner_; }
  double queued_tokens = 0;  // of the current step

  // Runs f on the rank's thread after what is queued before it.
  template <class F>
  auto run(F f) -> std::future<decltype(f())> {
    auto task = std::make_shared<std::packaged_task<decltype(f())()>>(std::move(f));
    auto fut = task->get_future();
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back([task] { (*task)(); });
    }
    cv_.notify_all();
    return fut;
  }

 private:
  void loop() {
    if (device_.rfind("cuda:", 0) == 0 && torch::cuda::is_available()) {
      const int n = std::stoi(device_.substr(5));
      if (n < int(torch::cuda::device_count())) c10::cuda::set_device(c10::DeviceIndex(n));
    }
    for (;;) {
      std::function<void()> job;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;
        job = std::move(queue_.front());
        queue_.pop_front();
      }
      job();
    }
  }

  int index_;
  std::string device_;
  std::unique_ptr<LoraLearner> learner_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  bool stop_ = false;
  std::thread thread_;
};

// Every future's result, or the first failure, named by its rank, once all have finished.
template <class T>
std::vector<T> gather(std::vector<std::future<T>>& futs, const std::vector<std::unique_ptr<Rank>>& ranks,
                      const std::string& what) {
  std::vector<T> out;
  std::string error;
  for (size_t r = 0; r < futs.size(); ++r) {
    try {
      out.push_back(futs[r].get());
    } catch (const std::exception& e) {
      if (error.empty())
        error = "learner: " + what + " on rank " + std::to_string(r) + " (" + ranks[r]->device() + "): " + e.what();
    }
  }
  if (!error.empty()) throw LearnerError(error);
  return out;
}

class ParallelLearner : public LearnerEngine {
 public:
  explicit ParallelLearner(const LearnerOptions& o) : objective_(make_objective(o)) {
    std::vector<std::shared_ptr<GradientReducer>> reducers;
    try {
      reducers = local_reducers(o.learner.devices);
    } catch (const std::exception& e) {
      throw LearnerError(std::string("learner: ") + e.what());
    }
    for (size_t r = 0; r < o.learner.devices.size(); ++r)
      ranks_.push_back(std::make_unique<Rank>(int(r), o.learner.devices[r]));
    // Each rank loads its model on its own device at once; the same seed gives every rank the
    // same fresh adapter (drawn on the CPU, then moved).
    std::vector<std::future<bool>> made;
    for (size_t r = 0; r < ranks_.size(); ++r) {
      Rank* rank = ranks_[r].get();
      LearnerOptions ro = o;
      ro.learner.device = o.learner.devices[r];
      ro.learner.devices.clear();
      auto reducer = reducers[r];
      made.push_back(rank->run([rank, ro, reducer] {
        rank->slot() = LoraLearner::create(ro);
        rank->slot()->set_reducer(reducer);
        return true;
      }));
    }
    gather(made, ranks_, "loading the model");
    log::info("learner", "data-parallel over " + std::to_string(ranks_.size()) + " ranks (" + joined() +
                             "), gradients summed by c10d " + (o.learner.devices[0] == "cpu" ? "gloo" : "NCCL"));
  }

  ~ParallelLearner() override {
    // Each learner goes on its own thread, then the threads.
    std::vector<std::future<bool>> gone;
    for (auto& r : ranks_) {
      Rank* rank = r.get();
      gone.push_back(rank->run([rank] {
        rank->slot().reset();
        return true;
      }));
    }
    for (auto& f : gone) try {
        f.get();
      } catch (...) {}
    ranks_.clear();
  }

  GroupOutcome add_group(const std::vector<LearnSample>& group) override {
    GroupOutcome out = objective_->plan(group);
    if (out.skipped) return out;
    double tokens = 0;
    for (auto& s : group) tokens += double(s.token_ids.size()) + double(s.prompt.size()) / 4.0;
    Rank* rank = std::min_element(ranks_.begin(), ranks_.end(), [](auto& a, auto& b) {
                   return a->queued_tokens < b->queued_tokens;
                 })->get();
    rank->queued_tokens += tokens;
    if (objective_->needs_policy()) {  // the outcome needs the policy's scores: wait for them
      const double t0 = mono_s();
      auto f = rank->run([rank, group] { return rank->learner().add_group(group); });
      auto got = f.get();
      serial_s_ += mono_s() - t0;  // the ranks took these one at a time
      return got;
    }
    pending_.push_back(rank->run([rank, group] {
      try {
        rank->learner().add_group(group);
      } catch (const std::exception& e) {  // as a single learner: the group is left out of the update
        log::error("learner", "rank " + std::to_string(rank->index()) + " (" + rank->device() +
                                  "): " + std::string(e.what()) + "; the group is left out of the update");
      }
      return true;
    }));
    return out;
  }

  UpdateStats step() override {
    const double t0 = mono_s();
    for (auto& f : pending_) f.get();
    pending_.clear();
    std::vector<std::future<bool>> drained;
    for (auto& r : ranks_) {
      Rank* rank = r.get();
      drained.push_back(rank->run([rank] { return rank->learner().pending(); }));
    }
    bool optimizer = false;
    for (bool p : gather(drained, ranks_, "finishing the step's groups")) optimizer = optimizer || p;
    std::vector<std::future<UpdateStats>> steps;
    for (auto& r : ranks_) {
      Rank* rank = r.get();
      rank->queued_tokens = 0;
      steps.push_back(rank->run([rank, optimizer] { return rank->learner().step(optimizer); }));
    }
    auto all = gather(steps, ranks_, "the optimizer step");
    UpdateStats u = all.front();
    for (auto& s : all) {
      if (s.version != u.version)
        throw LearnerError("learner: the data-parallel ranks disagree on the policy version (" +
                           std::to_string(u.version) + " and " + std::to_string(s.version) + ")");
      u.seconds = std::max(u.seconds, s.seconds);
    }
    // The step's compute time: queued groups run on the ranks at once (the busiest rank's time);
    // SDPO's groups ran one at a time, so their time is the sum the caller waited.
    if (serial_s_ > 0) u.seconds = serial_s_ + (mono_s() - t0);
    serial_s_ = 0;
    return u;
  }

  uint64_t version() const override { return ranks_.front()->learner().version(); }

  std::vector<TensorBlob> adapter_blobs() const override {
    Rank* rank = ranks_.front().get();
    return rank->run([rank] { return rank->learner().adapter_blobs(); }).get();
  }

  void save_checkpoint(const std::string& dir) const override {
    Rank* rank = ranks_.front().get();
    rank->run([rank, dir] {
          rank->learner().save_checkpoint(dir);
          return true;
        })
        .get();
  }

  void load_checkpoint(const std::string& dir) override {
    std::vector<std::future<bool>> loaded;
    for (auto& r : ranks_) {
      Rank* rank = r.get();
      loaded.push_back(rank->run([rank, dir] {
        rank->learner().load_checkpoint(dir);
        return true;
      }));
    }
    gather(loaded, ranks_, "resuming");
  }

 private:
  std::string joined() const {
    std::string s;
    for (auto& r : ranks_) s += (s.empty() ? "" : ", ") + r->device();
    return s;
  }

  std::unique_ptr<Objective> objective_;  // checks and plans each group before a rank learns from it
  std::vector<std::unique_ptr<Rank>> ranks_;
  std::vector<std::future<bool>> pending_;  // the step's queued groups
  double serial_s_ = 0;                     // SDPO: time spent waiting on groups in this step
};

}  // namespace

std::unique_ptr<LearnerEngine> create_learner(const LearnerOptions& o) {
  if (o.learner.devices.size() > 1) return std::make_unique<ParallelLearner>(o);
  LearnerOptions one = o;
  if (o.learner.devices.size() == 1) one.learner.device = o.learner.devices.front();
  one.learner.devices.clear();
  return LoraLearner::create(one);
}

}  // namespace kernelrl
