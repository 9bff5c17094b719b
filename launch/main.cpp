// launch: the kernelrl command line. See README.md for every subcommand.
#include "launch/cluster.hpp"
#include "launch/commands.hpp"

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

namespace {

const char* usage =
    "usage:\n"
    "  launch CONFIG [--run-dir DIR] [--log-level LEVEL]   run the experiment CONFIG describes (a cluster's head)\n"
    "  launch CONFIG --resume RUN_DIR [--log-level LEVEL]  continue a train run from its latest checkpoint\n"
    "  launch CONFIG --node NAME [--log-level LEVEL]       run node NAME of the cluster CONFIG describes\n"
    "  launch CONFIG --join [--name NAME] (--cpu-slots N | --gpus 0,1,...) [--log-level LEVEL]\n"
    "                                                      add this machine (not in CONFIG) to CONFIG's cluster\n"
    "  launch monitor HOST:PORT [--once] [--json] [--interval S] [--secret-file FILE] [--wait S]\n"
    "                                                      watch a running cluster's telemetry (its head's HOST:PORT)\n"
    "  launch check CONFIG                                 validate CONFIG, print it resolved\n"
    "  launch prompts CONFIG                               print each task's prompt (JSON lines)\n"
    "  launch export RUN_DIR --jsonl                       print every sample as one JSON line\n"
    "  launch analyze RUN_DIR [--json] [--p 1.0,1.2] [--k 1,2,4] [--bootstrap N] [--seed S] [--m M]\n"
    "                                                      fast_p, pass@k / fast_1@k with CIs, per step and task\n"
    "  launch report RUN_DIR [--out FILE] [--p ..] [--k ..] [--bootstrap N] [--seed S] [--m M]\n"
    "                                                      RUN_DIR/report.html: the analysis with plots, offline\n"
    "  launch probe RUN_DIR [--samples N] [--device D] [--dtype T] [--json]\n"
    "                                                      NLL of fixed samples under every checkpoint of a run\n"
    "  launch compare RUN_DIR RUN_DIR ... [--allow-mismatch] [--json]\n"
    "                                                      runs side by side; refused when their budgets differ\n"
    "  launch evaluate --task FILE --candidate FILE [--candidate FILE ...] [--task FILE --candidate FILE ...]\n"
    "                  [--action forward_body|full_program]\n"
    "                  [--device cpu|cuda:N] [--mode fast|full] [--timeout SECONDS] [--compile-workers N]\n"
    "                  [--seed S] [--config CONFIG] [--worker-log FILE] [--json]\n"
    "                                                      evaluate candidates in one evaluator\n"
    "  launch generate --model DIR [--adapter DIR] --prompt TEXT [--prompt TEXT ...] [--max-tokens N]\n"
    "                  [--temperature T] [--top-p P] [--n N] [--seed S] [--stop STR ...]\n"
    "                  [--device cpu|cuda:N] [--dtype f32|f16|bf16] [--json]\n"
    "  launch generate --server URL --served-model NAME [--timeout S] [--retries N] --prompt TEXT ...\n"
    "                                                      the same through an OpenAI-compatible server\n"
    "                                                      sample completions with per-token logprobs\n"
    "  launch score --model DIR [--adapter DIR] --prompt TEXT --completion TEXT [--temperature T]\n"
    "               [--device D] [--dtype T] [--json]      logprobs of a completion after a prompt\n"
    "  launch tokenize --model DIR --prompt TEXT [--json]  token ids of a text\n"
    "  launch merge --model DIR --adapter DIR --out DIR [--dtype T]\n"
    "                                                      fold a LoRA adapter into a plain checkpoint\n"
    "  launch sft --model DIR --data FILE.jsonl --out DIR [--adapter DIR] [--steps N] [--batch B] [--lr X]\n"
    "             [--rank R] [--alpha A] [--targets q_proj,...] [--seed S] [--device D] [--dtype T] [--json]\n"
    "                                                      LoRA SFT on prompt/completion lines (a warm start)\n"
    "  (--prompt-file / --completion-file FILE read the text from a file)\n"
    "  launch version | --version                          versions of kernelrl and LibTorch\n"
    "  launch SUBCOMMAND --help                            one subcommand's arguments\n"
    "LEVEL: trace, debug, info, warn, error, off (default: [cluster] log_level)\n";

int bad(const std::string& msg) {
  std::fprintf(stderr, "launch: %s\n%s", msg.c_str(), usage);
  return 2;
}

int parse_analyze(const std::string& cmd, const std::vector<std::string>& args) {
  kernelrl::AnalyzeOptions o;
  for (size_t i = 1; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--json" && cmd == "analyze")
      o.json = true;
    else if (a.rfind("--", 0) != 0 && o.run_dir.empty())
      o.run_dir = a;
    else if (i + 1 >= args.size())
      return bad(cmd + ": " + a + (a.rfind("--", 0) == 0 ? " needs a value" : ": unexpected"));
    else {
      const std::string& v = args[++i];
      try {
        auto list = [&](auto parse) {
          size_t pos = 0;
          while (pos <= v.size()) {
            size_t c = v.find(',', pos);
            std::string x = v.substr(pos, c == std::string::npos ? std::string::npos : c - pos);
            size_t used = 0;
            parse(x, used);
            if (used != x.size()) throw std::invalid_argument(x);
            if (c == std::string::npos) break;
            pos = c + 1;
          }
        };
        if (a == "--p") {
          o.p.clear();
          list([&](const std::string& x, size_t& used) { o.p.push_back(std::stod(x, &used)); });
        } else if (a == "--k") {
          list([&](const std::string& x, size_t& used) {
            long k = std::stol(x, &used);
            if (k < 1) throw std::invalid_argument(x);
            o.ks.push_back(uint32_t(k));
          });
        } else if (a == "--bootstrap") {
          size_t used = 0;
          long n = std::stol(v, &used);
          if (used != v.size() || n < 0 || n > 1000000) throw std::invalid_argument(v);
          o.bootstrap = uint32_t(n);
        } else if (a == "--out" && cmd == "report") {
          o.out = v;
        } else if (a == "--seed") {
          o.seed = std::stoull(v);
        } else if (a == "--m") {
          size_t used = 0;
          long n = std::stol(v, &used);
          if (used != v.size() || n < 1 || n > 1000000) throw std::invalid_argument(v);
          o.m = uint32_t(n);
        } else {
          return bad(cmd + ": unknown argument \"" + a + "\"");
        }
      } catch (const std::exception&) {
        return bad(cmd + ": " + a + ": expected " + (a == "--p" ? "numbers like 1.0,1.2" : "counts like 1,2,4") +
                   ", got \"" + v + "\"");
      }
    }
  }
  if (o.run_dir.empty()) return bad(cmd + ": RUN_DIR is required");
  if (cmd == "report") return kernelrl::cmd_report(o);
  return kernelrl::cmd_analyze(o);
}

int parse_probe(const std::string& cmd, const std::vector<std::string>& args) {
  kernelrl::ProbeOptions o;
  for (size_t i = 1; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--json")
      o.json = true;
    else if (a.rfind("--", 0) != 0 && o.run_dir.empty())
      o.run_dir = a;
    else if (i + 1 >= args.size())
      return bad("probe: " + a + (a.rfind("--", 0) == 0 ? " needs a value" : ": unexpected"));
    else {
      const std::string& v = args[++i];
      if (a == "--device")
        o.device = v;
      else if (a == "--dtype")
        o.dtype = v;
      else if (a == "--samples") {
        try {
          size_t used = 0;
          long n = std::stol(v, &used);
          if (used != v.size() || n < 1 || n > 100000) throw std::invalid_argument(v);
          o.samples = uint32_t(n);
        } catch (const std::exception&) {
          return bad("probe: --samples: expected a count from 1, got \"" + v + "\"");
        }
      } else
        return bad("probe: unknown argument \"" + a + "\"");
    }
  }
  if (o.run_dir.empty()) return bad("probe: RUN_DIR is required");
  return kernelrl::cmd_probe(o);
}

int parse_compare(const std::string& cmd, const std::vector<std::string>& args) {
  kernelrl::CompareOptions o;
  for (size_t i = 1; i < args.size(); ++i) {
    if (args[i] == "--allow-mismatch")
      o.allow_mismatch = true;
    else if (args[i] == "--json")
      o.json = true;
    else if (args[i].rfind("--", 0) == 0)
      return bad("compare: unknown argument \"" + args[i] + "\"");
    else
      o.run_dirs.push_back(args[i]);
  }
  if (o.run_dirs.size() < 2) return bad("compare: at least two RUN_DIRs");
  return kernelrl::cmd_compare(o);
}

int parse_export(const std::string& cmd, const std::vector<std::string>& args) {
  if (args.size() != 3 || args[2] != "--jsonl") return bad("usage: launch export RUN_DIR --jsonl");
  return kernelrl::cmd_export(args[1]);
}

int parse_evaluate(const std::string& cmd, const std::vector<std::string>& args) {
  kernelrl::EvaluateOptions o;
  // Each --candidate is evaluated against the --task before it (the first --task if none is).
  std::string task;
  size_t untasked = 0;
  for (size_t i = 1; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--json") {
      o.json = true;
      continue;
    }
    if (i + 1 >= args.size()) return bad("evaluate: " + a + " needs a value");
    const std::string& v = args[++i];
    try {
      if (a == "--task") {
        if (task.empty())
          for (size_t k = 0; k < untasked; ++k) o.candidates[k].task = v;
        task = v;
      } else if (a == "--candidate") {
        o.candidates.push_back({task, v});
        untasked += task.empty();
      } else if (a == "--action")
        o.action = v;
      else if (a == "--device")
        o.device = v;
      else if (a == "--mode")
        o.mode = v;
      else if (a == "--timeout")
        o.timeout_s = std::stod(v);
      else if (a == "--compile-workers")
        o.compile_workers = std::stoi(v);
      else if (a == "--seed")
        o.seed = std::stoull(v);
      else if (a == "--config")
        o.config = v;
      else if (a == "--worker-log")
        o.worker_log = v;
      else if (a == "--log-level")
        o.log_level = v;
      else
        return bad("evaluate: unknown argument \"" + a + "\"");
    } catch (const std::exception&) {
      return bad("evaluate: " + a + ": expected a number, got \"" + v + "\"");
    }
  }
  if (task.empty()) return bad("evaluate: --task FILE is required");
  if (o.candidates.empty()) return bad("evaluate: at least one --candidate FILE is required");
  return kernelrl::cmd_evaluate(o);
}

