// policy_probe: test tool for tests/e2e/test_policy.py. Exposes what the CLI does not, so the Python
// test can compare against transformers / PEFT / tokenizers:
//   policy_probe logits --model DIR [--adapter DIR] [--device D] [--dtype T] --ids 1,2,3 --out FILE
//       float32 logits [T, vocab] of the ids, written as FILE (safetensors, tensor "logits")
//   policy_probe lora-init --model DIR --rank R --alpha A --targets q_proj,v_proj --seed S
//                          [--b-std X] --out DIR
//       a fresh kernelrl adapter saved in PEFT format; --b-std > 0 draws B ~ N(0, X) so that
//       the adapter changes the logits (a fresh PEFT adapter has B = 0)
//   policy_probe encode --model DIR --in FILE --out FILE
//       every line of FILE (JSON strings, one per line) encoded; FILE out: one JSON array per line
//   policy_probe hotload --server URL --served-model NAME --model DIR --adapter DIR --versions 3,4
//                        --adapter-root DIR
//       an openai backend takes the adapter as WeightsUpdates of each version (hot-loaded by the
//       server), sampling once after each; prints one JSON line per version
//   policy_probe advantages --estimator grpo|dr_grpo|rloo|trloo --rewards 1,0,0.5
//   policy_probe episodes --estimator trloo --gamma 0.9 --rewards "1,0;0,1;0.5,0.5" (episode;turn)
//       one JSON line: advantages, skipped
//   policy_probe loss --in FILE --out FILE [--clip-low X --clip-high X --agg A --kl-coef X]
//       FILE: logp, old_logp, adv ([B] or [B,T]), mask, optional ref_logp, entropy (float64);
//       writes loss, grad (d loss / d logp), pg, kl, clip_fraction, ratio_mean, entropy
//   policy_probe lora-grad --model DIR --adapter DIR --in FILE --out FILE [loss options]
//       FILE: ids [B,L] (int64), mask [B,L] (1: a completion token), old_logp [B,L], adv [B];
//       the GRPO loss of the completion tokens under model + adapter (float32), its LoRA
//       gradients written under PEFT key names, and "loss" (--checkpoint 1: with activation
//       checkpointing; also for train-step)
//   policy_probe train-step --model DIR --adapter DIR --in FILE --out DIR [--split K] [--steps S]
//                           [--lr X] [--max-grad-norm X] [--weight-decay X] [--temperature T]
//                           [--schedule constant|linear|cosine --warmup W --total N] [--sft 1]
//                           [--resume-after K] [--on-policy 1] [loss options]
//       S AdamW steps on the batch in FILE (as lora-grad; adv [B,L] is per token), each fed as K
//       minibatches; --sft 1: cross-entropy of the masked tokens instead; with --on-policy 1
//       old_logp is the current policy's before each step; --resume-after K saves adapter and
//       optimizer state before step K and continues from them in a fresh trainer (--drop-state 1:
//       without the optimizer state). Saves the
//       adapter to DIR (PEFT format) with DIR/report.json (each step's loss, gradient norm, lr, ...)
//   policy_probe engine-step --model DIR [--adapter DIR] --groups FILE --out DIR [--devices D1,D2,...]
//                            [--dtype T] [--steps S] [--lr X] [--minibatch M] [--estimator E]
//                            [--mismatch off|token|sequence] [--mismatch-threshold X]
//       the learner's engine as `launch` makes it (create_learner: one rank, or data-parallel
//       ranks on D1, D2, ...) learns S steps, each from every group of FILE (JSON: a list of
//       groups, each a list of {prompt, token_ids, logprobs, reward}); saves its checkpoint to DIR
//       (and, with --each 1, step K's to DIR.step-K) with DIR/report.json (each step's loss,
//       grad_norm, tokens, seconds, wall_s)
//   policy_probe update --model DIR --rank R --alpha A --targets ... --from DIR --ids ... --out FILE
//       a policy with a fresh adapter takes DIR's adapter as a WeightsUpdate, then writes logits
#include "policy/sampler_backend.hpp"
#include "learner/advantages.hpp"
#include "learner/grpo.hpp"
#include "learner/lora_learner.hpp"
#include "policy/model.hpp"
#include "learner/data_parallel.hpp"
#include "learner/trainer.hpp"
#include "policy/policy.hpp"
#include "policy/safetensors.hpp"
#include "policy/tokenizer.hpp"
#include "messages/messages.hpp"
#include "core/paths.hpp"

