// Config validation: every kind of mistake is rejected with FILE:LINE:COLUMN: key.path: message.
#include "core/config.hpp"
#include "tasks/prompt.hpp"
#include "core/task_set.hpp"

#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>

using namespace kernelrl;
namespace fs = std::filesystem;

namespace {

// A scratch folder with a tasks/ dir and a replay file, so valid paths exist.
struct Scratch {
  fs::path dir;
  Scratch() {
    dir = fs::temp_directory_path() / ("kernelrl-config-test-" + std::to_string(::getpid()));
    fs::create_directories(dir / "tasks");
    std::ofstream(dir / "tasks" / "01_first.py") << "# task\n";
    std::ofstream(dir / "replay.jsonl") << "{}\n";
  }
  ~Scratch() { fs::remove_all(dir); }
  std::string cfg() const { return (dir / "test.toml").string(); }
};

const std::string base = "[tasks]\ndir = \"tasks\"\n[sampler]\nreplay = \"replay.jsonl\"\n";

std::vector<std::string> errors_of(const std::string& text, const std::string& path) {
  auto r = parse_config(text, path);
  std::vector<std::string> out;
  if (auto* errs = std::get_if<std::vector<ConfigError>>(&r))
    for (auto& e : *errs) out.push_back(e.format());
  return out;
}

}  // namespace

TEST_CASE("a minimal config is valid, with defaults filled and paths resolved", "[config]") {
  Scratch s;
  auto r = parse_config(base, s.cfg());
  REQUIRE(std::holds_alternative<Config>(r));
  const auto& c = std::get<Config>(r);
  CHECK(c.tasks.dir == (s.dir / "tasks").string());
  CHECK(c.sampler.replay == (s.dir / "replay.jsonl").string());
  CHECK(c.evaluator.correctness_trials == 5);
  CHECK(c.evaluator.atol_fp32 == Approx(1e-4));
  REQUIRE(c.nodes.size() == 1);
  CHECK(c.nodes[0].cpu_slots == 1);
  CHECK(c.resolved_toml.find("correctness_trials = 5") != std::string::npos);
}

TEST_CASE("an unknown key is rejected with its location", "[config]") {
  Scratch s;
  auto e = errors_of(base + "[evaluator]\ntimeout = 5\n", s.cfg());
  REQUIRE(e.size() == 1);
  CHECK(e[0] == s.cfg() + ":6:11: evaluator.timeout: unknown key (not part of the schema)");
}

TEST_CASE("a value of the wrong type is rejected with its location", "[config]") {
  Scratch s;
  auto e = errors_of(base + "[evaluator]\ntimeout_s = \"ten\"\n", s.cfg());
  REQUIRE(e.size() == 1);
  CHECK(e[0] == s.cfg() + ":6:13: evaluator.timeout_s: expected a number, got a string");
  e = errors_of(base + "[monitor]\nprogress = 1\n", s.cfg());
  REQUIRE(e.size() == 1);
  CHECK(e[0] == s.cfg() + ":6:12: monitor.progress: expected a boolean (true or false), got an integer");
  e = errors_of(base + "[evaluator]\nwarmup = 2.5\n", s.cfg());
  REQUIRE(e.size() == 1);
  CHECK(e[0] == s.cfg() + ":6:10: evaluator.warmup: expected an integer, got a float");
}

TEST_CASE("a value out of range is rejected with its location", "[config]") {
  Scratch s;
  auto e = errors_of(base + "[evaluator]\ncorrectness_trials = 0\n", s.cfg());
  REQUIRE(e.size() == 1);
  CHECK(e[0] == s.cfg() + ":6:22: evaluator.correctness_trials: expected an integer in [1, 1000], got 0");
  e = errors_of(base + "[evaluator]\ntimeout_s = -1.0\n", s.cfg());
  REQUIRE(e.size() == 1);
  CHECK(e[0] == s.cfg() + ":6:13: evaluator.timeout_s: expected a number in [0.1, 86400], got -1");
}

TEST_CASE("a choice outside the allowed set is rejected, listing the choices", "[config]") {
  Scratch s;
  auto e = errors_of(base + "[evaluator]\naction_space = \"diff\"\n", s.cfg());
  REQUIRE(e.size() == 1);
  CHECK(e[0] == s.cfg() + ":6:16: evaluator.action_space: expected one of forward_body, full_program, got \"diff\"");
}

TEST_CASE("a missing file or folder is rejected with its location", "[config]") {
  Scratch s;
  auto e = errors_of("[tasks]\ndir = \"no-such-dir\"\n[sampler]\nreplay = \"missing.jsonl\"\n", s.cfg());
  REQUIRE(e.size() == 2);
  CHECK(e[0] == s.cfg() + ":2:7: tasks.dir: no such file or directory: " + (s.dir / "no-such-dir").string());
  CHECK(e[1] == s.cfg() + ":4:10: sampler.replay: no such file or directory: " + (s.dir / "missing.jsonl").string());
  e = errors_of("[tasks]\ndir = \"replay.jsonl\"\n[sampler]\nreplay = \"replay.jsonl\"\n", s.cfg());
  REQUIRE(e.size() == 1);
  CHECK(e[0] == s.cfg() + ":2:7: tasks.dir: expected a directory, got a file: " + (s.dir / "replay.jsonl").string());
}

