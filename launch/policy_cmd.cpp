// launch generate / score / tokenize / merge / sft: the policy runtime (policy/policy.hpp) and
// the learner's SFT (learner/lora_learner.hpp) from the command line, and `launch probe`. Errors
// (a missing file, an unsupported checkpoint) print one line and exit 2.
#include "launch/cli.hpp"
#include "launch/commands.hpp"
#include "analysis/analysis.hpp"

#include "core/config.hpp"
#include "core/paths.hpp"
#include "store/store.hpp"

#include "policy/sampler_backend.hpp"
#include "learner/lora_learner.hpp"
#include "policy/policy.hpp"
#include "policy/tokenizer.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>

namespace kernelrl {

namespace {

PolicyOptions policy_options(const PolicyCliOptions& o) {
  PolicyOptions p;
  p.model_dir = o.model;
  p.adapter_dir = o.adapter;
  p.device = o.device;
  p.dtype = !o.dtype.empty() ? o.dtype : o.device.rfind("cuda", 0) == 0 ? "bf16" : "f32";
  p.max_rows = o.max_rows;
  return p;
}

int fail(const std::string& cmd, const std::string& what) {
  std::fprintf(stderr, "launch %s: %s\n", cmd.c_str(), what.c_str());
  return 2;
}

std::string dump(const nlohmann::json& j) { return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace); }

const char* logprob_note = "log softmax(logits / temperature) of each token, before top-p truncation";

}  // namespace

int cmd_generate(const PolicyCliOptions& o) {
  try {
    std::unique_ptr<SamplerBackend> backend;
    if (!o.server.empty()) {
      OpenAIOptions oo;
      oo.url = o.server;
      oo.model = o.served_model;
      oo.timeout_s = o.timeout_s;
      oo.max_retries = o.retries;
      if (const char* k = std::getenv("OPENAI_API_KEY")) oo.api_key = k;
      backend = make_openai_backend(oo);
    } else {
      backend = make_libtorch_backend(policy_options(o));
    }
    SamplingParams sp;
    sp.temperature = o.temperature;
    sp.top_p = o.top_p;
    sp.max_tokens = o.max_tokens;
    sp.n = o.n;
    sp.seed = o.seed;
    sp.stop = o.stop;
    auto t0 = std::chrono::steady_clock::now();
    auto out = backend->generate(o.prompts, sp);
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    size_t tokens = 0;
    for (auto& c : out) tokens += c.token_ids.size();
    if (!o.json) {
      for (size_t i = 0; i < out.size(); ++i) {
        std::printf("--- prompt %zu, sample %zu (%zu tokens, %s)\n%s\n", i / o.n, i % o.n, out[i].token_ids.size(),
                    out[i].finish_reason.c_str(), out[i].text.c_str());
      }
      std::fprintf(stderr, "%zu tokens in %.2f s (%.1f tokens/s)\n", tokens, secs, secs > 0 ? tokens / secs : 0.0);
      return 0;
    }
    nlohmann::json j;
    j["backend"] = backend->name();
    j["model"] = o.server.empty() ? o.model : o.served_model;
    j["adapter"] = o.adapter;
    j["logprobs"] = o.server.empty() ? logprob_note : "as the server reports them";
    j["seconds"] = secs;
    if (const std::string path = backend->decode_path(); !path.empty()) j["decode_path"] = path;
    j["completions"] = nlohmann::json::array();
    for (size_t i = 0; i < out.size(); ++i)
      j["completions"].push_back({{"prompt_index", i / o.n},
                                  {"text", out[i].text},
                                  {"token_ids", out[i].token_ids},
                                  {"logprobs", out[i].logprobs},
                                  {"finish_reason", out[i].finish_reason},
                                  {"policy_version", out[i].policy_version}});
    std::printf("%s\n", dump(j).c_str());
    return 0;
  } catch (const std::exception& e) {
    return fail("generate", e.what());
  }
}