int parse_sft(const std::string& cmd, const std::vector<std::string>& args) {
  kernelrl::SftOptions o;
  for (size_t i = 1; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--json") {
      o.json = true;
      continue;
    }
    if (i + 1 >= args.size()) return bad("sft: " + a + " needs a value");
    const std::string& v = args[++i];
    try {
      auto count = [&](long lo, long hi) {
        size_t used = 0;
        long n = std::stol(v, &used);
        if (used != v.size() || n < lo || n > hi) throw std::invalid_argument(v);
        return static_cast<uint32_t>(n);
      };
      if (a == "--model")
        o.model = v;
      else if (a == "--adapter")
        o.adapter = v;
      else if (a == "--data")
        o.data = v;
      else if (a == "--out")
        o.out = v;
      else if (a == "--device")
        o.device = v;
      else if (a == "--dtype")
        o.dtype = v;
      else if (a == "--steps")
        o.steps = count(1, 10000000);
      else if (a == "--batch")
        o.batch = count(1, 1 << 20);
      else if (a == "--rank")
        o.rank = count(1, 4096);
      else if (a == "--lr")
        o.lr = std::stod(v);
      else if (a == "--alpha")
        o.alpha = std::stod(v);
      else if (a == "--seed")
        o.seed = std::stoull(v);
      else if (a == "--targets") {
        o.targets.clear();
        size_t pos = 0;
        while (pos <= v.size()) {
          size_t c = v.find(',', pos);
          o.targets.push_back(v.substr(pos, c == std::string::npos ? std::string::npos : c - pos));
          if (c == std::string::npos) break;
          pos = c + 1;
        }
      } else
        return bad("sft: unknown argument \"" + a + "\"");
    } catch (const std::exception&) {
      return bad("sft: " + a + ": expected a number in range, got \"" + v + "\"");
    }
  }
  if (o.model.empty() || o.data.empty() || o.out.empty())
    return bad("sft: --model DIR, --data FILE and --out DIR are required");
  if (!(o.lr > 0 && o.lr < 1)) return bad("sft: --lr must be in (0, 1)");
  return kernelrl::cmd_sft(o);
}