TEST_CASE("a task id without its task file is rejected with its location", "[config]") {
  Scratch s;
  std::ofstream(s.dir / "tasks" / "01_add.py") << "class Model: pass\n";
  auto e = errors_of(
      "[tasks]\ndir = \"tasks\"\nids = [\"01_add\", \"02_gone\"]\n"
      "[sampler]\nreplay = \"replay.jsonl\"\n",
      s.cfg());
  REQUIRE(e.size() == 1);
  CHECK(e[0] == s.cfg() + ":3:18: tasks.ids[1]: no task file 02_gone.py in " + (s.dir / "tasks").string());
}

TEST_CASE("tasks are chosen by stem, number range or named split; bad selectors are located", "[config][tasks]") {
  Scratch s;
  for (auto* f : {"02_b.py", "03_c.py", "10_j.py"}) std::ofstream(s.dir / "tasks" / f) << "# task\n";
  std::ofstream(s.dir / "splits.toml") << "[splits]\ntrain = [\"1-3\"]\neval = [\"10_j\"]\nbad = [\"40-41\"]\n";
  auto load = [&](const std::string& tasks_toml) {
    return parse_config("[tasks]\ndir = \"tasks\"\n" + tasks_toml + "[sampler]\nreplay = \"replay.jsonl\"\n", s.cfg());
  };
  auto ids_of = [](const Config& c) {
    TaskSet ts;
    std::string err;
    REQUIRE(ts.load(c.tasks, err));
    std::vector<std::string> ids;
    for (auto& t : ts.tasks()) ids.push_back(t.id);
    return ids;
  };
  auto r = load("ids = [\"2-3\", \"10_j\", \"3\"]\n");
  REQUIRE(std::holds_alternative<Config>(r));
  CHECK(ids_of(std::get<Config>(r)) == std::vector<std::string>{"02_b", "03_c", "10_j"});
  r = load("split = \"train\"\nsplit_file = \"splits.toml\"\n");
  REQUIRE(std::holds_alternative<Config>(r));
  CHECK(ids_of(std::get<Config>(r)) == std::vector<std::string>{"01_first", "02_b", "03_c"});

  auto e = errors_of("[tasks]\ndir = \"tasks\"\nids = [\"5-7\"]\n[sampler]\nreplay = \"replay.jsonl\"\n", s.cfg());
  REQUIRE(e.size() == 1);
  CHECK(e[0] == s.cfg() + ":3:8: tasks.ids[0]: no task numbered 5-7 in " + (s.dir / "tasks").string());
  e = errors_of(
      "[tasks]\ndir = \"tasks\"\nsplit = \"bad\"\nsplit_file = \"splits.toml\"\n"
      "[sampler]\nreplay = \"replay.jsonl\"\n",
      s.cfg());
  REQUIRE(e.size() == 1);
  CHECK(e[0] == s.cfg() + ":3:9: tasks.split: no task numbered 40-41 in " + (s.dir / "tasks").string());
  e = errors_of(
      "[tasks]\ndir = \"tasks\"\nsplit = \"nope\"\nsplit_file = \"splits.toml\"\n"
      "[sampler]\nreplay = \"replay.jsonl\"\n",
      s.cfg());
  REQUIRE(e.size() == 1);
  CHECK(e[0] == s.cfg() + ":3:9: tasks.split: " + (s.dir / "splits.toml").string() +
                    ": no split \"nope\" (expected [splits] nope = [ids...])");
  e = errors_of("[tasks]\ndir = \"tasks\"\nkernelbench_dir = \"tasks\"\n[sampler]\nreplay = \"replay.jsonl\"\n",
                s.cfg());
  REQUIRE(e.size() == 1);
  CHECK(e[0] == s.cfg() + ":2:7: tasks.dir: set dir or kernelbench_dir, not both");
}

TEST_CASE("a KernelBench checkout is used as it is, by level and problem number", "[config][tasks]") {
  Scratch s;
  auto level = s.dir / "kb" / "KernelBench" / "level2";
  fs::create_directories(level);
  for (auto* f : {"1_Conv2D_ReLU_BiasAdd.py", "2_ConvTranspose2d_BiasAdd.py", "12_Gemm_Multiply_LeakyReLU.py"})
    std::ofstream(level / f) << "# task\n";
  auto r = parse_config(
      "[tasks]\nkernelbench_dir = \"kb\"\nlevel = 2\nids = [\"2-12\"]\n"
      "[sampler]\nreplay = \"replay.jsonl\"\n",
      s.cfg());
  REQUIRE(std::holds_alternative<Config>(r));
  TaskSet ts;
  std::string err;
  REQUIRE(ts.load(std::get<Config>(r).tasks, err));
  REQUIRE(ts.size() == 2);
  CHECK(ts.tasks()[0].id == "2_ConvTranspose2d_BiasAdd");
  CHECK(ts.tasks()[1].id == "12_Gemm_Multiply_LeakyReLU");
  CHECK(ts.tasks()[1].path == (level / "12_Gemm_Multiply_LeakyReLU.py").string());
  auto e = errors_of("[tasks]\nkernelbench_dir = \"kb\"\nlevel = 3\n[sampler]\nreplay = \"replay.jsonl\"\n", s.cfg());
  REQUIRE(e.size() == 1);
  CHECK(e[0] == s.cfg() + ":3:9: tasks.level: no level folder " + (s.dir / "kb" / "KernelBench" / "level3").string() +
                    " (a KernelBench checkout) or " + (s.dir / "kb" / "level3").string() + " (its KernelBench folder)");
  // A kernelbench_dir that does not exist: one error, at its own key.
  e = errors_of("[tasks]\nkernelbench_dir = \"nowhere\"\nlevel = 1\n[sampler]\nreplay = \"replay.jsonl\"\n", s.cfg());
  REQUIRE(e.size() == 1);
  CHECK(e[0].find("tasks.kernelbench_dir: no such file or directory") != std::string::npos);
}