int cmd_score(const PolicyCliOptions& o) {
  try {
    auto policy = Policy::load(policy_options(o));
    auto s = policy->score(o.prompts[0], o.completion, o.temperature);
    double sum = 0;
    for (float x : s.logprobs) sum += x;
    if (!o.json) {
      std::printf("%zu prompt tokens, %zu completion tokens, sum logprob %.6f\n", s.prompt_ids.size(),
                  s.token_ids.size(), sum);
      for (size_t i = 0; i < s.token_ids.size(); ++i)
        std::printf("%8d %12.6f  %s\n", s.token_ids[i], s.logprobs[i],
                    dump(nlohmann::json(policy->tokenizer().decode({s.token_ids[i]}))).c_str());
      return 0;
    }
    nlohmann::json j = {{"model", o.model},           {"adapter", o.adapter},     {"logprobs_are", logprob_note},
                        {"prompt_ids", s.prompt_ids}, {"token_ids", s.token_ids}, {"logprobs", s.logprobs},
                        {"sum_logprob", sum}};
    std::printf("%s\n", dump(j).c_str());
    return 0;
  } catch (const std::exception& e) {
    return fail("score", e.what());
  }
}

int cmd_tokenize(const PolicyCliOptions& o) {
  try {
    auto tok = Tokenizer::load(o.model);
    auto ids = tok->encode(o.prompts[0]);
    if (o.json) {
      nlohmann::json pieces = nlohmann::json::array();
      for (auto id : ids) pieces.push_back(tok->decode({id}));
      std::printf("%s\n", dump({{"token_ids", ids}, {"pieces", pieces}, {"decoded", tok->decode(ids)}}).c_str());
    } else {
      for (auto id : ids) std::printf("%d\t%s\n", id, dump(nlohmann::json(tok->decode({id}))).c_str());
    }
    return 0;
  } catch (const std::exception& e) {
    return fail("tokenize", e.what());
  }
}

int cmd_merge(const PolicyCliOptions& o) {
  try {
    auto policy = Policy::load(policy_options(o));
    policy->export_merged(o.out);
    std::printf("merged %s into %s\n", o.adapter.c_str(), o.out.c_str());
    return 0;
  } catch (const std::exception& e) {
    return fail("merge", e.what());
  }
}

namespace {
// Over the correct samples: Spearman's rho of a checkpoint's NLL against speedup (with its p-value),
// and the same within each quartile of NLL, Q1 the most surprising quarter (the highest NLL).
nlohmann::json nll_vs_speedup(const std::vector<SampleRow>& picked, const nlohmann::json& nll) {
  std::vector<double> x, y;
  for (size_t i = 0; i < picked.size(); ++i)
    if (picked[i].status == "ok") {
      x.push_back(nll[i].get<double>());
      y.push_back(picked[i].speedup);
    }
  auto num = [](double v) { return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr); };
  const double rho = spearman(x, y);
  nlohmann::json j = {
      {"n", x.size()}, {"spearman_rho", num(rho)}, {"spearman_p", num(spearman_p_value(rho, x.size()))}};
  nlohmann::json quart = nlohmann::json::array();
  if (x.size() >= 8) {
    std::vector<double> neg(x.size());
    for (size_t i = 0; i < x.size(); ++i) neg[i] = -x[i];
    auto order = surprisal_order(neg);  // the highest NLL first
    for (int q = 0; q < 4; ++q) {
      std::vector<double> qx, qy;
      for (size_t k = order.size() * q / 4; k < order.size() * (q + 1) / 4; ++k) {
        qx.push_back(x[order[k]]);
        qy.push_back(y[order[k]]);
      }
      double mean = 0;
      for (double v : qy) mean += v / double(qy.size());
      quart.push_back(
          {{"quartile", q + 1}, {"n", qx.size()}, {"spearman_rho", num(spearman(qx, qy))}, {"mean_speedup", mean}});
    }
  }
  j["quartiles"] = quart;
  return j;
}
}  // namespace

