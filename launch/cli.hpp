#pragma once
// The command line on CLI11. Each subcommand's file registers it with its own add_*() (its help,
// its options, its checks) and gives it an action; main() parses argv and runs the action of the
// subcommand that was named, or the run (launch CONFIG ...) when none was. Exit codes: 0 success,
// 1 failure, 2 bad input (arguments, config).

#include <CLI/CLI.hpp>

#include <functional>
#include <memory>
#include <string>

namespace kernelrl::cli {

// What a subcommand does once its arguments are parsed: the process exit code.
using Action = std::function<int()>;

// A subcommand `name` of `app` whose help starts with `synopsis` (its usage lines and what it
// does). Its callback sets the action main() runs.
CLI::App* subcommand(CLI::App& app, const std::string& name, const std::string& synopsis);

// Prints "launch: SUB: msg" and where to find the subcommand's arguments; returns 2.
int bad(const std::string& sub, const std::string& msg);

// Checks with the messages the README shows, on each item of a comma list too.
// An integer in [lo, hi]; `what` names it in the error ("" : "a count from LO to HI").
CLI::Validator count(long lo, long hi, const std::string& what = "");
CLI::Validator number(const std::string& what = "a number");  // a real number
CLI::Validator device_ids();                                  // an integer >= 0

}  // namespace kernelrl::cli

namespace kernelrl {

// The registrations, one per subcommand file; each sets `action` for its subcommands.
void add_run(CLI::App& app, cli::Action& action);      // launch CONFIG ... (run, resume, node, join)
void add_check(CLI::App& app, cli::Action& action);    // check, prompts, version
void add_analyze(CLI::App& app, cli::Action& action);  // analyze, report
void add_compare(CLI::App& app, cli::Action& action);
void add_export(CLI::App& app, cli::Action& action);
void add_confirm(CLI::App& app, cli::Action& action);  // confirm: decide unconfirmed verdicts
void add_serve(CLI::App& app, cli::Action& action);
void add_evaluate(CLI::App& app, cli::Action& action);
void add_policy(CLI::App& app, cli::Action& action);  // generate, score, tokenize, merge, sft, probe
void add_monitor(CLI::App& app, cli::Action& action);

}  // namespace kernelrl