TEST_CASE("a missing required key is reported at its table", "[config]") {
  Scratch s;
  auto e = errors_of("[sampler]\nreplay = \"replay.jsonl\"\n", s.cfg());
  REQUIRE(e.size() == 1);
  CHECK(e[0] == s.cfg() + ":1:1: tasks.dir: missing required key (or kernelbench_dir)");
}

TEST_CASE("unknown sections, bad [[node]] entries and syntax errors are rejected", "[config]") {
  Scratch s;
  auto e = errors_of(base + "[evaluater]\nmode = \"fast\"\n", s.cfg());
  REQUIRE(e.size() == 1);
  CHECK(e[0].rfind(s.cfg() + ":5:1: evaluater: unknown section", 0) == 0);

  e = errors_of(base +
                    "[[node]]\nname = \"a\"\nroles = [\"supervisor\", \"sampler\", \"evaluater\"]\n"
                    "cpu_slots = 1\n[[node]]\nname = \"a\"\nroles = [\"evaluator\"]\n",
                s.cfg());
  REQUIRE(e.size() == 3);
  CHECK(e[0] == s.cfg() +
                    ":7:35: node[0].roles[2]: expected one of supervisor, learner, sampler, "
                    "evaluator, monitor, got \"evaluater\"");
  CHECK(e[1] == s.cfg() + ":10:8: node[1].name: duplicate node name \"a\"");
  CHECK(e[2] ==
        s.cfg() +
            ":9:1: node[1].cpu_slots: an evaluator node needs cpu_slots > 0, a non-empty gpus or gpus = \"auto\"");

  e = errors_of(base + "[[node]]\nname = \"solo\"\nroles = [\"evaluator\"]\ncpu_slots = 1\n", s.cfg());
  REQUIRE(e.size() == 2);
  CHECK(e[0] == s.cfg() + ":1:1: node: no node has the role \"supervisor\"");
  CHECK(e[1] == s.cfg() + ":1:1: node: no node has the role \"sampler\"");

  e = errors_of("[tasks\ndir = 1\n", s.cfg());
  REQUIRE(e.size() == 1);
  CHECK(e[0].rfind(s.cfg() + ":1:", 0) == 0);
  CHECK(e[0].find("(syntax)") != std::string::npos);
}

TEST_CASE("every problem in a file is reported, not just the first", "[config]") {
  Scratch s;
  auto e = errors_of(base + "[evaluator]\nwarmup = -1\nmode = \"slow\"\nbogus = true\n", s.cfg());
  CHECK(e.size() == 3);
}

TEST_CASE("a config file that cannot be read is an error naming it", "[config]") {
  auto r = load_config("/no/such/config.toml");
  REQUIRE(std::holds_alternative<std::vector<ConfigError>>(r));
  CHECK(std::get<std::vector<ConfigError>>(r)[0].format() == "/no/such/config.toml: (file): cannot open config file");
}

TEST_CASE("the evaluator backend and the telemetry endpoint are checked", "[config]") {
  Scratch s;
  auto e = errors_of(base +
                         "[evaluator]\nbackend = \"fake\"\nsynthetic_latency_ms = -1\n"
                         "[monitor]\npublish = \"localhost:5555\"\n",
                     s.cfg());
  REQUIRE(e.size() == 3);
  CHECK(e[0] == s.cfg() + ":6:11: evaluator.backend: expected one of worker, synthetic, got \"fake\"");
  CHECK(e[1].rfind(s.cfg() + ":7:24: evaluator.synthetic_latency_ms:", 0) == 0);
  CHECK(e[2] ==
        s.cfg() + ":9:11: monitor.publish: expected \"tcp://HOST:PORT\" or \"ipc://PATH\", got \"localhost:5555\"");
  auto ok = parse_config(base +
                             "[evaluator]\nbackend = \"synthetic\"\nsynthetic_latency_ms = 5\n"
                             "[monitor]\npublish = \"tcp://127.0.0.1:47312\"\n",
                         s.cfg());
  REQUIRE(std::holds_alternative<Config>(ok));
  CHECK(std::get<Config>(ok).evaluator.backend == "synthetic");
  CHECK(std::get<Config>(ok).monitor.publish == "tcp://127.0.0.1:47312");
}