int cmd_probe(const ProbeOptions& o) {
  namespace fs = std::filesystem;
  const fs::path dir = o.run_dir;
  auto loaded = load_config((dir / "config.resolved.toml").string());
  if (auto* errs = std::get_if<std::vector<ConfigError>>(&loaded)) {
    for (auto& e : *errs) std::fprintf(stderr, "launch probe: %s\n", e.format().c_str());
    return 2;
  }
  const Config& cfg = std::get<Config>(loaded);
  if (cfg.policy.model.empty()) return fail("probe", o.run_dir + ": the run has no [policy] model to score with");
  std::string err;
  // The fixed samples: the first N with tokens of the earliest such step of this run, or of
  // every step of --samples-from (another run of the same model: e.g. best-of-N samples rescored
  // under a TTT run's checkpoints).
  const fs::path src = o.samples_from.empty() ? dir : fs::path(o.samples_from);
  std::string src_file = cfg.store.file;
  if (!o.samples_from.empty()) {
    auto other = load_config((src / "config.resolved.toml").string());
    if (auto* errs = std::get_if<std::vector<ConfigError>>(&other)) {
      for (auto& e : *errs) std::fprintf(stderr, "launch probe: --samples-from: %s\n", e.format().c_str());
      return 2;
    }
    const Config& oc = std::get<Config>(other);
    if (oc.policy.model != cfg.policy.model)
      return fail("probe", "--samples-from " + o.samples_from + ": its samples are of model " + oc.policy.model +
                               ", the checkpoints adapt " + cfg.policy.model +
                               " (token ids of one are not the other's)");
    src_file = oc.store.file;
  }
  auto store = Store::open_readonly((src / src_file).string(), err);
  if (!store) return fail("probe", err);
  std::vector<SampleRow> picked;
  {
    auto rows = store->samples();
    uint32_t first = UINT32_MAX;
    for (auto& r : rows)
      if (!r.record.rollout.token_ids.empty()) first = std::min(first, r.step);
    for (auto& r : rows)
      if ((!o.samples_from.empty() || r.step == first) && !r.record.rollout.token_ids.empty() &&
          (o.samples == 0 || picked.size() < o.samples))
        picked.push_back(r);
  }
  if (picked.empty()) return fail("probe", src.string() + ": no sample with token ids to rescore");
  auto checkpoints = list_checkpoints((dir / "checkpoints").string());
  if (checkpoints.empty()) return fail("probe", o.run_dir + ": no checkpoints/step-N adapters");
  const double T = cfg.sampler.temperature > 0 ? cfg.sampler.temperature : 1.0;
  nlohmann::json out = {{"run_dir", fs::absolute(dir).lexically_normal().string()},
                        {"temperature", T},
                        {"samples", nlohmann::json::array()},
                        {"checkpoints", nlohmann::json::array()}};
  for (auto& r : picked)
    out["samples"].push_back({{"sample_id", r.sample_id}, {"tokens", r.record.rollout.token_ids.size()}});
  try {
    for (auto& [step, path] : checkpoints) {
      PolicyOptions po;
      po.model_dir = cfg.policy.model;
      po.adapter_dir = path;
      po.device = o.device.empty() ? cfg.policy.device : o.device;
      po.dtype = o.dtype.empty() ? cfg.policy.dtype : o.dtype;
      auto policy = Policy::load(po);
      std::vector<std::vector<int32_t>> prompts, comps;
      for (auto& r : picked) {
        prompts.push_back(policy->tokenizer().encode(r.record.rollout.prompt));
        comps.push_back(r.record.rollout.token_ids);
      }
      auto lps = policy->score_ids(prompts, comps, T);
      nlohmann::json nll = nlohmann::json::array();
      double sum = 0;
      for (auto& lp : lps) {
        double s = 0;
        for (float x : lp) s -= x;
        double mean = lp.empty() ? 0.0 : s / double(lp.size());
        nll.push_back(mean);
        sum += mean;
      }
      out["checkpoints"].push_back({{"step", step},
                                    {"path", path},
                                    {"mean_nll", sum / double(lps.size())},
                                    {"nll", nll},
                                    {"nll_vs_speedup", nll_vs_speedup(picked, nll)}});
    }
  } catch (const std::exception& e) {
    return fail("probe", e.what());
  }
  if (o.json) {
    std::printf("%s\n", dump(out).c_str());
    return 0;
  }
  auto f = [](const nlohmann::json& v) {
    return v.is_number() ? fmt::format("{:.3f}", v.get<double>()) : std::string("-");
  };
  std::printf(
      "%zu samples of %s rescored at temperature %g: mean per-token NLL; over the correct ones, Spearman rho "
      "of NLL against speedup (p), and within each NLL quartile (Q1 the most surprising)\n",
      picked.size(), o.samples_from.empty() ? "the first step" : src.string().c_str(), T);
  for (auto& c : out["checkpoints"]) {
    auto& v = c["nll_vs_speedup"];
    std::string qs;
    for (auto& q : v["quartiles"]) qs += fmt::format("  Q{} {}", q["quartile"].get<int>(), f(q["spearman_rho"]));
    std::printf("  step-%llu  %.4f  rho %s (p %s, %llu correct)%s\n", (unsigned long long)c["step"].get<uint64_t>(),
                c["mean_nll"].get<double>(), f(v["spearman_rho"]).c_str(),
                v["spearman_p"].is_number() ? fmt::format("{:.3g}", v["spearman_p"].get<double>()).c_str() : "-",
                (unsigned long long)v["n"].get<uint64_t>(), qs.c_str());
  }
  return 0;
}

