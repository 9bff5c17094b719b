#include "launch/cli.hpp"

#include <cstdio>

namespace kernelrl::cli {

CLI::App* subcommand(CLI::App& app, const std::string& name, const std::string& synopsis) {
  return app.add_subcommand(name, synopsis);
}

int bad(const std::string& sub, const std::string& msg) {
  std::fprintf(stderr, "launch: %s%s%s\n(launch %s--help lists the arguments)\n", sub.c_str(), sub.empty() ? "" : ": ",
               msg.c_str(), sub.empty() ? "" : (sub + " ").c_str());
  return 2;
}

namespace {
bool integer(const std::string& s, long lo, long hi) {
  try {
    size_t used = 0;
    long n = std::stol(s, &used);
    return used == s.size() && n >= lo && n <= hi;
  } catch (const std::exception&) {
    return false;
  }
}
}  // namespace

CLI::Validator count(long lo, long hi, const std::string& what) {
  const std::string expected = what.empty() ? "a count from " + std::to_string(lo) + " to " + std::to_string(hi) : what;
  return CLI::Validator(
      [lo, hi, expected](std::string& s) {
        return integer(s, lo, hi) ? std::string() : "expected " + expected + ", got \"" + s + "\"";
      },
      "COUNT");
}

CLI::Validator number(const std::string& what) {
  return CLI::Validator(
      [what](std::string& s) {
        try {
          size_t used = 0;
          std::stod(s, &used);
          if (used == s.size()) return std::string();
        } catch (const std::exception&) {}
        return "expected " + what + ", got \"" + s + "\"";
      },
      "NUMBER");
}

CLI::Validator device_ids() {
  return CLI::Validator(
      [](std::string& s) {
        return integer(s, 0, 1 << 20) ? std::string() : "expected device ids like 0,1, got \"" + s + "\"";
      },
      "ID");
}

}  // namespace kernelrl::cli