TEST_CASE("the learner's keys and the train mode are checked", "[config][learner]") {
  Scratch s;
  auto e =
      errors_of(base +
                    "[learner]\ngroup_size = 1\nlr_schedule = \"step\"\nlora_targets = [\"qkv\"]\n"
                    "aggregation = \"sum\"\ndtype = \"f8\"\nmismatch = \"tokens\"\n[experiment]\nmode = \"train\"\n",
                s.cfg());
  auto has = [&](const std::string& prefix) {
    for (auto& x : e)
      if (x.find(prefix) != std::string::npos) return true;
    return false;
  };
  INFO(e.size());
  CHECK(has("learner.group_size:"));
  CHECK(has("learner.lr_schedule: expected one of constant, linear, cosine, got \"step\""));
  CHECK(has("learner.lora_targets: \"qkv\" is not one of q_proj"));
  CHECK(has("learner.aggregation:"));
  CHECK(has("learner.dtype: expected f32, f16 or bf16"));
  CHECK(has("learner.mismatch: expected one of off, token, sequence, got \"tokens\""));
  // train with the replay sampler and no model: both named
  CHECK(has("experiment.mode: train needs a model sampler"));
  CHECK(has("experiment.mode: train needs [policy] model"));
  fs::create_directories(s.dir / "model");
  auto ok = parse_config(
      "[tasks]\ndir = \"tasks\"\n[policy]\nmodel = \"model\"\ndevice = \"cuda:1\"\n"
      "[sampler]\nbackend = \"libtorch\"\n[learner]\nsteps = 3\nmax_staleness = 1\n"
      "[experiment]\nmode = \"train\"\n",
      s.cfg());
  REQUIRE(std::holds_alternative<Config>(ok));
  auto& c = std::get<Config>(ok);
  CHECK(c.learner.steps == 3);
  CHECK(c.learner.max_staleness == 1);
  CHECK(c.learner.device == "cuda:1");  // defaults to the policy's device
  CHECK(c.learner.dtype == "bf16");
  // best_of_n: k samples per task
  auto bon = parse_config(base + "[experiment]\nmode = \"best_of_n\"\nk = 6\n", s.cfg());
  REQUIRE(std::holds_alternative<Config>(bon));
  CHECK(std::get<Config>(bon).sampler.samples_per_task == 6);
  auto e2 = errors_of(base + "[experiment]\nmode = \"best_of_n\"\n", s.cfg());
  REQUIRE(e2.size() == 1);
  CHECK(e2[0].find("experiment.mode: best_of_n needs k = K") != std::string::npos);
  auto top = parse_config(base + "[experiment]\nmode = \"best_of_n\"\nk = 6\nevaluate_top_m = 2\n", s.cfg());
  REQUIRE(std::holds_alternative<Config>(top));
  CHECK(std::get<Config>(top).experiment.evaluate_top_m == 2);
  auto e4 = errors_of(base + "[experiment]\nmode = \"best_of_n\"\nk = 6\nevaluate_top_m = 6\n", s.cfg());
  REQUIRE(e4.size() == 1);
  CHECK(e4[0].find("experiment.evaluate_top_m: evaluate_top_m = 6 leaves nothing out of k = 6") != std::string::npos);
  auto e5 = errors_of(base + "[experiment]\nevaluate_top_m = 2\n", s.cfg());
  REQUIRE(e5.size() == 1);
  CHECK(e5[0].find("experiment.evaluate_top_m: evaluate_top_m is for mode = \"best_of_n\"") != std::string::npos);
  auto e3 = errors_of(base + "[experiment]\nk = 4\n", s.cfg());
  REQUIRE(e3.size() == 1);
  CHECK(e3[0].find("experiment.k: k is for mode = \"best_of_n\"") != std::string::npos);
  // early stopping's rule: a choice, and consecutive regressions need a patience
  auto e6 = errors_of(base + "[experiment]\nearly_stop = \"regressions\"\n", s.cfg());
  REQUIRE(e6.size() == 1);
  CHECK(e6[0].find("experiment.early_stop: early_stop = \"regressions\" needs patience = P >= 1") != std::string::npos);
  auto e7 = errors_of(base + "[experiment]\nearly_stop = \"plateau\"\n", s.cfg());
  REQUIRE(e7.size() == 1);
  CHECK(e7[0].find("experiment.early_stop: expected one of no_better, regressions, got \"plateau\"") !=
        std::string::npos);
}

TEST_CASE("gpus = \"auto\" and device = \"auto\" are kept for the node's process to resolve", "[config]") {
  Scratch s;
  auto ok =
      parse_config(base +
                       "[[node]]\nname = \"a\"\nroles = [\"supervisor\", \"sampler\", \"evaluator\"]\ngpus = \"auto\"\n"
                       "[policy]\ndevice = \"auto\"\n",
                   s.cfg());
  REQUIRE(std::holds_alternative<Config>(ok));
  auto& c = std::get<Config>(ok);
  CHECK(c.nodes[0].gpus_auto);
  CHECK(c.nodes[0].gpus.empty());
  CHECK(c.policy.device == "auto");
  CHECK(c.learner.device == "auto");  // follows the policy's
  CHECK(c.resolved_toml.find("gpus = 'auto'") != std::string::npos);
  auto e =
      errors_of(base + "[[node]]\nname = \"a\"\nroles = [\"supervisor\", \"evaluator\"]\ngpus = \"all\"\n", s.cfg());
  bool named = false;
  for (auto& x : e)
    named = named ||
            x.find("node[0].gpus: expected an array of CUDA device ids or \"auto\", got \"all\"") != std::string::npos;
  CHECK(named);
}