int parse_policy(const std::string& cmd, const std::vector<std::string>& args) {
  kernelrl::PolicyCliOptions o;
  bool has_completion = false;
  for (size_t i = 1; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--json") {
      o.json = true;
      continue;
    }
    if (i + 1 >= args.size()) return bad(cmd + ": " + a + " needs a value");
    const std::string& v = args[++i];
    auto read_file = [&](const std::string& f, std::string& into) {
      std::FILE* fp = std::fopen(f.c_str(), "rb");
      if (!fp) return false;
      char buf[65536];
      size_t n;
      into.clear();
      while ((n = std::fread(buf, 1, sizeof buf, fp)) > 0) into.append(buf, n);
      std::fclose(fp);
      return true;
    };
    try {
      if (a == "--model")
        o.model = v;
      else if (a == "--adapter")
        o.adapter = v;
      else if (a == "--device")
        o.device = v;
      else if (a == "--dtype")
        o.dtype = v;
      else if (a == "--out")
        o.out = v;
      else if (a == "--prompt")
        o.prompts.push_back(v);
      else if (a == "--prompt-file") {
        std::string t;
        if (!read_file(v, t)) return bad(cmd + ": --prompt-file: cannot read " + v);
        o.prompts.push_back(t);
      } else if (a == "--completion")
        o.completion = v, has_completion = true;
      else if (a == "--completion-file") {
        if (!read_file(v, o.completion)) return bad(cmd + ": --completion-file: cannot read " + v);
        has_completion = true;
      } else if (a == "--temperature")
        o.temperature = std::stod(v);
      else if (a == "--top-p")
        o.top_p = std::stod(v);
      else if (a == "--max-tokens")
        o.max_tokens = static_cast<uint32_t>(std::stoul(v));
      else if (a == "--n")
        o.n = static_cast<uint32_t>(std::stoul(v));
      else if (a == "--seed")
        o.seed = std::stoull(v);
      else if (a == "--stop")
        o.stop.push_back(v);
      else if (a == "--server")
        o.server = v;
      else if (a == "--served-model")
        o.served_model = v;
      else if (a == "--timeout")
        o.timeout_s = std::stod(v);
      else if (a == "--retries")
        o.retries = static_cast<uint32_t>(std::stoul(v));
      else
        return bad(cmd + ": unknown argument \"" + a + "\"");
    } catch (const std::exception&) {
      return bad(cmd + ": " + a + ": expected a number, got \"" + v + "\"");
    }
  }
  if (cmd == "generate" && !o.server.empty()) {
    if (o.served_model.empty()) return bad("generate: --server needs --served-model NAME");
  } else if (o.model.empty()) {
    return bad(cmd + ": --model DIR is required");
  }
  if (cmd == "merge") {
    if (o.adapter.empty() || o.out.empty()) return bad("merge: --adapter DIR and --out DIR are required");
    return kernelrl::cmd_merge(o);
  }
  if (o.prompts.empty()) return bad(cmd + ": --prompt TEXT is required");
  if (cmd != "generate" && o.prompts.size() != 1) return bad(cmd + ": exactly one --prompt");
  if (cmd == "generate") {
    if (o.temperature < 0) return bad("generate: --temperature must be >= 0");
    if (o.top_p <= 0 || o.top_p > 1) return bad("generate: --top-p must be in (0, 1]");
    if (o.n < 1) return bad("generate: --n must be at least 1");
    return kernelrl::cmd_generate(o);
  }
  if (cmd == "score") {
    if (!has_completion) return bad("score: --completion TEXT is required");
    if (o.temperature <= 0) return bad("score: --temperature must be > 0");
    return kernelrl::cmd_score(o);
  }
  return kernelrl::cmd_tokenize(o);
}

