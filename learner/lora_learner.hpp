// LoraLearner: the learner's engine behind a torch-free interface (the model, the trainer and
// LibTorch stay in lora_learner.cpp), so the learner actor and launch do not include torch.
//
// GRPO: add_group() takes the G scored samples of one task as soon as their rewards are in,
// computes their advantages and runs forward/backward on them (in minibatches); step() takes
// the optimizer step once the step's groups are all in, and the policy version goes up by one.
// SFT: sft_step() on (prompt, completion) demonstrations with the same adapter and optimizer.
// Checkpoints: the adapter in PEFT format plus optimizer state, so a run resumes exactly.
#pragma once

#include "core/config.hpp"
#include "messages/messages.hpp"

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace kernelrl {

struct LearnerError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// What a learner is given: [learner] whole, as the config's reader made it (core/config.hpp holds
// each setting's one default; the reader resolves device and dtype from [policy]), and the few
// settings it takes from other sections.
struct LearnerOptions {
  LearnerConfig learner;     // devices, dtype, the fresh adapter's shape, estimator, optimizer, loss
  std::string model_dir;     // [policy] model: the Hugging Face model directory
  std::string adapter_dir;   // [policy] adapter: the PEFT adapter to start from ("": a fresh one)
  uint64_t seed = 0;         // [experiment] seed: a fresh adapter's initialisation
  double temperature = 1.0;  // [sampler] temperature: logprobs are recomputed at it
  // The mode's objective (core/mode.hpp): "grpo", group-relative advantages from the rewards;
  // "sdpo", per-token advantages sdpo_beta * (teacher - student logprob), the teacher being the
  // current policy given each sample's teacher_prompt (learner/sdpo.hpp).
  std::string objective = "grpo";
  double sdpo_beta = 1.0;  // [sdpo] beta
};

// One sample of a group as the learner needs it.
struct LearnSample {
  std::string prompt;              // prompt text (tokenized here the way the sampler did)
  std::vector<int32_t> token_ids;  // completion tokens
  std::vector<float> logprobs;     // their logprobs under the sampling policy
  double reward = 0;
  std::vector<float> token_advantages;  // optional, one per token: used instead of the group
                                        // advantage
  std::string teacher_prompt;           // objective "sdpo": the teacher's prompt text ("": this
                                        // sample carries no signal and is left out)
};

struct GroupOutcome {
  std::vector<double> advantages;  // per sample
  bool skipped = false;            // all rewards equal (sdpo: no teacher prompt): no gradient
  // sdpo, per sample (0 where left out): the teacher's and the student's summed logprobs of the
  // sample's tokens, and the tokens the teacher read (its prompt and the sample's tokens).
  std::vector<double> teacher_logprob_sum, student_logprob_sum;
  std::vector<uint64_t> teacher_tokens;
};

struct UpdateStats {
  uint64_t version = 0;  // policy version after the step
  double loss = 0, grad_norm = 0, lr = 0, tokens = 0, sequences = 0;
  double pg = 0, kl = 0, clip_fraction = 0, ratio_mean = 0, entropy = 0;
  double mismatch_tokens = 0, mismatch_sequences = 0;  // left out by mismatch rejection sampling
  bool applied = false;                                // false: no group carried a gradient (all skipped)
  double seconds = 0;                                  // forward/backward and optimizer time of the step
};

// What the learner actor drives (actors/learner.cpp calls nothing else, so it links without
// torch and tests can script an engine).
class LearnerEngine {
 public:
  virtual ~LearnerEngine() = default;
  // Advantages of the group and, unless skipped, its forward/backward. Throws LearnerError for a
  // sample whose logprobs do not match its tokens.
  virtual GroupOutcome add_group(const std::vector<LearnSample>& group) = 0;
  // The optimizer step over every group added since the last one; version() goes up by one even
  // when every group was skipped (the weights then stay as they were).
  virtual UpdateStats step() = 0;
  virtual uint64_t version() const = 0;
  virtual std::vector<TensorBlob> adapter_blobs() const = 0;
  // DIR/adapter_config.json + adapter_model.safetensors (PEFT), DIR/optimizer.safetensors and
  // DIR/learner.json (version, optimizer steps); written whole or not at all.
  virtual void save_checkpoint(const std::string& dir) const = 0;
  // Restores a directory written by save_checkpoint: adapter, optimizer state and version.
  virtual void load_checkpoint(const std::string& dir) = 0;
};

class GradientReducer;  // learner/data_parallel.hpp

class LoraLearner : public LearnerEngine {
 public:
  // Loads the model and adapter; throws LearnerError naming what is wrong.
  static std::unique_ptr<LoraLearner> create(const LearnerOptions& o);
  ~LoraLearner() override;

  GroupOutcome add_group(const std::vector<LearnSample>& group) override;
  UpdateStats step() override;
  uint64_t version() const override;
  std::vector<TensorBlob> adapter_blobs() const override;
  void save_checkpoint(const std::string& dir) const override;
  void load_checkpoint(const std::string& dir) override;
  // Data-parallel rank: step(true) takes the optimizer step through the reducer's collective even
  // when this rank learned nothing since the last step (another rank did); step(false) only counts
  // the version (no rank learned). Every rank makes the same call for every step.
  void set_reducer(std::shared_ptr<GradientReducer> r);
  UpdateStats step(bool optimizer);
  bool pending() const;  // gradients learned since the last step
  // One SFT optimizer step on `demos` (prompt, completion): cross-entropy of the completion
  // tokens and an end-of-sequence token. Does not change version().
  UpdateStats sft_step(const std::vector<std::pair<std::string, std::string>>& demos);

  struct Impl;

 private:
  explicit LoraLearner(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// The engine LearnerOptions ask for: a LoraLearner on `device`, or, with two or more `devices`, a
// data-parallel learner of one LoraLearner rank per device in this process (each on its own
// thread, gradients summed by c10d; learner/parallel_learner.cpp). Throws LearnerError.
std::unique_ptr<LearnerEngine> create_learner(const LearnerOptions& o);

}  // namespace kernelrl