TEST_CASE("a train run's held-out evaluation: its tasks, how often and how many samples", "[config][learner]") {
  Scratch s;
  fs::create_directories(s.dir / "model");
  std::ofstream(s.dir / "tasks" / "02_second.py") << "# task\n";
  std::ofstream(s.dir / "splits.toml") << "[splits]\ntrain = [\"1\"]\nheld = [\"02_second\"]\n";
  const std::string train =
      "[tasks]\ndir = \"tasks\"\nids = [\"1\"]\n[policy]\nmodel = \"model\"\n[sampler]\n"
      "backend = \"libtorch\"\n[experiment]\nmode = \"train\"\n";
  auto ok = parse_config(train + "eval_ids = [\"2\"]\neval_every = 5\neval_samples = 4\n", s.cfg());
  REQUIRE(std::holds_alternative<Config>(ok));
  auto& c = std::get<Config>(ok);
  CHECK(c.experiment.evaluates());
  CHECK(c.experiment.eval_tasks.ids == std::vector<std::string>{"2"});
  CHECK(c.experiment.eval_every == 5);
  CHECK(c.experiment.eval_samples == 4);
  // A named split of [tasks] split_file.
  auto split = parse_config(
      "[tasks]\ndir = \"tasks\"\nsplit = \"train\"\nsplit_file = \"splits.toml\"\n[policy]\n"
      "model = \"model\"\n[sampler]\nbackend = \"libtorch\"\n[experiment]\nmode = \"train\"\n"
      "eval_split = \"held\"\n",
      s.cfg());
  REQUIRE(std::holds_alternative<Config>(split));
  CHECK(std::get<Config>(split).experiment.eval_tasks.split == "held");
  CHECK_FALSE(std::get<Config>(parse_config(train, s.cfg())).experiment.evaluates());
  auto has = [](const std::vector<std::string>& errs, const std::string& text) {
    for (auto& e : errs)
      if (e.find(text) != std::string::npos) return true;
    return false;
  };
  auto e1 = errors_of(train + "eval_ids = [\"7\"]\n", s.cfg());
  REQUIRE(e1.size() == 1);
  CHECK(has(e1, "experiment.eval_ids:"));
  CHECK(has(e1, "7"));
  auto e2 = errors_of(train + "eval_every = 3\n", s.cfg());
  REQUIRE(e2.size() == 1);
  CHECK(has(e2, "experiment.eval_every: set eval_split or eval_ids"));
  auto e3 = errors_of(base + "[experiment]\nmode = \"eval\"\neval_ids = [\"1\"]\n", s.cfg());
  REQUIRE(e3.size() == 1);
  CHECK(has(e3, "experiment.eval_ids: periodic evaluation on held-out tasks is for mode = \"train\""));
  auto e4 = errors_of(train + "eval_ids = [\"2\"]\neval_split = \"held\"\n", s.cfg());
  REQUIRE(e4.size() == 1);
  CHECK(has(e4, "experiment.eval_ids: set eval_ids or eval_split, not both"));
  auto e5 = errors_of(
      "[tasks]\ndir = \"tasks\"\nsplit_file = \"splits.toml\"\n[policy]\nmodel = \"model\"\n[sampler]\n"
      "backend = \"libtorch\"\n[experiment]\nmode = \"train\"\neval_split = \"nope\"\n",
      s.cfg());
  REQUIRE(e5.size() == 1);
  CHECK(has(e5, "experiment.eval_split:"));
  CHECK(has(e5, "nope"));
}