#include <nlohmann/json.hpp>

#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <sstream>

using namespace kernelrl;

namespace {

std::vector<std::string> split(const std::string& s, char c) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string x;
  while (std::getline(ss, x, c))
    if (!x.empty()) out.push_back(x);
  return out;
}

std::map<std::string, torch::Tensor> read_tensors(const std::string& path) {
  std::map<std::string, torch::Tensor> out;
  auto f = SafetensorsFile::open(path);
  for (auto& v : f->tensors()) {
    auto dt = v.dtype == StDtype::F64 ? torch::kFloat64 : v.dtype == StDtype::F32 ? torch::kFloat32 : torch::kInt64;
    out[v.name] = torch::from_blob(const_cast<uint8_t*>(v.data), v.shape, torch::TensorOptions().dtype(dt)).clone();
  }
  return out;
}

void write_tensors(const std::string& path, const std::map<std::string, torch::Tensor>& ts) {
  save_tensors(path, ts, torch::kFloat64);
}

LossOptions loss_options(const std::function<std::string(const std::string&, const std::string&)>& get) {
  LossOptions o;
  o.clip_low = std::stod(get("--clip-low", "0.2"));
  o.clip_high = std::stod(get("--clip-high", "0.2"));
  o.aggregation = get("--agg", "token_mean");
  o.kl_coef = std::stod(get("--kl-coef", "0"));
  o.entropy_coef = std::stod(get("--entropy-coef", "0"));
  return o;
}

