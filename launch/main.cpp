// launch: the kernelrl command line (CLI11). Each subcommand is registered by its own file
// (launch/cli.hpp lists them); `launch CONFIG ...` runs an experiment, a node or a join
// (launch/run.cpp). See README.md for every subcommand.
#include "launch/cli.hpp"
#include "launch/commands.hpp"

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

namespace {

const char* usage =
    "usage:\n"
    "  launch CONFIG [--run-dir DIR] [--log-level LEVEL]   run the experiment CONFIG describes (a cluster's head)\n"
    "  launch CONFIG --resume RUN_DIR [--log-level LEVEL]  continue a train run from its latest checkpoint\n"
    "  launch CONFIG --node NAME [--log-level LEVEL]       run node NAME of the cluster CONFIG describes\n"
    "  launch CONFIG --join [--name NAME] (--cpu-slots N | --gpus 0,1,...) [--log-level LEVEL]\n"
    "                                                      add this machine (not in CONFIG) to CONFIG's cluster\n"
    "  launch serve CONFIG [--port P] ...                  the evaluator as an HTTP/JSON service (POST /v1/evaluate)\n"
    "  launch monitor HOST:PORT ...                        watch a running cluster's telemetry\n"
    "  launch keygen PREFIX                                a CURVE key pair for [monitor] publish_key\n"
    "  launch check CONFIG [--set KEY=VALUE ...]           validate CONFIG, print it resolved\n"
    "  launch prompts CONFIG                               print each task's prompt (JSON lines)\n"
    "  launch export RUN_DIR --jsonl                       print every sample as one JSON line\n"
    "  launch confirm RUN_DIR [SAMPLE_ID...] [--reject]    decide unconfirmed speedups (none given: list them)\n"
    "  launch analyze RUN_DIR ...                          fast_p, pass@k / fast_1@k with CIs, per step and task\n"
    "  launch report RUN_DIR ...                           RUN_DIR/report.html: the analysis with plots, offline\n"
    "  launch probe RUN_DIR ...                            NLL of fixed samples under every checkpoint of a run\n"
    "  launch compare RUN_DIR RUN_DIR ...                  runs side by side; refused when their budgets differ\n"
    "  launch evaluate --task FILE --candidate FILE ...    evaluate candidates in one evaluator\n"
    "  launch generate --model DIR --prompt TEXT ...       sample completions with per-token logprobs\n"
    "  launch score --model DIR --prompt T --completion T  logprobs of a completion after a prompt\n"
    "  launch tokenize --model DIR --prompt TEXT           token ids of a text\n"
    "  launch merge --model DIR --adapter DIR --out DIR    fold a LoRA adapter into a plain checkpoint\n"
    "  launch sft --model DIR --data FILE.jsonl --out DIR  LoRA SFT on prompt/completion lines (a warm start)\n"
    "  launch version | --version                          versions of kernelrl and LibTorch\n"
    "  launch SUBCOMMAND --help                            one subcommand's arguments\n"
    "LEVEL: trace, debug, info, warn, error, off (default: [cluster] log_level)\n"
    "--set KEY=VALUE (launch CONFIG, check, prompts, serve; repeatable): override a key of CONFIG, e.g.\n"
    "  --set learner.learning_rate=2e-5 --set sampler.temperature=0.8";

}  // namespace

int main(int argc, char** argv) {
  using namespace kernelrl;
  CLI::App app{usage, "launch"};
  app.get_formatter()->column_width(30);
  bool version = false;
  app.add_flag("-V,--version", version, "versions of kernelrl and LibTorch");
  cli::Action action;
  add_run(app, action);
  add_check(app, action);
  add_export(app, action);
  add_confirm(app, action);
  add_analyze(app, action);
  add_compare(app, action);
  add_evaluate(app, action);
  add_policy(app, action);
  add_monitor(app, action);
  add_serve(app, action);
  if (argc < 2) {
    std::fprintf(stderr, "launch: missing CONFIG or subcommand\n%s\n", usage);
    return 2;
  }
  const std::string first = argv[1];
  // A run's own options may come before CONFIG (launch --log-level warn CONFIG).
  const bool run_option = app.get_option_no_throw(first.substr(0, first.find('='))) != nullptr;
  if (first.rfind("-", 0) == 0 && !run_option && first != "-h" && first != "--help") {
    std::fprintf(stderr, "launch: unknown option \"%s\" (expected CONFIG or a subcommand)\n%s\n", first.c_str(), usage);
    return 2;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    if (app.get_subcommands().empty()) {  // launch --help, launch CONFIG --help: the usage, once
      std::printf("%s\n", usage);
      return 0;
    }
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    // Named after the subcommand it concerns, when it concerns one.
    bool sub = false;
    for (const CLI::App* s : app.get_subcommands(std::function<bool(const CLI::App*)>{}))
      sub = sub || s->get_name() == first;
    return cli::bad(sub ? first : "", e.what());
  }
  if (version) return cmd_version();
  if (!action) return cli::bad("", "missing CONFIG or subcommand");
  // The last resort: whatever escapes a subcommand is reported, never a bare abort.
  std::set_terminate([] {
    std::string what = "see the log above";
    if (auto e = std::current_exception()) try {
        std::rethrow_exception(e);
      } catch (const std::exception& x) {
        what = x.what();
      } catch (...) {}
    std::fprintf(stderr, "launch: fatal: an unexpected error ended the process: %s\n", what.c_str());
    std::_Exit(1);
  });
  try {
    return action();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "launch: %s: unexpected error: %s\n", first.c_str(), e.what());
    return 1;
  }
}