TEST_CASE("sdpo mode, its [sdpo] table, the threshold reward and the entropy bonus are checked", "[config][learner]") {
  Scratch s;
  fs::create_directories(s.dir / "model");
  const std::string model =
      "[tasks]\ndir = \"tasks\"\n[policy]\nmodel = \"model\"\n[sampler]\nbackend = \"libtorch\"\n";
  auto ok = parse_config(model +
                             "[experiment]\nmode = \"sdpo\"\npatience = 2\n[sdpo]\ncontext = \"prompt\"\nbeta = 0.5\n"
                             "[reward]\nshape = \"threshold\"\nthreshold = 1.2\n[learner]\nentropy_coef = 0.01\n",
                         s.cfg());
  REQUIRE(std::holds_alternative<Config>(ok));
  auto& c = std::get<Config>(ok);
  CHECK(c.sdpo.context == "prompt");
  CHECK(c.sdpo.beta == 0.5);
  CHECK(c.sdpo.demonstration);
  CHECK(c.reward.threshold == 1.2);
  CHECK(c.learner.entropy_coef == 0.01);
  // The resolved config of an sdpo run keeps [sdpo]; another mode's leaves it out and re-reads cleanly.
  CHECK(c.resolved_toml.find("[sdpo]") != std::string::npos);
  auto plain = parse_config(model + "[experiment]\nmode = \"ttt\"\n", s.cfg());
  REQUIRE(std::holds_alternative<Config>(plain));
  CHECK(std::get<Config>(plain).resolved_toml.find("[sdpo]") == std::string::npos);
  CHECK(std::holds_alternative<Config>(parse_config(std::get<Config>(plain).resolved_toml, s.cfg())));

  auto e = errors_of(model + "[experiment]\nmode = \"ttt\"\n[sdpo]\ncontext = \"teacher\"\n", s.cfg());
  auto has = [&](const std::string& part) {
    for (auto& x : e)
      if (x.find(part) != std::string::npos) return true;
    return false;
  };
  CHECK(has("experiment.mode: [sdpo] is set but mode is \"ttt\""));
  CHECK(has("sdpo.context: expected one of feedback, prompt, got \"teacher\""));
  e = errors_of(model + "[experiment]\nmode = \"sdpo\"\n[sdpo]\ncontext = \"prompt\"\ndemonstration = false\n",
                s.cfg());
  REQUIRE(e.size() == 1);
  CHECK(has("sdpo.demonstration: context = \"prompt\" without a demonstration"));
  e = errors_of(base + "[experiment]\nmode = \"sdpo\"\n", s.cfg());
  CHECK(has("experiment.mode: sdpo needs a model sampler"));
  e = errors_of(base + "[reward]\nshape = \"sparse\"\n[learner]\nentropy_coef = -1\n", s.cfg());
  CHECK(has("reward.shape: expected one of speedup, log_speedup, none, threshold"));
  CHECK(has("learner.entropy_coef:"));
  e = errors_of(base + "[reward]\nmax_speedup = 0.5\n", s.cfg());
  REQUIRE(e.size() == 1);
  CHECK(has("reward.max_speedup: expected 0 (no cap) or a cap of at least 1, got 0.5"));
}

TEST_CASE("several samplers: urls for the openai backend, devices for libtorch, each checked", "[config]") {
  Scratch s;
  const std::string tasks = "[tasks]\ndir = \"tasks\"\n";
  auto e = errors_of(base + "urls = [\"http://a:8000\"]\ndevices = [\"cuda:0\"]\n", s.cfg());
  REQUIRE(e.size() == 2);
  CHECK(e[0] == s.cfg() + ":5:8: sampler.urls: only the openai backend takes server urls (this is the replay backend)");
  CHECK(e[1] ==
        s.cfg() + ":6:11: sampler.devices: only the libtorch backend takes devices (this is the replay backend)");
  e = errors_of(base + "bench_actions = \"replay.jsonl\"\n", s.cfg());
  REQUIRE(e.size() == 1);
  CHECK(e[0].find("sampler.bench_actions: bench_actions replaces a model's completions") != std::string::npos);
  e = errors_of(base + "bench_actions = \"missing.jsonl\"\n", s.cfg());
  REQUIRE(e.size() == 2);
  CHECK(e[0].find("sampler.bench_actions: no such file or directory") != std::string::npos);
  e = errors_of(tasks +
                    "[sampler]\nbackend = \"openai\"\nserved_model = \"m\"\nurl = \"http://a:8000\"\n"
                    "urls = [\"http://b:8000\", \"b:8001\"]\n",
                s.cfg());
  REQUIRE(e.size() == 2);
  CHECK(e[0] ==
        s.cfg() + ":7:8: sampler.urls: give either url (one server) or urls (one sampler per server), not both");
  CHECK(e[1] == s.cfg() +
                    ":7:8: sampler.urls: expected \"http://HOST:PORT[/PATH]\" or \"https://HOST[:PORT][/PATH]\", got "
                    "\"b:8001\"");
  auto ok = parse_config(tasks +
                             "[sampler]\nbackend = \"openai\"\nserved_model = \"m\"\n"
                             "urls = [\"http://a:8000\", \"http://b:8000\"]\n",
                         s.cfg());
  REQUIRE(std::holds_alternative<Config>(ok));
  CHECK(std::get<Config>(ok).sampler.urls == std::vector<std::string>{"http://a:8000", "http://b:8000"});
  fs::create_directories(s.dir / "model");
  e = errors_of(
      tasks + "[policy]\nmodel = \"model\"\n[sampler]\nbackend = \"libtorch\"\ndevices = [\"cpu\", \"gpu1\"]\n",
      s.cfg());
  REQUIRE(e.size() == 1);
  CHECK(e[0] ==
        s.cfg() + ":7:11: sampler.devices: expected \"cpu\", \"cuda\" or \"cuda:N\" for each sampler, got \"gpu1\"");
}

TEST_CASE("data-parallel learner ranks: every rank on the CPU or each on a GPU of its own", "[config]") {
  Scratch s;
  auto ok = parse_config(base + "[learner]\ndevices = [\"cuda:0\", \"cuda:1\"]\n", s.cfg());
  REQUIRE(std::holds_alternative<Config>(ok));
  CHECK(std::get<Config>(ok).learner.devices == std::vector<std::string>{"cuda:0", "cuda:1"});
  CHECK(std::get<Config>(ok).learner.device == "cuda:0");  // rank 0's
  auto e = errors_of(base + "[learner]\ndevice = \"cpu\"\ndevices = [\"cpu\", \"cpu\"]\n", s.cfg());
  REQUIRE(e.size() == 1);
  CHECK(e[0] == s.cfg() +
                    ":7:11: learner.devices: give either device (one learner) or devices (data-parallel ranks), "
                    "not both");
  e = errors_of(base + "[learner]\ndevices = [\"cuda:0\", \"cuda\", \"cuda:0\"]\n", s.cfg());
  REQUIRE(e.size() == 2);
  CHECK(e[0] == s.cfg() + ":6:11: learner.devices: expected \"cpu\" or \"cuda:N\" for each rank, got \"cuda\"");
  CHECK(e[1] == s.cfg() + ":6:11: learner.devices: cuda:0 is listed twice (NCCL takes one GPU a rank)");
  e = errors_of(base + "[learner]\ndevices = [\"cpu\", \"cuda:1\"]\n", s.cfg());
  REQUIRE(e.size() == 1);
  CHECK(e[0] == s.cfg() +
                    ":6:11: learner.devices: the ranks mix \"cpu\" and GPUs: expected every rank on \"cpu\" or "
                    "every rank on a GPU");
}