int parse_monitor(const std::string& cmd, const std::vector<std::string>& args) {
  kernelrl::MonitorOptions o;
  for (size_t i = 1; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--once")
      o.once = true;
    else if (a == "--json")
      o.json = true;
    else if (a.rfind("--", 0) != 0 && o.address.empty())
      o.address = a;
    else if (i + 1 >= args.size())
      return bad("monitor: " + a + (a.rfind("--", 0) == 0 ? " needs a value" : ": unexpected"));
    else {
      const std::string& v = args[++i];
      try {
        if (a == "--interval")
          o.interval_s = std::stod(v);
        else if (a == "--wait")
          o.wait_s = std::stod(v);
        else if (a == "--secret-file")
          o.secret_file = v;
        else if (a == "--log-level")
          o.log_level = v;
        else
          return bad("monitor: unknown argument \"" + a + "\"");
      } catch (const std::exception&) {
        return bad("monitor: " + a + ": expected a number, got \"" + v + "\"");
      }
      if (o.interval_s < 0.05) return bad("monitor: --interval: at least 0.05 seconds");
    }
  }
  if (o.address.empty()) return bad("monitor: the head's HOST:PORT is required");
  return kernelrl::cmd_monitor(o);
}

int parse_run(const std::string& cmd, const std::vector<std::string>& args) {
  std::string config = cmd, run_dir, level, node;
  bool join = false, resume = false;
  kernelrl::JoinOptions jo;
  for (size_t i = 1; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--join") {
      join = true;
    } else if ((a == "--run-dir" || a == "--resume" || a == "--log-level" || a == "--node" || a == "--name" ||
                a == "--cpu-slots" || a == "--gpus") &&
               i + 1 < args.size()) {
      const std::string& v = args[++i];
      if (a == "--run-dir" || a == "--resume") {
        if (!run_dir.empty()) return bad("give one of --run-dir and --resume, once");
        run_dir = v;
        resume = a == "--resume";
      } else if (a == "--node")
        node = v;
      else if (a == "--log-level")
        level = v;
      else if (a == "--name")
        jo.name = v;
      else {
        try {
          if (a == "--cpu-slots") {
            size_t used = 0;
            long n = std::stol(v, &used);
            if (used != v.size() || n < 1 || n > 1024) throw std::invalid_argument(v);
            jo.cpu_slots = static_cast<uint32_t>(n);
          } else {
            size_t pos = 0;
            while (pos <= v.size()) {
              size_t comma = v.find(',', pos);
              std::string id = v.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
              size_t used = 0;
              long g = std::stol(id, &used);
              if (used != id.size() || g < 0) throw std::invalid_argument(id);
              jo.gpus.push_back(g);
              if (comma == std::string::npos) break;
              pos = comma + 1;
            }
          }
        } catch (const std::exception&) {
          return bad(a + ": expected " + (a == "--gpus" ? "device ids like 0,1" : "a number from 1 to 1024") +
                     ", got \"" + v + "\"");
        }
      }
    } else {
      return bad("unknown argument \"" + a + "\"");
    }
  }
  bool join_args = !jo.name.empty() || jo.cpu_slots || !jo.gpus.empty();
  if (join_args && !join) return bad("--name, --cpu-slots and --gpus go with --join");
  if (join) {
    if (!node.empty()) return bad("--join adds a machine that is not in CONFIG; --node NAME starts one that is");
    if (!run_dir.empty()) return bad("--join: a node keeps no run directory (the head does)");
    return kernelrl::cmd_join(config, jo, level);
  }
  if (!node.empty()) {
    if (!run_dir.empty()) return bad("--node: a node keeps no run directory (the head does)");
    return kernelrl::cmd_node(config, node, level);
  }
  if (kernelrl::is_comparison_config(config)) {
    if (resume)
      return bad("--resume: a comparison goes on where it stopped with --run-dir DIR (finished arms are kept)");
    return kernelrl::cmd_run_comparison(config, run_dir, level);
  }
  return kernelrl::cmd_run(config, run_dir, level, resume);
}

