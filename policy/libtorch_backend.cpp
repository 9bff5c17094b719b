// The `libtorch` sampler backend: the in-process Policy.
#include "policy/sampler_backend.hpp"

namespace kernelrl {

namespace {

class LibtorchBackend final : public SamplerBackend {
 public:
  explicit LibtorchBackend(std::unique_ptr<Policy> p) : policy_(std::move(p)) {}
  std::string name() const override { return "libtorch"; }
  std::vector<GenSample> generate(const std::vector<std::string>& prompts, const SamplingParams& p) override {
    std::vector<GenSample> out;
    try {
      for (auto& c : policy_->generate(prompts, p))
        out.push_back(
            {std::move(c.text), std::move(c.token_ids), std::move(c.logprobs), c.finish_reason, policy_->version()});
    } catch (const CapacityError& e) {
      throw BackendError(std::string("libtorch: ") + e.what(), true);
    } catch (const std::exception& e) {
      throw BackendError(std::string("libtorch: ") + e.what());
    }
    return out;
  }
  void apply_weights(const WeightsUpdate& u) override {
    try {
      policy_->apply_weights(u.version, u.tensors);
    } catch (const std::exception& e) {
      throw BackendError(std::string("libtorch: ") + e.what());
    }
  }
  uint64_t version() const override { return policy_->version(); }
  std::string decode_path() const override { return policy_->last_generation().path; }

 private:
  std::unique_ptr<Policy> policy_;
};

}  // namespace

std::unique_ptr<SamplerBackend> make_libtorch_backend(const PolicyOptions& o) {
  try {
    return std::make_unique<LibtorchBackend>(Policy::load(o));
  } catch (const std::exception& e) {
    throw BackendError(std::string("libtorch: ") + e.what());
  }
}

}  // namespace kernelrl