TEST_CASE("a sampler node's own devices or servers are checked, and the replay sampler stays on the head", "[config]") {
  Scratch s;
  const std::string tasks = "[tasks]\ndir = \"tasks\"\n";
  const std::string head =
      "[[node]]\nname = \"head\"\nport = 47000\nroles = [\"supervisor\", \"learner\", \"evaluator\"]\ncpu_slots = 1\n";
  fs::create_directories(s.dir / "model");
  const std::string libtorch = "[policy]\nmodel = \"model\"\n[sampler]\nbackend = \"libtorch\"\n";
  auto r = parse_config(tasks + libtorch + head +
                            "[[node]]\nname = \"gen\"\nroles = [\"sampler\"]\nsampler_devices = [\"cuda:0\", "
                            "\"cuda:1\"]\n",
                        s.cfg());
  REQUIRE(std::holds_alternative<Config>(r));
  CHECK(std::get<Config>(r).nodes[1].sampler_devices == std::vector<std::string>{"cuda:0", "cuda:1"});
  auto e = errors_of(tasks + libtorch + head +
                         "[[node]]\nname = \"gen\"\nroles = [\"sampler\"]\nsampler_devices = [\"gpu0\"]\n"
                         "[[node]]\nname = \"ev\"\nroles = [\"evaluator\"]\ncpu_slots = 1\nsampler_devices = "
                         "[\"cpu\"]\n"
                         "[[node]]\nname = \"web\"\nroles = [\"sampler\"]\nsampler_urls = [\"http://a:8000\"]\n",
                     s.cfg());
  REQUIRE(e.size() == 3);
  CHECK(e[0].find("node[1].sampler_devices: expected \"cpu\", \"cuda\" or \"cuda:N\" for each sampler, got \"gpu0\"") !=
        std::string::npos);
  CHECK(e[1].find("node[2].sampler_devices: only a node with the sampler role runs samplers") != std::string::npos);
  CHECK(e[2].find("node[3].sampler_urls: only the openai backend takes server urls (this is the libtorch backend)") !=
        std::string::npos);
  // Without ports every role runs in one process: a second node's samplers would be ignored.
  e = errors_of(tasks + libtorch +
                    "[[node]]\nname = \"head\"\nroles = [\"supervisor\", \"evaluator\"]\ncpu_slots = 1\n"
                    "[[node]]\nname = \"gen\"\nroles = [\"sampler\"]\nsampler_devices = [\"cpu\"]\n",
                s.cfg());
  REQUIRE(e.size() == 1);
  CHECK(e[0].find("node[1].sampler_devices: no [[node]] has a port") != std::string::npos);
  // Replay: its records are the run's actions, read on the head.
  e = errors_of(base + head + "[[node]]\nname = \"gen\"\nroles = [\"sampler\"]\n", s.cfg());
  REQUIRE(e.size() == 2);
  CHECK(e[0].find("node[0].roles: the replay sampler runs on the head: give this node") != std::string::npos);
  CHECK(e[1].find("node[1].roles: the replay sampler runs on the head only") != std::string::npos);
  // One node runs the learner: the head, or a node of its own.
  const std::string sampler_head =
      "[[node]]\nname = \"head\"\nport = 47000\nroles = [\"supervisor\", \"sampler\", \"evaluator\"]\n"
      "cpu_slots = 1\n";
  r = parse_config(tasks + libtorch + sampler_head + "[[node]]\nname = \"trainer\"\nroles = [\"learner\"]\n", s.cfg());
  REQUIRE(std::holds_alternative<Config>(r));
  e = errors_of(tasks + libtorch + head + "[[node]]\nname = \"trainer\"\nroles = [\"learner\", \"sampler\"]\n",
                s.cfg());
  REQUIRE(e.size() == 1);
  CHECK(e[0].find("node[1].roles: the learner role is on node \"head\" already: one node runs a run's learner") !=
        std::string::npos);
  // One node runs the monitor: the head, or a node of its own.
  r = parse_config(tasks + libtorch + sampler_head + "[[node]]\nname = \"watch\"\nroles = [\"monitor\"]\n", s.cfg());
  REQUIRE(std::holds_alternative<Config>(r));
  e = errors_of(tasks + libtorch + sampler_head +
                    "[[node]]\nname = \"watch\"\nroles = [\"monitor\"]\n[[node]]\nname = \"watch2\"\nroles = "
                    "[\"monitor\", \"evaluator\"]\ncpu_slots = 1\n",
                s.cfg());
  REQUIRE(e.size() == 1);
  CHECK(e[0].find("node[2].roles: the monitor role is on node \"watch\" already: one node runs a run's monitor") !=
        std::string::npos);
}