int parse_check(const std::string& cmd, const std::vector<std::string>& args) {
  if (args.size() != 2) return bad("check takes exactly one CONFIG");
  return kernelrl::cmd_check(args[1]);
}

int parse_prompts(const std::string& cmd, const std::vector<std::string>& args) {
  if (args.size() != 2) return bad("prompts takes exactly one CONFIG");
  return kernelrl::cmd_prompts(args[1]);
}

int parse_version(const std::string& cmd, const std::vector<std::string>& args) {
  if (args.size() != 1) return bad("version takes no arguments");
  return kernelrl::cmd_version();
}

// The subcommands: each with its help (`launch NAME --help`) and its reader of arguments.
struct Command {
  const char* name;
  const char* help;
  int (*run)(const std::string& cmd, const std::vector<std::string>& args);
};

const Command commands[] = {
    {"check",
     "launch check CONFIG\n  validate CONFIG and print it resolved (every default filled in); exit 2 on an error,\n"
     "  each named FILE:LINE:COL\n",
     parse_check},
    {"prompts", "launch prompts CONFIG\n  print each task's prompt as the sampler renders it (JSON lines)\n",
     parse_prompts},
    {"export", "launch export RUN_DIR --jsonl\n  print every sample of a run's store as one JSON line\n", parse_export},
    {"analyze",
     "launch analyze RUN_DIR [--json] [--p 1.0,1.2] [--k 1,2,4] [--bootstrap N] [--seed S] [--m M]\n"
     "  fast_p, pass@k / fast_1@k with bootstrap intervals, per step and task, selection strategies\n",
     parse_analyze},
    {"report",
     "launch report RUN_DIR [--out FILE] [--p ..] [--k ..] [--bootstrap N] [--seed S] [--m M]\n"
     "  RUN_DIR/report.html (or FILE): the analysis with plots, readable offline\n",
     parse_analyze},
    {"probe",
     "launch probe RUN_DIR [--samples N] [--device D] [--dtype T] [--json]\n"
     "  NLL of fixed samples under every checkpoint of a run\n",
     parse_probe},
    {"compare",
     "launch compare RUN_DIR RUN_DIR ... [--allow-mismatch] [--json]\n"
     "  runs side by side; refused when their budgets differ (unless --allow-mismatch)\n",
     parse_compare},
    {"evaluate",
     "launch evaluate --task FILE --candidate FILE [--candidate FILE ...] [--task FILE --candidate FILE ...]\n"
     "                [--action forward_body|full_program] [--device cpu|cuda:N] [--mode fast|full]\n"
     "                [--timeout SECONDS] [--compile-workers N] [--seed S] [--config CONFIG]\n"
     "                [--worker-log FILE] [--log-level LEVEL] [--json]\n"
     "  evaluate candidates in one evaluator, each against the --task before it; one line each\n",
     parse_evaluate},
    {"generate",
     "launch generate --model DIR [--adapter DIR] --prompt TEXT [--prompt TEXT ...] [--max-tokens N]\n"
     "                [--temperature T] [--top-p P] [--n N] [--seed S] [--stop STR ...]\n"
     "                [--device cpu|cuda:N] [--dtype f32|f16|bf16] [--json]\n"
     "launch generate --server URL --served-model NAME [--timeout S] [--retries N] --prompt TEXT ...\n"
     "  sample completions with per-token logprobs (the built-in runtime, or an OpenAI-compatible\n"
     "  server); --prompt-file FILE reads a prompt from a file\n",
     parse_policy},
    {"score",
     "launch score --model DIR [--adapter DIR] --prompt TEXT --completion TEXT [--temperature T]\n"
     "             [--device D] [--dtype T] [--json]\n"
     "  logprobs of a completion after a prompt (--prompt-file, --completion-file read files)\n",
     parse_policy},
    {"tokenize", "launch tokenize --model DIR --prompt TEXT [--json]\n  token ids of a text\n", parse_policy},
    {"merge",
     "launch merge --model DIR --adapter DIR --out DIR [--dtype T]\n"
     "  fold a LoRA adapter into a plain checkpoint\n",
     parse_policy},
    {"sft",
     "launch sft --model DIR --data FILE.jsonl --out DIR [--adapter DIR] [--steps N] [--batch B] [--lr X]\n"
     "           [--rank R] [--alpha A] [--targets q_proj,...] [--seed S] [--device D] [--dtype T] [--json]\n"
     "  LoRA SFT on prompt/completion lines (a warm start)\n",
     parse_sft},
    {"monitor",
     "launch monitor HOST:PORT [--once] [--json] [--interval S] [--secret-file FILE] [--wait S]\n"
     "  watch a running cluster's telemetry (its head's HOST:PORT)\n",
     parse_monitor},
    {"version", "launch version (or launch --version)\n  versions of kernelrl and LibTorch\n", parse_version},
};