int cmd_sft(const SftOptions& o) {
  std::vector<std::pair<std::string, std::string>> demos;
  {
    std::ifstream in(o.data);
    if (!in) return fail("sft", o.data + ": cannot open");
    std::string line;
    for (size_t n = 1; std::getline(in, line); ++n) {
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      std::string where = o.data + ":" + std::to_string(n);
      try {
        auto j = nlohmann::json::parse(line);
        if (!j.is_object() || !j.contains("prompt") || !j["prompt"].is_string() || !j.contains("completion") ||
            !j["completion"].is_string())
          return fail("sft", where + ": expected an object with string fields \"prompt\" and \"completion\"");
        demos.emplace_back(j["prompt"].get<std::string>(), j["completion"].get<std::string>());
      } catch (const nlohmann::json::exception& e) {
        return fail("sft", where + ": not valid JSON: " + e.what());
      }
    }
  }
  if (demos.empty()) return fail("sft", o.data + ": no demonstrations");
  try {
    LearnerOptions lo;
    lo.model_dir = o.model;
    lo.adapter_dir = o.adapter;
    lo.learner.device = o.device;
    lo.learner.dtype = !o.dtype.empty() ? o.dtype : o.device.rfind("cuda", 0) == 0 ? "bf16" : "f32";
    lo.learner.lora_rank = o.rank;
    lo.learner.lora_alpha = o.alpha;
    lo.learner.lora_targets = o.targets;
    lo.seed = o.seed;
    lo.learner.learning_rate = o.lr;
    lo.learner.minibatch_size = std::max<uint32_t>(1, std::min<uint32_t>(o.batch, 8));
    auto learner = LoraLearner::create(lo);
    std::mt19937_64 rng(o.seed);
    std::vector<size_t> order(demos.size());
    size_t next = order.size();
    auto t0 = std::chrono::steady_clock::now();
    double first = 0, last = 0;
    for (uint32_t step = 0; step < o.steps; ++step) {
      std::vector<std::pair<std::string, std::string>> batch;
      while (batch.size() < std::min<size_t>(o.batch, demos.size())) {
        if (next == order.size()) {  // a new epoch in a new order
          for (size_t i = 0; i < order.size(); ++i) order[i] = i;
          std::shuffle(order.begin(), order.end(), rng);
          next = 0;
        }
        batch.push_back(demos[order[next++]]);
      }
      auto u = learner->sft_step(batch);
      if (step == 0) first = u.loss;
      last = u.loss;
      if (o.json)
        std::printf("%s\n",
                    dump({{"step", step}, {"loss", u.loss}, {"grad_norm", u.grad_norm}, {"tokens", u.tokens}}).c_str());
      else if (step == 0 || step + 1 == o.steps || (step + 1) % 10 == 0)
        std::fprintf(stderr, "step %u/%u: loss %.4f, grad norm %.3f\n", step + 1, o.steps, u.loss, u.grad_norm);
    }
    learner->save_checkpoint(o.out);
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::fprintf(stderr, "%u steps on %zu demonstrations in %.1f s: loss %.4f -> %.4f; adapter (PEFT) in %s\n", o.steps,
                 demos.size(), secs, first, last, o.out.c_str());
    return 0;
  } catch (const std::exception& e) {
    return fail("sft", e.what());
  }
}