void write_logits(const std::vector<float>& v, int64_t rows, const std::string& out) {
  int64_t cols = rows ? int64_t(v.size()) / rows : 0;
  write_safetensors(out, {{"logits", StDtype::F32, {rows, cols}, v.data(), v.size() * 4}});
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << "usage: policy_probe logits|lora-init|encode|update ...\n";
    return 2;
  }
  std::string cmd = argv[1];
  std::map<std::string, std::string> a;
  for (int i = 2; i + 1 < argc; i += 2) a[argv[i]] = argv[i + 1];
  auto get = [&](const std::string& k, const std::string& d = "") { return a.count(k) ? a[k] : d; };
  try {
    if (cmd == "logits" || cmd == "update") {
      PolicyOptions o;
      o.model_dir = get("--model");
      o.adapter_dir = get("--adapter");
      o.device = get("--device", "cpu");
      o.dtype = get("--dtype", "f32");
      if (cmd == "update") {
        o.lora_rank = std::stoll(get("--rank"));
        o.lora_alpha = std::stod(get("--alpha"));
        o.lora_targets = split(get("--targets"), ',');
      }
      auto p = Policy::load(o);
      if (cmd == "update") {
        PolicyOptions src = o;
        src.adapter_dir = get("--from");
        src.lora_rank = 0;
        auto q = Policy::load(src);
        p->apply_weights(7, q->adapter_blobs());
        if (p->version() != 7) throw std::runtime_error("version not applied");
      }
      std::vector<int32_t> ids;
      for (auto& s : split(get("--ids"), ',')) ids.push_back(std::stoi(s));
      write_logits(p->logits(ids), ids.size(), get("--out"));
      return 0;
    }
    if (cmd == "advantages") {
      AdvantageOptions o;
      o.estimator = get("--estimator", "grpo");
      std::vector<double> r;
      for (auto& x : split(get("--rewards"), ',')) r.push_back(std::stod(x));
      auto g = group_advantages(r, o);
      std::cout << nlohmann::json({{"advantages", g.advantages}, {"skipped", g.skipped}}).dump() << "\n";
      return 0;
    }
    if (cmd == "episodes") {  // --estimator E --gamma G --rewards "r00,r01;r10,r11;..." (episode;turn)
      AdvantageOptions o;
      o.estimator = get("--estimator", "trloo");
      std::vector<std::vector<double>> r;
      for (auto& e : split(get("--rewards"), ';')) {
        r.emplace_back();
        for (auto& x : split(e, ',')) r.back().push_back(std::stod(x));
      }
      auto a = episode_advantages(r, std::stod(get("--gamma", "1")), o);
      std::cout << nlohmann::json({{"advantages", a.advantages}, {"skipped", a.skipped}}).dump() << "\n";
      return 0;
    }
    if (cmd == "loss") {
      auto in = read_tensors(get("--in"));
      auto logp = in.at("logp").clone().requires_grad_(true);
      auto r = policy_loss(logp, in.at("old_logp"), in.at("adv"), in.at("mask"),
                           in.count("ref_logp") ? in.at("ref_logp") : torch::Tensor(),
                           in.count("entropy") ? in.at("entropy") : torch::Tensor(), loss_options(get));
      r.loss.backward();
      auto sc = [](double x) { return torch::tensor({x}, torch::kFloat64); };
      write_tensors(get("--out"), {{"loss", r.loss.detach().reshape({1})},
                                   {"grad", logp.grad()},
                                   {"pg", sc(r.pg)},
                                   {"kl", sc(r.kl)},
                                   {"clip_fraction", sc(r.clip_fraction)},
                                   {"ratio_mean", sc(r.ratio_mean)},
                                   {"entropy", sc(r.entropy)}});
      return 0;
    }
    if (cmd == "lora-grad") {
      CausalLM m(get("--model"), torch::kCPU, torch::kFloat32);
      m.load_lora(get("--adapter"));
      m.set_checkpointing(get("--checkpoint", "0") == "1");
      auto params = m.lora_tensors();
      for (auto& [n, t] : params) t.requires_grad_(true);
      auto in = read_tensors(get("--in"));
      auto ids = in.at("ids").to(torch::kInt64);
      const int64_t L = ids.size(1);
      auto lp = m.sequence_logprobs(ids, /*training=*/true).to(torch::kFloat64);
      auto r = policy_loss(lp, in.at("old_logp").narrow(1, 1, L - 1), in.at("adv"), in.at("mask").narrow(1, 1, L - 1),
                           torch::Tensor(), torch::Tensor(), loss_options(get));
      r.loss.backward();
      std::map<std::string, torch::Tensor> out{{"loss", r.loss.detach().reshape({1})}};
      for (auto& [n, t] : params) out[n] = t.grad();
      write_tensors(get("--out"), out);
      return 0;
    }
    if (cmd == "train-step") {
      CausalLM m(get("--model"), torch::kCPU, torch::kFloat32);
      m.load_lora(get("--adapter"));
      TrainOptions o;
      o.learning_rate = std::stod(get("--lr", "1e-3"));
      o.max_grad_norm = std::stod(get("--max-grad-norm", "1.0"));
      o.weight_decay = std::stod(get("--weight-decay", "0"));
      o.temperature = std::stod(get("--temperature", "1"));
      o.schedule = get("--schedule", "constant");
      o.warmup_steps = std::stoll(get("--warmup", "0"));
      o.total_steps = std::stoll(get("--total", "0"));
      o.loss = loss_options(get);
      o.activation_checkpointing = get("--checkpoint", "0") == "1";
      const bool sft = get("--sft", "0") == "1";
      auto tr = std::make_unique<LoraTrainer>(m, o);
      // Data-parallel: rank R of N learns minibatches k = R, R + N, ... of the --split parts; with
      // --dp-store the ranks meet in c10d gloo and each takes the whole batch's step, without it
      // the rank steps on its share alone.
      const int dp_size = std::stoi(get("--dp-size", "1")), dp_rank = std::stoi(get("--dp-rank", "0"));
      std::shared_ptr<GradientReducer> reducer;
      if (dp_size > 1 && !get("--dp-store").empty())
        reducer = gloo_reducer(get("--dp-store"), dp_rank, dp_size, "127.0.0.1");
      tr->set_reducer(reducer);
      auto in = read_tensors(get("--in"));
      auto ids = in.at("ids").to(torch::kInt64);
      const int64_t B = ids.size(0), L = ids.size(1);
      int64_t K = std::stoll(get("--split", "1"));
      const int resume_after = std::stoi(get("--resume-after", "-1"));
      nlohmann::json report = nlohmann::json::array();
      for (int s = 0, S = std::stoi(get("--steps", "1")); s < S; ++s) {
        if (s == resume_after) {  // as a resumed run: adapter and optimizer state from disk
          std::string ck = get("--out") + ".resume";
          m.save_lora(ck, get("--model"));
          tr->save_state(ck + "/optimizer.safetensors");
          tr.reset();
          m.load_lora(ck);
          tr = std::make_unique<LoraTrainer>(m, o);
          tr->set_reducer(reducer);
          if (get("--drop-state", "0") != "1") tr->load_state(ck + "/optimizer.safetensors");
        }
        auto old = in.at("old_logp");
        if (get("--on-policy", "0") == "1") {
          torch::NoGradGuard ng;
          old = torch::zeros({B, L}, torch::kFloat64);
          old.narrow(1, 1, L - 1).copy_(m.sequence_logprobs(ids, /*training=*/false, o.temperature));
        }
        for (int64_t k = 0; k < K; ++k) {
          int64_t b0 = B * k / K, b1 = B * (k + 1) / K;
          if (b1 <= b0 || k % dp_size != dp_rank) continue;
          if (sft) {
            tr->accumulate_sft(ids.narrow(0, b0, b1 - b0), in.at("mask").narrow(0, b0, b1 - b0));
            continue;
          }
          TrainBatch tb{ids.narrow(0, b0, b1 - b0), in.at("mask").narrow(0, b0, b1 - b0), old.narrow(0, b0, b1 - b0),
                        in.at("adv").narrow(0, b0, b1 - b0), torch::Tensor()};
          tr->accumulate(tb);
        }
        auto r = tr->step();
        report.push_back({{"loss", r.loss},
                          {"grad_norm", r.grad_norm},
                          {"tokens", r.tokens},
                          {"lr", r.lr},
                          {"kl", r.kl},
                          {"entropy", r.entropy},
                          {"clip_fraction", r.clip_fraction},
                          {"ratio_mean", r.ratio_mean},
                          {"pg", r.pg}});
      }
      m.save_lora(get("--out"), get("--model"));
      std::ofstream(get("--out") + "/report.json") << report.dump() << "\n";
      return 0;
    }
    if (cmd == "hotload") {
      PolicyOptions o;
      o.model_dir = get("--model");
      o.adapter_dir = get("--adapter");
      auto p = Policy::load(o);
      OpenAIOptions oo;
      oo.url = get("--server");
      oo.model = get("--served-model");
      oo.adapter_root = get("--adapter-root");
      oo.lora_alpha = 8;
      oo.max_retries = 0;
      auto b = make_openai_backend(oo);
      for (auto& v : split(get("--versions"), ',')) {
        WeightsUpdate u;
        u.version = std::stoull(v);
        u.tensors = p->adapter_blobs();
        b->apply_weights(u);
        SamplingParams sp;
        sp.max_tokens = 8;
        auto out = b->generate({"```python\nclass Model:\n    def forward(self, x):\n        return x\n```"}, sp);
        std::cout << nlohmann::json(
                         {{"version", b->version()}, {"sample_version", out[0].policy_version}, {"text", out[0].text}})
                         .dump()
                  << "\n";
      }
      return 0;
    }
    if (cmd == "lora-init") {
      CausalLM m(get("--model"), torch::kCPU, torch::kFloat32);
      LoraSettings s;
      s.r = std::stoll(get("--rank"));
      s.alpha = std::stod(get("--alpha"));
      s.targets = split(get("--targets"), ',');
      m.add_lora(s, std::stoull(get("--seed", "0")));
      double bstd = std::stod(get("--b-std", "0"));
      if (bstd > 0) {
        torch::NoGradGuard ng;
        torch::manual_seed(std::stoull(get("--seed", "0")) + 1);
        for (auto& [name, t] : m.lora_tensors())
          if (name.find("lora_B") != std::string::npos) t.normal_(0, bstd);
      }
      m.save_lora(get("--out"), get("--model"));
      return 0;
    }
    if (cmd == "engine-step") {
      LearnerOptions lo;
      lo.model_dir = get("--model");
      lo.adapter_dir = get("--adapter");
      lo.learner.devices = split(get("--devices", "cpu"), ',');
      lo.learner.device = lo.learner.devices.front();
      lo.learner.dtype = get("--dtype", "f32");
      lo.learner.learning_rate = std::stod(get("--lr", "0.01"));
      lo.learner.minibatch_size = uint32_t(std::stoul(get("--minibatch", "4")));
      lo.learner.algorithm = get("--estimator", "grpo");
      lo.seed = std::stoull(get("--seed", "0"));
      lo.learner.activation_checkpointing = get("--checkpoint", "0") == "1";
      lo.learner.mismatch = get("--mismatch", "off");
      lo.learner.mismatch_threshold = std::stod(get("--mismatch-threshold", "0.5"));
      std::ifstream in(get("--groups"));
      auto j = nlohmann::json::parse(in);
      std::vector<std::vector<LearnSample>> groups;
      for (auto& g : j) {
        std::vector<LearnSample> group;
        for (auto& x : g)
          group.push_back({x.at("prompt").get<std::string>(),
                           x.at("token_ids").get<std::vector<int32_t>>(),
                           x.at("logprobs").get<std::vector<float>>(),
                           x.at("reward").get<double>(),
                           {},
                           {}});
        groups.push_back(std::move(group));
      }
      auto engine = create_learner(lo);
      nlohmann::json report = nlohmann::json::array();
      for (int s = 0, S = std::stoi(get("--steps", "1")); s < S; ++s) {
        const double t0 = mono_s();
        for (auto& g : groups) engine->add_group(g);
        auto u = engine->step();
        report.push_back({{"loss", u.loss},
                          {"grad_norm", u.grad_norm},
                          {"tokens", u.tokens},
                          {"sequences", u.sequences},
                          {"mismatch_tokens", u.mismatch_tokens},
                          {"mismatch_sequences", u.mismatch_sequences},
                          {"version", u.version},
                          {"seconds", u.seconds},
                          {"wall_s", mono_s() - t0}});
        if (get("--each", "0") == "1") engine->save_checkpoint(get("--out") + ".step-" + std::to_string(s + 1));
      }
      engine->save_checkpoint(get("--out"));
      std::ofstream(get("--out") + "/report.json") << report.dump(2) << "\n";
      return 0;
    }
    if (cmd == "encode") {
      auto tok = Tokenizer::load(get("--model"));
      std::ifstream in(get("--in"));
      std::ofstream out(get("--out"));
      std::string line;
      while (std::getline(in, line)) {
        std::string text = nlohmann::json::parse(line).get<std::string>();
        auto ids = tok->encode(text);
        nlohmann::json j = {{"ids", ids}, {"decoded", tok->decode(ids)}};
        out << j.dump() << "\n";
      }
      return 0;
    }
  } catch (const std::exception& e) {
    std::cerr << "policy_probe " << cmd << ": " << e.what() << "\n";
    return 1;
  }
  std::cerr << "policy_probe: unknown command " << cmd << "\n";
  return 2;
}