const char* run_help =
    "launch CONFIG [--run-dir DIR] [--log-level LEVEL]\n"
    "  run the experiment CONFIG describes, as its cluster's head (a comparison config runs each arm)\n"
    "launch CONFIG --resume RUN_DIR [--log-level LEVEL]\n"
    "  continue a train run from its latest checkpoint\n"
    "launch CONFIG --node NAME [--log-level LEVEL]\n"
    "  run node NAME of the cluster CONFIG describes\n"
    "launch CONFIG --join [--name NAME] (--cpu-slots N | --gpus 0,1,...) [--log-level LEVEL]\n"
    "  add this machine (not in CONFIG) to CONFIG's cluster\n"
    "LEVEL: trace, debug, info, warn, error, off (default: [cluster] log_level)\n";

bool wants_help(const std::vector<std::string>& args) {
  for (size_t i = 1; i < args.size(); ++i)
    if (args[i] == "--help" || args[i] == "-h") return true;
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty()) return bad("missing CONFIG or subcommand");
  const std::string& cmd = args[0];
  if (cmd == "-h" || cmd == "--help" || cmd == "help") {
    std::fputs(usage, stdout);
    return 0;
  }
  if (cmd == "--version" || cmd == "-V") return kernelrl::cmd_version();
  for (const Command& c : commands) {
    if (cmd != c.name) continue;
    if (wants_help(args)) {
      std::fputs(c.help, stdout);
      return 0;
    }
    return c.run(cmd, args);
  }
  if (cmd.rfind("-", 0) == 0) return bad("unknown option \"" + cmd + "\" (expected CONFIG or a subcommand)");
  if (wants_help(args)) {
    std::fputs(run_help, stdout);
    return 0;
  }
  return parse_run(cmd, args);
}