namespace {
// The model options of generate, score, tokenize, merge and probe.
void model_options(CLI::App* sub, PolicyCliOptions& o, bool adapter = true) {
  sub->add_option("--model", o.model, "a Hugging Face model directory")->type_name("DIR");
  if (adapter) sub->add_option("--adapter", o.adapter, "a PEFT LoRA adapter directory")->type_name("DIR");
  sub->add_option("--device", o.device, "cpu or cuda:N (default cpu)");
  sub->add_option("--dtype", o.dtype, "f32, f16 or bf16 (default: f32 on the CPU, bf16 on CUDA)")
      ->check(CLI::IsMember({"f32", "f16", "bf16"}));
}

bool read_text(const std::string& path, std::string& into) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  into.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  return true;
}

// --prompt and --prompt-file in the order given; --completion or --completion-file.
int read_texts(const std::string& cmd, CLI::App* sub, PolicyCliOptions& o, const std::vector<std::string>& prompts,
               const std::vector<std::string>& prompt_files, const std::string& completion_file) {
  size_t p = 0, f = 0;
  for (const CLI::Option* opt : sub->parse_order()) {
    if (opt->get_name() == "--prompt") {
      o.prompts.push_back(prompts[p++]);
    } else if (opt->get_name() == "--prompt-file") {
      std::string t;
      if (!read_text(prompt_files[f], t)) return cli::bad(cmd, "--prompt-file: cannot read " + prompt_files[f]);
      ++f;
      o.prompts.push_back(t);
    }
  }
  if (!completion_file.empty() && !read_text(completion_file, o.completion))
    return cli::bad(cmd, "--completion-file: cannot read " + completion_file);
  return 0;
}