TEST_CASE("the prompt offers the kernel languages of [tasks] languages: CUDA by default, Triton on request",
          "[config][tasks]") {
  Scratch s;
  auto user = [&](const std::string& languages, const std::string& action_space) {
    auto r = parse_config("[tasks]\ndir = \"tasks\"\n" + languages + "[sampler]\nreplay = \"replay.jsonl\"\n", s.cfg());
    REQUIRE(std::holds_alternative<Config>(r));
    const auto& c = std::get<Config>(r);
    TaskSet ts;
    std::string err, out;
    REQUIRE(ts.load(c.tasks, err));
    REQUIRE(task_user_message(ts.tasks()[0], action_space, c.tasks.languages, out, err));
    return out;
  };
  auto cuda = user("", "forward_body");
  CHECK(cuda.find("load_inline") != std::string::npos);
  CHECK(cuda.find("Triton") == std::string::npos);
  auto both = user("languages = [\"cuda\", \"triton\"]\n", "forward_body");
  CHECK(both.find("load_inline") != std::string::npos);
  CHECK(both.find("Triton kernels (import triton and triton.language as tl; @triton.jit functions)") !=
        std::string::npos);
  CHECK(both.find("`# --- forward ---`") != std::string::npos);  // where module-level kernels go
  auto triton = user("languages = [\"triton\"]\n", "full_program");
  CHECK(triton.find("load_inline") == std::string::npos);
  CHECK(triton.find("Triton kernels") != std::string::npos);
  CHECK(triton.find("Keep get_inputs and get_init_inputs unchanged.") != std::string::npos);
  auto e =
      errors_of("[tasks]\ndir = \"tasks\"\nlanguages = [\"fortran\"]\n[sampler]\nreplay = \"replay.jsonl\"\n", s.cfg());
  REQUIRE(e.size() == 1);
  CHECK(e[0].find("tasks.languages") != std::string::npos);
  CHECK(e[0].find("fortran") != std::string::npos);
}

TEST_CASE("multi-turn settings: turns needs a model sampler, and neither sdpo nor evaluate_top_m", "[config][turns]") {
  Scratch s;
  const std::string model =
      "[tasks]\ndir = \"tasks\"\n[sampler]\nbackend = \"openai\"\nurl = \"http://127.0.0.1:1\"\nserved_model = \"m\"\n";
  auto ok = parse_config(model + "[experiment]\nmode = \"best_of_n\"\nk = 4\nturns = 3\n", s.cfg());
  REQUIRE(std::holds_alternative<Config>(ok));
  CHECK(std::get<Config>(ok).experiment.turns == 3);
  CHECK(std::get<Config>(ok).experiment.turn_prompt_tokens == 8192);
  auto replay = errors_of(base + "[experiment]\nturns = 2\n", s.cfg());
  REQUIRE(replay.size() == 1);
  CHECK(replay[0].find("experiment.turns: turns = 2 needs a model sampler") != std::string::npos);
  auto top = errors_of(model + "[experiment]\nmode = \"best_of_n\"\nk = 4\nturns = 2\nevaluate_top_m = 2\n", s.cfg());
  REQUIRE(top.size() == 1);
  CHECK(top[0].find("experiment.evaluate_top_m: evaluate_top_m leaves samples unevaluated") != std::string::npos);
  auto zero = errors_of(model + "[experiment]\nturns = 0\n", s.cfg());
  REQUIRE(zero.size() == 1);
  CHECK(zero[0].find("experiment.turns") != std::string::npos);
  auto trloo = parse_config(base + "[learner]\nalgorithm = \"trloo\"\nturn_gamma = 0.9\n", s.cfg());
  REQUIRE(std::holds_alternative<Config>(trloo));
  CHECK(std::get<Config>(trloo).learner.turn_gamma == 0.9);
  auto progress = parse_config(base + "[learner]\nturn_progress = 1.5\n", s.cfg());
  REQUIRE(std::holds_alternative<Config>(progress));
  CHECK(std::get<Config>(progress).learner.turn_progress == 1.5);
  auto negative = errors_of(base + "[learner]\nturn_progress = -1\n", s.cfg());
  REQUIRE(negative.size() == 1);
  CHECK(negative[0].find("learner.turn_progress") != std::string::npos);
  auto gamma = errors_of(base + "[learner]\nturn_gamma = 1.5\n", s.cfg());
  REQUIRE(gamma.size() == 1);
  CHECK(gamma[0].find("learner.turn_gamma") != std::string::npos);
  auto last = parse_config(base + "[learner]\nlearn_turns = \"last\"\n", s.cfg());
  REQUIRE(std::holds_alternative<Config>(last));
  CHECK(std::get<Config>(last).learner.learn_turns == "last");
  auto first = errors_of(base + "[learner]\nlearn_turns = \"first\"\n", s.cfg());
  REQUIRE(first.size() == 1);
  CHECK(first[0].find("learner.learn_turns") != std::string::npos);
}