// generate, score, tokenize and merge: their options, their checks and their command.
void add_policy_command(CLI::App& app, cli::Action& action, const std::string& name, const std::string& synopsis) {
  struct Texts {
    PolicyCliOptions o;
    std::vector<std::string> prompts, prompt_files;
    std::string completion_file;
    bool has_completion = false;
  };
  auto x = std::make_shared<Texts>();
  auto* sub = cli::subcommand(app, name, synopsis);
  model_options(sub, x->o);
  sub->add_flag("--json", x->o.json, "one JSON object");
  if (name == "merge") {
    sub->add_option("--out", x->o.out, "the merged checkpoint's directory (new or empty)")
        ->required()
        ->type_name("DIR");
    sub->add_flag("--force", x->o.force, "replace the files --out already holds");
  } else {
    sub->add_option("--prompt", x->prompts, "a prompt (generate: one or more)")->type_name("TEXT");
    sub->add_option("--prompt-file", x->prompt_files, "a prompt read from a file")->type_name("FILE");
  }
  CLI::Option* completion = nullptr;
  if (name == "score") {
    completion = sub->add_option("--completion", x->o.completion, "the completion to score")->type_name("TEXT");
    sub->add_option("--completion-file", x->completion_file, "the completion read from a file")->type_name("FILE");
  }
  if (name == "generate" || name == "score")
    sub->add_option("--temperature", x->o.temperature, "sampling temperature (default 1)")->check(cli::number());
  if (name == "generate") {
    sub->add_option("--top-p", x->o.top_p, "nucleus sampling (default 1)")->check(cli::number());
    sub->add_option("--max-tokens", x->o.max_tokens, "new tokens at most (default 256)")->check(cli::count(1, 1 << 20));
    sub->add_option("--n", x->o.n, "completions per prompt")->check(cli::count(1, 1 << 16));
    sub->add_option("--seed", x->o.seed, "the sampling seed");
    sub->add_option("--max-rows", x->o.max_rows, "--model: sequences decoded at once (default all)")
        ->check(cli::count(1, 1 << 20));
    sub->add_option("--stop", x->o.stop, "a stop string (repeatable)")->type_name("STR");
    sub->add_option("--server", x->o.server, "an OpenAI-compatible server instead of --model")->type_name("URL");
    sub->add_option("--served-model", x->o.served_model, "--server: the served model's name")->type_name("NAME");
    sub->add_option("--timeout", x->o.timeout_s, "--server: seconds per HTTP exchange")->check(CLI::PositiveNumber);
    sub->add_option("--retries", x->o.retries, "--server: extra attempts after 5xx, 429 and timeouts")
        ->check(cli::count(0, 100));
  }
  sub->callback([&action, sub, name, x, completion] {
    x->has_completion = (completion && completion->count() > 0) || !x->completion_file.empty();
    action = [sub, name, x] {
      auto& o = x->o;
      if (int rc = read_texts(name, sub, o, x->prompts, x->prompt_files, x->completion_file)) return rc;
      if (name == "generate" && !o.server.empty()) {
        if (o.served_model.empty()) return cli::bad(name, "--server needs --served-model NAME");
        if (o.max_rows) return cli::bad(name, "--max-rows is for --model (the server batches its own way)");
      } else if (o.model.empty()) {
        return cli::bad(name, "--model DIR is required");
      }
      if (name == "merge") {
        if (o.adapter.empty()) return cli::bad(name, "--adapter DIR is required");
        namespace fs = std::filesystem;
        std::error_code ec;
        for (auto* given : {&o.model, &o.adapter})
          if (fs::exists(o.out, ec) && fs::equivalent(o.out, *given, ec))
            return cli::bad(name, "--out " + o.out + " is the " + (given == &o.model ? "--model" : "--adapter") +
                                      " folder: give the merged checkpoint a folder of its own");
        if (fs::is_directory(o.out, ec) && !fs::is_empty(o.out, ec) && !o.force)
          return cli::bad(
              name, "--out " + o.out + " already holds files; give a new or empty folder, or --force to replace them");
        if (fs::exists(o.out, ec) && !fs::is_directory(o.out, ec))
          return cli::bad(name, "--out " + o.out + " is a file, not a folder");
        return cmd_merge(o);
      }
      if (o.prompts.empty()) return cli::bad(name, "--prompt TEXT is required");
      if (name != "generate" && o.prompts.size() != 1) return cli::bad(name, "exactly one --prompt");
      if (name == "generate") {
        if (o.temperature < 0) return cli::bad(name, "--temperature must be >= 0");
        if (o.top_p <= 0 || o.top_p > 1) return cli::bad(name, "--top-p must be in (0, 1]");
        return cmd_generate(o);
      }
      if (name == "score") {
        if (!x->has_completion) return cli::bad(name, "--completion TEXT is required");
        if (o.temperature <= 0) return cli::bad(name, "--temperature must be > 0");
        return cmd_score(o);
      }
      return cmd_tokenize(o);
    };
  });
}
}  // namespace

void add_policy(CLI::App& app, cli::Action& action) {
  add_policy_command(
      app, action, "generate",
      "launch generate --model DIR [--adapter DIR] --prompt TEXT [--prompt TEXT ...] [--max-tokens N]\n"
      "                [--temperature T] [--top-p P] [--n N] [--seed S] [--stop STR ...] [--max-rows R]\n"
      "                [--device cpu|cuda:N] [--dtype f32|f16|bf16] [--json]\n"
      "launch generate --server URL --served-model NAME [--timeout S] [--retries N] --prompt TEXT ...\n"
      "  sample completions with per-token logprobs (the built-in runtime, or an OpenAI-compatible\n"
      "  server); --prompt-file FILE reads a prompt from a file");
  add_policy_command(app, action, "score",
                     "launch score --model DIR [--adapter DIR] --prompt TEXT --completion TEXT [--temperature T]\n"
                     "             [--device D] [--dtype T] [--json]\n"
                     "  logprobs of a completion after a prompt (--prompt-file, --completion-file read files)");
  add_policy_command(app, action, "tokenize",
                     "launch tokenize --model DIR --prompt TEXT [--json]\n  token ids of a text");
  add_policy_command(app, action, "merge",
                     "launch merge --model DIR --adapter DIR --out DIR [--dtype T]\n"
                     "  fold a LoRA adapter into a plain checkpoint");

  auto probe = std::make_shared<ProbeOptions>();
  auto* p =
      cli::subcommand(app, "probe",
                      "launch probe RUN_DIR [--samples-from RUN_DIR] [--samples N] [--device D] [--dtype T] [--json]\n"
                      "  NLL of fixed samples under every checkpoint of a run");
  p->add_option("RUN_DIR", probe->run_dir, "a train run")->required()->type_name("");
  p->add_option("--samples-from", probe->samples_from,
                "another run of the same model whose samples are rescored (default: RUN_DIR's first step)")
      ->type_name("RUN_DIR");
  p->add_option("--samples", probe->samples, "the first N samples with tokens (default 16; 0: all)")
      ->check(cli::count(0, 1000000));
  p->add_option("--device", probe->device, "default: the run's [policy] device");
  p->add_option("--dtype", probe->dtype, "default: the run's [policy] dtype");
  p->add_flag("--json", probe->json, "one JSON object");
  p->callback([&action, probe] { action = [probe] { return cmd_probe(*probe); }; });

  auto sft = std::make_shared<SftOptions>();
  auto* s = cli::subcommand(
      app, "sft",
      "launch sft --model DIR --data FILE.jsonl --out DIR [--adapter DIR] [--steps N] [--batch B] [--lr X]\n"
      "           [--rank R] [--alpha A] [--targets q_proj,...] [--seed S] [--device D] [--dtype T] [--json]\n"
      "  LoRA SFT on prompt/completion lines (a warm start)");
  s->add_option("--model", sft->model, "a Hugging Face model directory")->required()->type_name("DIR");
  s->add_option("--data", sft->data, "prompt/completion JSON lines")->required()->type_name("FILE.jsonl");
  s->add_option("--out", sft->out, "the adapter's directory")->required()->type_name("DIR");
  s->add_option("--adapter", sft->adapter, "an adapter to start from")->type_name("DIR");
  s->add_option("--steps", sft->steps, "optimizer steps (default 100)")->check(cli::count(1, 10000000));
  s->add_option("--batch", sft->batch, "demonstrations per step (default 8)")->check(cli::count(1, 1 << 20));
  s->add_option("--lr", sft->lr, "learning rate in (0, 1) (default 1e-4)")
      ->check(CLI::Validator(
          [](std::string& v) {
            try {
              double x = std::stod(v);
              if (x > 0 && x < 1) return std::string();
            } catch (const std::exception&) {}
            return "must be in (0, 1), got \"" + v + "\"";
          },
          "X"));
  s->add_option("--rank", sft->rank, "LoRA rank (default 16)")->check(cli::count(1, 4096));
  s->add_option("--alpha", sft->alpha, "LoRA alpha (default 32)")->check(cli::number());
  s->add_option("--targets", sft->targets, "modules to adapt (default: every projection)")
      ->delimiter(',')
      ->type_name("q_proj,...");
  s->add_option("--seed", sft->seed, "adapter init and demonstration order");
  s->add_option("--device", sft->device, "cpu or cuda:N");
  s->add_option("--dtype", sft->dtype, "default: bf16 on CUDA, f32 on the CPU");
  s->add_flag("--json", sft->json, "one JSON object");
  s->callback([&action, sft] { action = [sft] { return cmd_sft(*sft); }; });
}

}  // namespace kernelrl
