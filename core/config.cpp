#include "core/config.hpp"
#include "core/auth.hpp"
#include "core/curve.hpp"
#include "core/tls.hpp"
#include "core/config_toml.hpp"
#include "core/paths.hpp"

#include "core/task_set.hpp"

#include <fmt/format.h>
#include <toml++/toml.h>

#include <cctype>
#include <cstdlib>
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <set>
#include <sstream>

namespace fs = std::filesystem;

namespace kernelrl {

bool parse_host_port(const std::string& s, std::string& host, uint16_t& port) {
  auto colon = s.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 >= s.size() || s.size() - colon - 1 > 5) return false;
  for (size_t i = colon + 1; i < s.size(); ++i)
    if (!std::isdigit(static_cast<unsigned char>(s[i]))) return false;
  unsigned long p = std::stoul(s.substr(colon + 1));
  if (p > 65535) return false;
  host = s.substr(0, colon);
  port = static_cast<uint16_t>(p);
  return true;
}

std::string TasksConfig::folder() const {
  if (kernelbench_dir.empty()) return dir;
  fs::path kb(kernelbench_dir);
  std::string level_dir = "level" + std::to_string(level);
  std::error_code ec;
  if (fs::is_directory(kb / "KernelBench" / level_dir, ec)) return (kb / "KernelBench" / level_dir).string();
  return (kb / level_dir).string();
}

std::string ConfigError::format() const {
  std::ostringstream os;
  os << file;
  if (line > 0) os << ":" << line << ":" << column;
  os << ": " << key << ": " << message;
  return os.str();
}

namespace {

// TOML text with each float written as the shortest decimal that reads back as the same double
// (toml++ writes 17 significant digits: clip_high = 0.20000000000000001); strings are left as
// they are.
std::string shortest_floats(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  size_t i = 0;
  const auto digit = [](char ch) { return ch >= '0' && ch <= '9'; };
  while (i < text.size()) {
    const char ch = text[i];
    if (ch == '"' || ch == '\'') {  // a string (basic or literal, one line or three quotes)
      const std::string quote = text.compare(i, 3, std::string(3, ch)) == 0 ? std::string(3, ch) : std::string(1, ch);
      size_t j = i + quote.size();
      while (j < text.size() && text.compare(j, quote.size(), quote) != 0) j += (ch == '"' && text[j] == '\\') ? 2 : 1;
      j = std::min(text.size(), j + quote.size());
      out.append(text, i, j - i);
      i = j;
      continue;
    }
    if (ch == '#') {  // a comment, to the line's end
      const size_t j = std::min(text.size(), text.find('\n', i));
      out.append(text, i, j - i);
      i = j;
      continue;
    }
    const bool starts = (digit(ch) || ((ch == '-' || ch == '+') && i + 1 < text.size() && digit(text[i + 1]))) &&
                        (i == 0 || !(std::isalnum(static_cast<unsigned char>(text[i - 1])) || text[i - 1] == '_' ||
                                     text[i - 1] == '.' || text[i - 1] == '-'));
    if (!starts) {
      out += ch;
      ++i;
      continue;
    }
    size_t j = i + 1;
    while (j < text.size() &&
           (std::isalnum(static_cast<unsigned char>(text[j])) || text[j] == '.' || text[j] == '_' || text[j] == ':' ||
            ((text[j] == '-' || text[j] == '+') && (text[j - 1] == 'e' || text[j - 1] == 'E'))))
      ++j;
    const std::string token = text.substr(i, j - i);
    i = j;
    // A plain decimal float (not a date, a time, hex or an integer) of many digits.
    const bool is_float = token.find_first_of(".eE") != std::string::npos &&
                          token.find_first_not_of("0123456789.eE+-") == std::string::npos;
    size_t digits = 0;
    for (char d : token.substr(0, token.find_first_of("eE"))) digits += digit(d);
    if (!is_float || digits < 16) {
      out += token;
      continue;
    }
    char* end = nullptr;
    const double v = std::strtod(token.c_str(), &end);
    if (end != token.c_str() + token.size()) {
      out += token;
      continue;
    }
    std::string shortest = fmt::format("{}", v);
    if (shortest.find_first_of(".eEni") == std::string::npos) shortest += ".0";  // still a float
    out += shortest;
  }
  return out;
}

const char* type_name(const toml::node& n) {
  switch (n.type()) {
    case toml::node_type::table:
      return "a table";
    case toml::node_type::array:
      return "an array";
    case toml::node_type::string:
      return "a string";
    case toml::node_type::integer:
      return "an integer";
    case toml::node_type::floating_point:
      return "a float";
    case toml::node_type::boolean:
      return "a boolean";
    case toml::node_type::date:
      return "a date";
    case toml::node_type::time:
      return "a time";
    case toml::node_type::date_time:
      return "a date-time";
    default:
      return "nothing";
  }
}

// What a path value must point at.
enum class PathKind { any, file, dir, file_or_dir };

// Reads one TOML table against the schema: every known key is read (with its type, range and
// choices checked) and written, resolved, into `out`; finish() reports the keys nobody asked for.
class TableReader {
 public:
  TableReader(const toml::table* t, std::string prefix, const std::string& file, const std::string& base_dir,
              toml::table& out, std::vector<ConfigError>& errs)
      : t_(t), prefix_(std::move(prefix)), file_(file), base_dir_(base_dir), out_(out), errs_(errs) {}

  void str(const char* key, std::string& v, bool required = false) {
    if (auto* n = get(key, required)) read_string(*n, key, {}, v);
    out_.insert_or_assign(key, v);
  }

  // A plain name that becomes part of a file or folder name inside a folder the run owns: letters,
  // digits, '.', '_', '-', not starting with '.' (so no '/', no "..", nothing hidden).
  void file_name(const char* key, std::string& v) {
    if (auto* n = get(key, false); n && read_string(*n, key, {}, v)) {
      bool ok = !v.empty() && v.size() <= 200 && v[0] != '.';
      for (char ch : v)
        ok = ok && (std::isalnum(static_cast<unsigned char>(ch)) || ch == '.' || ch == '_' || ch == '-');
      if (!ok)
        error_at(*n, key,
                 "expected a plain name (letters, digits, '.', '_' and '-', not starting with '.'; no '/'), got \"" +
                     v + "\"");
    }
    out_.insert_or_assign(key, v);
  }

  void one_of(const char* key, std::string& v, const std::vector<std::string>& choices) {
    if (auto* n = get(key, false)) read_string(*n, key, choices, v);
    out_.insert_or_assign(key, v);
  }

  template <class T>
  void integer(const char* key, T& v, int64_t lo, int64_t hi, bool required = false) {
    int64_t x = 0;
    if (auto* n = get(key, required); n && read_integer(*n, key, lo, hi, x)) v = static_cast<T>(x);
    out_.insert_or_assign(key, static_cast<int64_t>(v));
  }

  // An integer in [lo, hi], or the string "auto" (`is_auto` says which; the default is kept when
  // the key is absent).
  void integer_or_auto(const char* key, uint32_t& v, bool& is_auto, int64_t lo, int64_t hi) {
    auto* n = get(key, false);
    if (n && n->is_string()) {
      if (*n->value<std::string>() == "auto")
        is_auto = true;
      else
        error_at(*n, key, "expected an integer or \"auto\", got \"" + *n->value<std::string>() + "\"");
    } else if (n) {
      int64_t x = 0;
      if (read_integer(*n, key, lo, hi, x)) {
        v = static_cast<uint32_t>(x);
        is_auto = false;
      }
    }
    if (is_auto)
      out_.insert_or_assign(key, "auto");
    else
      out_.insert_or_assign(key, static_cast<int64_t>(v));
  }

  void number(const char* key, double& v, double lo, double hi) {
    if (auto* n = get(key, false)) {
      if (!n->is_number()) {
        wrong_type(*n, key, "a number");
      } else {
        double x = *n->value<double>();
        if (!(x >= lo && x <= hi)) {
          std::ostringstream os;
          os << "expected a number in [" << lo << ", " << hi << "], got " << x;
          error_at(*n, key, os.str());
        } else {
          v = x;
        }
      }
    }
    out_.insert_or_assign(key, v);
  }

  void boolean(const char* key, bool& v) {
    if (auto* n = get(key, false)) {
      if (n->is_boolean())
        v = *n->value<bool>();
      else
        wrong_type(*n, key, "a boolean (true or false)");
    }
    out_.insert_or_assign(key, v);
  }

  void str_array(const char* key, std::vector<std::string>& v, const std::vector<std::string>& choices = {}) {
    array(key, v, "an array of strings", [&](const toml::node& e, const std::string& k, std::string& x) {
      return read_string(e, k.c_str(), choices, x);
    });
  }

  void int_array(const char* key, std::vector<int64_t>& v, int64_t lo, int64_t hi) {
    array(key, v, "an array of integers",
          [&](const toml::node& e, const std::string& k, int64_t& x) { return read_integer(e, k.c_str(), lo, hi, x); });
  }

  // A path, resolved against the config file's directory and checked to exist as `kind`.
  void path(const char* key, std::string& v, PathKind kind, bool required = false) {
    auto* n = get(key, required);
    if (n && !n->is_string()) {
      wrong_type(*n, key, "a path string");
      n = nullptr;
    }
    if (n) v = *n->value<std::string>();
    if (!v.empty()) {
      fs::path p(v);
      if (p.is_relative()) p = fs::path(base_dir_) / p;
      p = p.lexically_normal();
      v = p.string();
      if (n && kind != PathKind::any) {
        std::error_code ec;
        auto st = fs::status(p, ec);
        bool exists = fs::exists(st);
        if (!exists)
          error_at(*n, key, "no such file or directory: " + v);
        else if (kind == PathKind::file && !fs::is_regular_file(st))
          error_at(*n, key, "expected a file, got a directory: " + v);
        else if (kind == PathKind::dir && !fs::is_directory(st))
          error_at(*n, key, "expected a directory, got a file: " + v);
      }
    }
    out_.insert_or_assign(key, v);
  }

  // Reports keys present in the table that the schema did not read.
  void finish() {
    if (!t_) return;
    for (auto& [k, n] : *t_) {
      std::string key(k.str());
      if (!seen_.count(key)) error_at(n, key.c_str(), "unknown key (not part of the schema)");
    }
  }

  const toml::node* raw(const char* key) {
    seen_.insert(key);
    return t_ ? t_->get(key) : nullptr;
  }

  std::string full(const std::string& key) const { return prefix_.empty() ? key : prefix_ + "." + key; }

  void error_at(const toml::node& n, const char* key, const std::string& msg) {
    errs_.push_back({file_, n.source().begin.line, n.source().begin.column, full(key), msg});
  }
  // At the key's value when the table has it, else at the table.
  void error_here(const char* key, const std::string& msg) {
    if (const toml::node* n = t_ ? t_->get(key) : nullptr) {
      error_at(*n, key, msg);
      return;
    }
    uint32_t line = 1, col = 1;
    if (t_ && t_->source().begin.line) {
      line = t_->source().begin.line;
      col = t_->source().begin.column;
    }
    errs_.push_back({file_, line, col, full(key), msg});
  }

 private:
  // A string, from `choices` when that is not empty; false (error reported) otherwise.
  bool read_string(const toml::node& n, const char* key, const std::vector<std::string>& choices, std::string& out) {
    if (!n.is_string()) {
      wrong_type(n, key, "a string");
      return false;
    }
    std::string s = *n.value<std::string>();
    bool ok = choices.size() == 0;
    std::string list;
    for (auto& c : choices) {
      ok = ok || s == c;
      list += (list.empty() ? "" : ", ") + c;
    }
    if (!ok) {
      error_at(n, key, "expected one of " + list + ", got \"" + s + "\"");
      return false;
    }
    out = s;
    return true;
  }

  // An integer in [lo, hi]; false (error reported) otherwise.
  bool read_integer(const toml::node& n, const char* key, int64_t lo, int64_t hi, int64_t& out) {
    if (!n.is_integer()) {
      wrong_type(n, key, "an integer");
      return false;
    }
    int64_t x = *n.value<int64_t>();
    if (x < lo || x > hi) {
      error_at(
          n, key,
          "expected an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got " + std::to_string(x));
      return false;
    }
    out = x;
    return true;
  }

  // An array whose elements each pass `read(element, "key[i]", value)`.
  template <class Elem, class Read>
  void array(const char* key, std::vector<Elem>& v, const char* expected, Read read) {
    if (auto* n = get(key, false)) {
      if (auto* a = n->as_array()) {
        v.clear();
        size_t i = 0;
        for (auto& e : *a) {
          Elem x{};
          if (read(e, std::string(key) + "[" + std::to_string(i++) + "]", x)) v.push_back(x);
        }
      } else {
        wrong_type(*n, key, expected);
      }
    }
    toml::array arr;
    for (auto& x : v) arr.push_back(x);
    out_.insert_or_assign(key, std::move(arr));
  }

  const toml::node* get(const char* key, bool required) {
    auto* n = raw(key);
    if (!n && required) error_here(key, "missing required key");
    return n;
  }
  void wrong_type(const toml::node& n, const char* key, const char* expected) {
    error_at(n, key, std::string("expected ") + expected + ", got " + type_name(n));
  }

  const toml::table* t_;
  std::string prefix_;
  const std::string& file_;
  const std::string& base_dir_;
  toml::table& out_;
  std::vector<ConfigError>& errs_;
  std::set<std::string> seen_;
};

bool is_device(const std::string& d);

const char* const all_roles[] = {"supervisor", "learner", "sampler", "evaluator", "monitor"};

// [[node]]: each machine of the cluster and its roles (one node with every role when none is given).
toml::array read_nodes(const toml::table& root, Config& c, const std::string& file, std::vector<ConfigError>& errs) {
  toml::array nodes_out;
  if (auto* arr = root.get("node") ? root.get("node")->as_array() : nullptr; arr && arr->is_array_of_tables()) {
    std::set<std::string> names;
    for (size_t i = 0; i < arr->size(); ++i) {
      const toml::table* t = (*arr)[i].as_table();
      NodeConfig nc;
      nc.name.clear();
      toml::table out;
      TableReader r(t, "node[" + std::to_string(i) + "]", file, c.base_dir, out, errs);
      r.str("name", nc.name, true);
      r.str("host", nc.host);
      r.integer("port", nc.port, 0, 65535);
      r.str_array("roles", nc.roles, {"supervisor", "learner", "sampler", "evaluator", "monitor"});
      r.integer("cpu_slots", nc.cpu_slots, 0, 1024);
      if (const toml::node* g = r.raw("gpus"); g && g->is_string()) {
        if (g->as_string()->get() == "auto")
          nc.gpus_auto = true;
        else
          r.error_at(*g, "gpus",
                     "expected an array of CUDA device ids or \"auto\", got \"" + g->as_string()->get() + "\"");
        out.insert_or_assign("gpus", "auto");
      } else {
        r.int_array("gpus", nc.gpus, 0, 1023);
      }
      r.integer("per_gpu", nc.per_gpu, 1, 64);
      r.str_array("sampler_devices", nc.sampler_devices);
      r.str_array("sampler_urls", nc.sampler_urls);
      for (auto& d : nc.sampler_devices)
        if (!is_device(d))
          r.error_here("sampler_devices",
                       "expected \"cpu\", \"cuda\" or \"cuda:N\" for each sampler, got \"" + d + "\"");
      for (auto& u : nc.sampler_urls)
        if (u.rfind("http://", 0) != 0 && u.rfind("https://", 0) != 0)
          r.error_here("sampler_urls",
                       "expected \"http://HOST:PORT[/PATH]\" or \"https://HOST[:PORT][/PATH]\", got \"" + u + "\"");
      const bool sampler_role = std::find(nc.roles.begin(), nc.roles.end(), "sampler") != nc.roles.end();
      if (!sampler_role && (!nc.sampler_devices.empty() || !nc.sampler_urls.empty()))
        r.error_here(nc.sampler_devices.empty() ? "sampler_urls" : "sampler_devices",
                     "only a node with the sampler role runs samplers (add \"sampler\" to its roles)");
      r.finish();
      if (!nc.name.empty() && !names.insert(nc.name).second)
        r.error_at(*t->get("name"), "name", "duplicate node name \"" + nc.name + "\"");
      bool evaluator = false;
      for (auto& role : nc.roles) evaluator = evaluator || role == "evaluator";
      if (evaluator && nc.cpu_slots == 0 && nc.gpus.empty() && !nc.gpus_auto)
        r.error_here("cpu_slots", "an evaluator node needs cpu_slots > 0, a non-empty gpus or gpus = \"auto\"");
      if (nc.per_gpu > 1 && nc.gpus.empty() && !nc.gpus_auto)
        r.error_here("per_gpu",
                     "per_gpu is the evaluators on each of the node's gpus, and it lists none (CPU "
                     "evaluators are cpu_slots)");
      c.nodes.push_back(nc);
      nodes_out.push_back(std::move(out));
    }
  } else if (!root.get("node")) {
    NodeConfig nc;
    for (auto* role : all_roles) nc.roles.push_back(role);
    nc.cpu_slots = 1;
    c.nodes.push_back(nc);
    toml::table out;
    out.insert("name", nc.name);
    out.insert("host", nc.host);
    out.insert("port", int64_t{nc.port});
    toml::array roles;
    for (auto& role : nc.roles) roles.push_back(role);
    out.insert("roles", std::move(roles));
    out.insert("cpu_slots", int64_t{nc.cpu_slots});
    out.insert("gpus", toml::array{});
    out.insert("per_gpu", int64_t{nc.per_gpu});
    nodes_out.push_back(std::move(out));
  }
  return nodes_out;
}

// [cluster]: the cluster's name, secret, head and log level.
void read_cluster(TableReader& r, Config& c, const toml::table& root) {
  r.str("name", c.cluster.name);
  r.one_of("log_level", c.cluster.log_level, {"trace", "debug", "info", "warn", "error", "off"});
  r.str("head", c.cluster.head);
  r.path("secret_file", c.cluster.secret_file, PathKind::file);
  if (fs::is_regular_file(c.cluster.secret_file))
    if (auto why = secret_file_problem(c.cluster.secret_file); !why.empty()) r.error_here("secret_file", why);
  r.number("heartbeat_s", c.cluster.heartbeat_s, 0.05, 3600);
  r.number("peer_timeout_s", c.cluster.peer_timeout_s, 0.1, 86400);
  r.number("join_wait_s", c.cluster.join_wait_s, 0, 86400);
  r.boolean("tls", c.cluster.tls);
  auto& cl = c.cluster;
  r.path("tls_cert", cl.tls_cert, PathKind::file, cl.tls);
  r.path("tls_key", cl.tls_key, PathKind::file, cl.tls);
  r.path("tls_ca", cl.tls_ca, PathKind::file, cl.tls);
  if (!cl.tls) {
    for (auto [key, v] : {std::pair{"tls_cert", &cl.tls_cert}, {"tls_key", &cl.tls_key}, {"tls_ca", &cl.tls_ca}})
      if (!v->empty()) r.error_here(key, "set, but tls is false: set tls = true to encrypt the links (or remove it)");
  } else if (fs::is_regular_file(cl.tls_cert) && fs::is_regular_file(cl.tls_key) && fs::is_regular_file(cl.tls_ca)) {
    const std::string why = tls_problem(TlsFiles{cl.tls_cert, cl.tls_key, cl.tls_ca});
    // Located at the key the problem names ("tls_key PATH: ..."), else at tls_cert.
    const bool keyed = why.rfind("tls_", 0) == 0;
    const std::string key = keyed ? why.substr(0, why.find(' ')) : "tls_cert";
    if (!why.empty()) r.error_here(key.c_str(), keyed ? why.substr(why.find(' ') + 1) : why);
  }
  std::string head_host;
  uint16_t head_port = 0;
  if (!c.cluster.head.empty() && !parse_host_port(c.cluster.head, head_host, head_port))
    r.error_here("head", "expected \"HOST:PORT\", got \"" + c.cluster.head + "\"");
}

// [tasks]: where the tasks are and which of them run.
void read_tasks(TableReader& r, Config& c, const toml::table& root) {
  r.path("dir", c.tasks.dir, PathKind::dir);
  r.path("kernelbench_dir", c.tasks.kernelbench_dir, PathKind::dir);
  r.integer("level", c.tasks.level, 1, 100);
  r.str_array("ids", c.tasks.ids);
  r.str("split", c.tasks.split);
  if (!r.raw("split_file") && !c.tasks.split.empty()) c.tasks.split_file = source_dir() + "/tasks/splits.toml";
  r.path("split_file", c.tasks.split_file, PathKind::file);
  r.str_array("languages", c.tasks.languages, {"cuda", "triton"});
  if (auto* langs = r.raw("languages") ? r.raw("languages")->as_array() : nullptr; langs && langs->empty())
    r.error_here("languages", "expected at least one of cuda, triton");
  if (c.tasks.dir.empty() == c.tasks.kernelbench_dir.empty()) {
    r.error_here("dir", c.tasks.dir.empty() ? "missing required key (or kernelbench_dir)"
                                            : "set dir or kernelbench_dir, not both");
    return;
  }
  if (!c.tasks.split.empty() && !c.tasks.ids.empty()) {
    r.error_here("split", "set ids or split, not both");
    return;
  }
  std::error_code ec;
  if (!fs::is_directory(c.tasks.folder(), ec)) {
    // (A kernelbench_dir that does not exist is reported at its own key.)
    if (!c.tasks.kernelbench_dir.empty() && fs::is_directory(c.tasks.kernelbench_dir, ec)) {
      const fs::path kb(c.tasks.kernelbench_dir);
      const std::string level = "level" + std::to_string(c.tasks.level);
      r.error_here("level", "no level folder " + (kb / "KernelBench" / level).string() +
                                " (a KernelBench checkout) or " + (kb / level).string() + " (its KernelBench folder)");
    }
    return;
  }
  // Every id (or range, or split) must resolve to task files.
  TaskSet ts;
  std::string err;
  if (!ts.load(c.tasks, err)) {
    auto* ids = r.raw("ids") ? r.raw("ids")->as_array() : nullptr;
    if (ids && !c.tasks.ids.empty()) {
      for (size_t i = 0; i < ids->size(); ++i) {
        std::optional<std::string> id = (*ids)[i].value<std::string>();
        std::string one_err;
        TaskSet one;
        TasksConfig single = c.tasks;
        single.ids = {id.value_or("")};
        if (id && !one.load(single, one_err))
          r.error_at((*ids)[i], ("ids[" + std::to_string(i) + "]").c_str(), one_err);
      }
    } else {
      r.error_here(c.tasks.split.empty() ? "dir" : "split", err);
    }
  }
}

// "cpu", "cuda" or "cuda:N": a device LibTorch is given as it is.
bool is_device(const std::string& d) {
  return d == "cpu" || d == "cuda" ||
         (d.rfind("cuda:", 0) == 0 && d.size() > 5 && d.find_first_not_of("0123456789", 5) == std::string::npos);
}

// [policy]: the model, its adapter, dtype, device and prompt template.
void read_policy(TableReader& r, Config& c, const toml::table& root) {
  r.path("model", c.policy.model, PathKind::dir);
  r.path("adapter", c.policy.adapter, PathKind::dir);
  r.one_of("dtype", c.policy.dtype, {"f32", "f16", "bf16"});
  r.str("device", c.policy.device);
  auto& d = c.policy.device;
  if (d != "auto" && !is_device(d))
    r.error_here("device", "expected \"cpu\", \"cuda\", \"cuda:N\" or \"auto\", got \"" + d + "\"");
  r.str("template", c.policy.template_);
  auto& t = c.policy.template_;
  if (t != "auto" && t != "chatml" && t != "llama3" && t != "plain" && t.find("{user}") == std::string::npos)
    r.error_here("template", "expected auto, chatml, llama3, plain or a string containing {user}");
  r.str("system", c.policy.system);
}

// [sampler]: the backend and its sampling settings.
void read_sampler(TableReader& r, Config& c, const toml::table& root) {
  r.one_of("backend", c.sampler.backend, {"replay", "libtorch", "openai"});
  r.path("replay", c.sampler.replay, PathKind::file_or_dir, c.sampler.backend == "replay");
  if (c.sampler.backend == "libtorch" && c.policy.model.empty())
    r.error_here("backend", "the libtorch backend needs [policy] model (a Hugging Face directory)");
  r.path("bench_actions", c.sampler.bench_actions, PathKind::file_or_dir);
  if (!c.sampler.bench_actions.empty() && c.sampler.backend == "replay")
    r.error_here("bench_actions",
                 "bench_actions replaces a model's completions (a benchmark of the loop's pace); the replay "
                 "backend already evaluates recorded actions: set backend = \"libtorch\" or \"openai\"");
  r.integer("samples_per_task", c.sampler.samples_per_task, 0, 1 << 20);
  r.number("temperature", c.sampler.temperature, 0, 10);
  r.number("top_p", c.sampler.top_p, 1e-6, 1);
  r.str_array("stop", c.sampler.stop);
  r.integer("batch_prompts", c.sampler.batch_prompts, 1, 4096);
  r.str("url", c.sampler.url);
  r.str("served_model", c.sampler.served_model);
  r.str("api_key_env", c.sampler.api_key_env);
  r.number("timeout_s", c.sampler.timeout_s, 0.1, 86400);
  r.integer("max_retries", c.sampler.max_retries, 0, 100);
  r.path("adapter_dir", c.sampler.adapter_dir, PathKind::any);
  r.str_array("urls", c.sampler.urls);
  r.str_array("devices", c.sampler.devices);
  if (!c.sampler.urls.empty() && c.sampler.backend != "openai")
    r.error_here("urls", "only the openai backend takes server urls (this is the " + c.sampler.backend + " backend)");
  if (!c.sampler.devices.empty() && c.sampler.backend != "libtorch")
    r.error_here("devices", "only the libtorch backend takes devices (this is the " + c.sampler.backend + " backend)");
  for (auto& d : c.sampler.devices)
    if (!is_device(d))
      r.error_here("devices", "expected \"cpu\", \"cuda\" or \"cuda:N\" for each sampler, got \"" + d + "\"");
  if (c.sampler.backend == "openai") {
    if (!c.sampler.url.empty() && !c.sampler.urls.empty())
      r.error_here("urls", "give either url (one server) or urls (one sampler per server), not both");
    if (c.sampler.url.empty() && c.sampler.urls.empty())
      r.error_here("url", "the openai backend needs url = \"http://HOST:PORT\" (or urls = [...], one per server)");
    std::vector<std::string> all = c.sampler.urls;
    if (!c.sampler.url.empty()) all.push_back(c.sampler.url);
    for (auto& u : all)
      if (u.rfind("http://", 0) != 0 && u.rfind("https://", 0) != 0)
        r.error_here(c.sampler.urls.empty() ? "url" : "urls",
                     "expected \"http://HOST:PORT[/PATH]\" or \"https://HOST[:PORT][/PATH]\", got \"" + u + "\"");
    if (c.sampler.served_model.empty())
      r.error_here("served_model", "the openai backend needs the served model's name");
  }
  r.integer("max_tokens", c.sampler.max_tokens, 1, 1 << 20);
  r.integer("seed", c.sampler.seed, 0, std::numeric_limits<int64_t>::max());
  r.integer("max_pending", c.sampler.max_pending, 1, 1 << 24);
  r.integer("max_failures", c.sampler.max_failures, 0, 1 << 20);
}

// [evaluator]: the evaluation protocol and the sandbox's limits.
void read_evaluator(TableReader& r, Config& c, const toml::table& root) {
  auto& e = c.evaluator;
  r.one_of("action_space", e.action_space, {"forward_body", "full_program"});
  r.one_of("mode", e.mode, {"fast", "full"});
  r.integer("correctness_trials", e.correctness_trials, 1, 1000);
  r.integer("warmup", e.warmup, 0, 1000);
  r.integer("fast_trials", e.fast_trials, 1, 10000);
  r.integer("full_trials", e.full_trials, 1, 10000);
  r.number("timing_precision", e.timing_precision, 0, 1);
  r.number("timeout_s", e.timeout_s, 0.1, 86400);
  r.number("atol_fp32", e.atol_fp32, 0, 1);
  r.number("rtol_fp32", e.rtol_fp32, 0, 1);
  r.number("atol_half", e.atol_half, 0, 1);
  r.number("rtol_half", e.rtol_half, 0, 1);
  r.integer("max_in_flight", e.max_in_flight, 0, 1024);
  r.integer("max_attempts", e.max_attempts, 1, 100);
  r.integer("torch_threads", e.torch_threads, 1, 1024);
  r.integer("seed", e.seed, 0, std::numeric_limits<int64_t>::max());
  if (!r.raw("python")) e.python = source_dir() + "/scripts/python";
  r.path("python", e.python, PathKind::file);
  r.one_of("task_size", e.task_size, {"auto", "cpu", "gpu"});
  r.integer("compile_workers", e.compile_workers, 0, 1024);
  r.number("compile_timeout_s", e.compile_timeout_s, 1, 86400);
  r.integer_or_auto("memory_limit_mb", e.memory_limit_mb, e.memory_auto, 0, 1 << 30);
  r.number("reverify_speedup", e.reverify_speedup, 0, 1e9);
  r.number("review_speedup", e.review_speedup, 0, 1e9);
  r.str_array("input_distributions", e.input_distributions, {"signed", "large", "zeros"});
  r.number("scale_tol_fp32", e.scale_tol_fp32, 0, 1e3);
  r.number("scale_tol_half", e.scale_tol_half, 0, 1e3);
  r.boolean("bandwidth_bound", e.bandwidth_bound);
  r.number("bound_min_output_mb", e.bound_min_output_mb, 0, 1e9);
  r.number("reference_cache_mb", e.reference_cache_mb, 0, 1e9);
  r.boolean("isolate_network", e.isolate_network);
  r.path("cache_dir", e.cache_dir, PathKind::any);
  r.one_of("backend", e.backend, {"worker", "synthetic"});
  r.number("synthetic_latency_ms", e.synthetic_latency_ms, 0, 3.6e6);
}

// [reward]: how an evaluation becomes a reward.
void read_reward(TableReader& r, Config& c, const toml::table& root) {
  r.one_of("shape", c.reward.shape, {"speedup", "log_speedup", "none", "threshold"});
  r.number("threshold", c.reward.threshold, 0, 1e6);
  r.number("max_speedup", c.reward.max_speedup, 0, 1e6);
  if (c.reward.max_speedup > 0 && c.reward.max_speedup < 1) {
    std::ostringstream v;
    v << c.reward.max_speedup;
    r.error_here("max_speedup", "expected 0 (no cap) or a cap of at least 1, got " + v.str());
  }
  r.number("correct_bonus", c.reward.correct_bonus, -1e6, 1e6);
  r.number("incorrect_reward", c.reward.incorrect_reward, -1e6, 1e6);
  r.number("failure_reward", c.reward.failure_reward, -1e6, 1e6);
  r.number("hacked_reward", c.reward.hacked_reward, -1e6, 1e6);
  r.number("unconfirmed_speedup", c.reward.unconfirmed_speedup, 0, 1e6);
  r.one_of("normalize", c.reward.normalize, {"none", "task_mean"});
  r.number("coverage_weight", c.reward.coverage_weight, -1e6, 1e6);
  r.number("min_coverage", c.reward.min_coverage, 0, 1);
  r.number("reject_coverage_below", c.reward.reject_coverage_below, 0, 1);
  r.number("reject_keep_probability", c.reward.reject_keep_probability, 0, 1);
  r.number("lazy_reward", c.reward.lazy_reward, -1e6, 1e6);
}

// [learner]: the GRPO/SDPO learner.
void read_learner(TableReader& r, Config& c, const toml::table& root) {
  auto& l = c.learner;
  r.one_of("algorithm", l.algorithm, {"grpo", "dr_grpo", "rloo", "trloo"});
  r.number("adv_eps", l.adv_eps, 0, 1);
  r.number("turn_gamma", l.turn_gamma, 0, 1);
  r.number("turn_progress", l.turn_progress, 0, 100);
  r.one_of("learn_turns", l.learn_turns, {"all", "last"});
  r.integer("steps", l.steps, 1, 1 << 24);
  r.integer("batch_size", l.batch_size, 1, 1 << 20);
  r.integer("group_size", l.group_size, 2, 1 << 20);
  r.integer("minibatch_size", l.minibatch_size, 1, 1 << 20);
  r.boolean("activation_checkpointing", l.activation_checkpointing);
  r.integer("lora_rank", l.lora_rank, 1, 4096);
  r.number("lora_alpha", l.lora_alpha, 0, 1e6);
  r.number("lora_dropout", l.lora_dropout, 0, 0.99);
  r.str_array("lora_targets", l.lora_targets);
  static const std::set<std::string> known_targets = {"q_proj",    "k_proj",  "v_proj",   "o_proj",
                                                      "gate_proj", "up_proj", "down_proj"};
  for (auto& t : l.lora_targets)
    if (!known_targets.count(t))
      r.error_here("lora_targets",
                   "\"" + t + "\" is not one of q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj");
  if (l.lora_targets.empty()) r.error_here("lora_targets", "expected at least one module");
  r.number("learning_rate", l.learning_rate, 0, 1);
  r.number("weight_decay", l.weight_decay, 0, 10);
  r.number("max_grad_norm", l.max_grad_norm, 0, 1e6);
  r.one_of("lr_schedule", l.lr_schedule, {"constant", "linear", "cosine"});
  r.integer("warmup_steps", l.warmup_steps, 0, 1 << 24);
  r.number("clip_low", l.clip_low, 0, 1);
  r.number("clip_high", l.clip_high, 0, 100);
  r.one_of("mismatch", l.mismatch, {"off", "token", "sequence"});
  r.number("mismatch_threshold", l.mismatch_threshold, 0, 100);
  r.one_of("aggregation", l.aggregation, {"token_mean", "seq_mean"});
  r.number("kl_coef", l.kl_coef, 0, 1e3);
  r.number("entropy_coef", l.entropy_coef, 0, 1e3);
  r.str("device", l.device);
  r.str_array("devices", l.devices);
  if (!l.devices.empty()) {
    if (!l.device.empty())
      r.error_here("devices", "give either device (one learner) or devices (data-parallel ranks), not both");
    std::set<std::string> seen;
    size_t cpus = 0;
    for (auto& d : l.devices) {
      if (d == "cpu") {
        ++cpus;
      } else if (d.rfind("cuda:", 0) != 0 || !is_device(d)) {
        r.error_here("devices", "expected \"cpu\" or \"cuda:N\" for each rank, got \"" + d + "\"");
      } else if (!seen.insert(d).second) {
        r.error_here("devices", d + " is listed twice (NCCL takes one GPU a rank)");
      }
    }
    if (cpus > 0 && cpus < l.devices.size())
      r.error_here("devices", "the ranks mix \"cpu\" and GPUs: expected every rank on \"cpu\" or every rank on a GPU");
    l.device = l.devices.front();
  }
  if (l.device.empty()) l.device = c.policy.device;
  r.str("dtype", l.dtype);
  if (l.dtype.empty())
    l.dtype = c.policy.dtype;
  else if (l.dtype != "f32" && l.dtype != "f16" && l.dtype != "bf16")
    r.error_here("dtype", "expected f32, f16 or bf16, got \"" + l.dtype + "\"");
  r.integer("max_staleness", l.max_staleness, 0, 1 << 20);
  r.number("sync_timeout_s", l.sync_timeout_s, 0.1, 86400);
  r.integer("keep_last", l.keep_last, 0, 1 << 20);
}

// [experiment]: the mode and its settings.
void read_experiment(TableReader& r, Config& c, const toml::table& root) {
  std::string mode_name = name(c.experiment.mode);
  r.one_of("mode", mode_name, mode_names());
  if (auto parsed = parse_mode(mode_name)) c.experiment.mode = *parsed;
  const ModeTraits& mode = traits(c.experiment.mode);
  const std::string m = mode.name;
  r.integer("patience", c.experiment.patience, 0, 1 << 20);
  r.one_of("early_stop", c.experiment.early_stop, {"no_better", "regressions"});
  r.boolean("per_task", c.experiment.per_task);
  if (c.experiment.per_task && !mode.adapts)
    r.error_here("per_task",
                 "per_task is for mode = \"ttt\" or \"sdpo\" (one adapter per task); got mode = \"" + m + "\"");
  if (c.experiment.early_stop == "regressions" && c.experiment.patience == 0)
    r.error_here("early_stop",
                 "early_stop = \"regressions\" needs patience = P >= 1 (the regressions in a row that "
                 "stop the run)");
  r.integer("k", c.experiment.k, 0, 1 << 20);
  r.integer("turns", c.experiment.turns, 1, 64);
  r.integer("turn_prompt_tokens", c.experiment.turn_prompt_tokens, 256, 1 << 22);
  r.integer("feedback_chars", c.experiment.feedback_chars, 64, 1 << 20);
  if (c.experiment.turns > 1) {
    if (c.experiment.mode == Mode::sdpo)
      r.error_here("turns",
                   "multi-turn episodes are for mode = \"train\", \"ttt\", \"eval\" or \"best_of_n\" "
                   "(sdpo's teacher already sees the feedback)");
    else if (c.sampler.backend == "replay")
      r.error_here("turns", "turns = " + std::to_string(c.experiment.turns) +
                                " needs a model sampler (each later turn is written after the evaluator's feedback): "
                                "set [sampler] backend = \"libtorch\" or \"openai\"");
  }
  r.integer("evaluate_top_m", c.experiment.evaluate_top_m, 0, 1 << 20);
  if (c.experiment.turns > 1 && c.experiment.evaluate_top_m > 0)
    r.error_here("evaluate_top_m",
                 "evaluate_top_m leaves samples unevaluated, so a later turn would have no "
                 "feedback: it is for single-turn runs (turns = 1)");
  if (c.experiment.evaluate_top_m > 0) {
    if (!mode.selects)
      r.error_here("evaluate_top_m", "evaluate_top_m is for mode = \"best_of_n\"");
    else if (c.experiment.k >= 2 && c.experiment.evaluate_top_m >= c.experiment.k)
      r.error_here("evaluate_top_m", "evaluate_top_m = " + std::to_string(c.experiment.evaluate_top_m) +
                                         " leaves nothing out of k = " + std::to_string(c.experiment.k) +
                                         " (expected 1 .. k - 1)");
  }
  if (mode.selects) {
    if (c.experiment.k == 0 && c.sampler.samples_per_task < 2)
      r.error_here("mode", "best_of_n needs k = K (at least 2 samples per task)");
    else if (c.experiment.k == 1)
      r.error_here("k", "best_of_n needs at least 2 samples per task");
    if (c.experiment.k >= 2) c.sampler.samples_per_task = c.experiment.k;
  } else if (c.experiment.k != 0) {
    r.error_here("k", "k is for mode = \"best_of_n\" (train: [learner] group_size; eval: [sampler] samples_per_task)");
  }
  if (mode.learns) {
    if (c.sampler.backend == "replay")
      r.error_here("mode", m + " needs a model sampler: set [sampler] backend = \"libtorch\" or \"openai\"");
    if (c.policy.model.empty())
      r.error_here("mode", m + " needs [policy] model: the learner trains an adapter on that model");
  } else if (c.experiment.patience != 0) {
    r.error_here("patience", "patience is for mode = \"train\", \"ttt\" or \"sdpo\"");
  }
  r.str("eval_split", c.experiment.eval_split);
  r.str_array("eval_ids", c.experiment.eval_ids);
  r.integer("eval_every", c.experiment.eval_every, 0, 1 << 20);
  r.integer("eval_samples", c.experiment.eval_samples, 0, 1 << 20);
  const bool has_eval = !c.experiment.eval_split.empty() || !c.experiment.eval_ids.empty();
  if (has_eval && !mode.holds_out) {
    r.error_here(c.experiment.eval_split.empty() ? "eval_ids" : "eval_split",
                 "periodic evaluation on held-out tasks is for mode = \"train\" (" + m + " evaluates its own tasks)");
  } else if (!c.experiment.eval_split.empty() && !c.experiment.eval_ids.empty()) {
    r.error_here("eval_ids", "set eval_ids or eval_split, not both");
  } else if (has_eval) {
    auto& e = c.experiment.eval_tasks;
    e = c.tasks;
    e.ids = c.experiment.eval_ids;
    e.split = c.experiment.eval_split;
    if (!e.split.empty() && e.split_file.empty()) e.split_file = source_dir() + "/tasks/splits.toml";
    TaskSet ts;
    std::string err;
    if (!c.tasks.folder().empty() && fs::is_directory(c.tasks.folder()) && !ts.load(e, err))
      r.error_here(c.experiment.eval_split.empty() ? "eval_ids" : "eval_split", err);
  } else if (c.experiment.eval_every != 0 || c.experiment.eval_samples != 0) {
    r.error_here(c.experiment.eval_every != 0 ? "eval_every" : "eval_samples",
                 "set eval_split or eval_ids: the held-out tasks to evaluate on");
  }
  if (c.experiment.mode != Mode::sdpo && root.get("sdpo"))
    r.error_here("mode", "[sdpo] is set but mode is \"" + m + "\" (the [sdpo] settings are for mode = \"sdpo\")");
  r.file_name("name", c.experiment.name);
  r.path("run_root", c.experiment.run_root, PathKind::any);
  r.integer("seed", c.experiment.seed, 0, std::numeric_limits<int64_t>::max());
}

// [sdpo]: the teacher's context.
void read_sdpo(TableReader& r, Config& c, const toml::table& root) {
  r.one_of("context", c.sdpo.context, {"feedback", "prompt"});
  r.boolean("demonstration", c.sdpo.demonstration);
  r.number("beta", c.sdpo.beta, 0, 1e3);
  r.integer("max_error_chars", c.sdpo.max_error_chars, 0, 1 << 20);
  if (c.sdpo.context == "prompt" && !c.sdpo.demonstration)
    r.error_here("demonstration",
                 "context = \"prompt\" without a demonstration leaves the teacher nothing the "
                 "student did not see: set demonstration = true or context = \"feedback\"");
}

// [tracking]: an experiment tracker beside the run.
void read_tracking(TableReader& r, Config& c, const toml::table& root) {
  auto& t = c.tracking;
  r.one_of("backend", t.backend, {"none", "wandb", "tensorboard", "mlflow"});
  r.str("project", t.project);
  r.str("name", t.name);
  r.path("dir", t.dir, PathKind::any);
  if (!r.raw("python")) t.python = source_dir() + "/scripts/tracking-python";
  r.path("python", t.python, PathKind::file);
}

// [store]: the run store.
void read_store(TableReader& r, Config& c, const toml::table& root) {
  r.file_name("file", c.store.file);
  r.one_of("synchronous", c.store.synchronous, {"normal", "full"});
}

// [monitor]: progress, metrics and the telemetry endpoint.
void read_monitor(TableReader& r, Config& c, const toml::table& root) {
  r.boolean("progress", c.monitor.progress);
  r.number("interval_s", c.monitor.interval_s, 0.05, 3600);
  r.file_name("metrics_file", c.monitor.metrics_file);
  r.str("publish", c.monitor.publish);
  auto& pub = c.monitor.publish;
  if (!pub.empty() && pub.rfind("tcp://", 0) != 0 && pub.rfind("ipc://", 0) != 0)
    r.error_here("publish", "expected \"tcp://HOST:PORT\" or \"ipc://PATH\", got \"" + pub + "\"");
  // Without CURVE keys the telemetry socket has no authentication or encryption: it is bound where
  // only this machine reaches it (a remote reader comes through an SSH tunnel, or `launch monitor`).
  auto& m = c.monitor;
  r.path("publish_key", m.publish_key, PathKind::file);
  r.path("publish_clients", m.publish_clients, PathKind::file);
  if (m.publish_key.empty() != m.publish_clients.empty()) {
    r.error_here(m.publish_key.empty() ? "publish_clients" : "publish_key",
                 "set publish_key and publish_clients together (the socket's secret key and the readers it admits)");
  } else if (!m.publish_key.empty()) {
    std::string err;
    if (pub.empty()) r.error_here("publish_key", "set, but publish is not: nothing is published");
    if (!curve_available()) r.error_here("publish_key", "this libzmq was built without CURVE");
    if (fs::is_regular_file(m.publish_key) && !read_curve_key(m.publish_key, true, err))
      r.error_here("publish_key", err);
    if (fs::is_regular_file(m.publish_clients) && !read_curve_clients(m.publish_clients, err))
      r.error_here("publish_clients", err);
  }
  if (pub.rfind("tcp://", 0) == 0 && m.publish_key.empty()) {
    const std::string host = pub.substr(6, pub.rfind(':') > 6 ? pub.rfind(':') - 6 : std::string::npos);
    if (host != "127.0.0.1" && host != "localhost" && host != "[::1]" && host.rfind("127.", 0) != 0)
      r.error_here("publish", "binds " + host +
                                  ": the telemetry socket is neither authenticated nor encrypted, so it binds a "
                                  "loopback address only (tcp://127.0.0.1:PORT or ipc://PATH) unless publish_key and "
                                  "publish_clients are set (CURVE); or read it from another machine through an SSH "
                                  "tunnel, or with `launch monitor HOST:PORT`, which proves the cluster secret");
  }
}

}  // namespace

ConfigResult parse_config(const std::string& text, const std::string& path) {
  try {
    return read_config(toml::parse(text, path), path);
  } catch (const toml::parse_error& e) {
    return std::vector<ConfigError>{
        {path, e.source().begin.line, e.source().begin.column, "(syntax)", std::string(e.description())}};
  }
}

ConfigResult read_config(const toml::table& root, const std::string& path) {
  std::vector<ConfigError> errs;
  Config c;
  c.source_file = fs::absolute(path).lexically_normal().string();
  c.base_dir = fs::path(c.source_file).parent_path().string();
  const std::string& file = path;

  toml::table resolved;
  std::set<std::string> sections = {"cluster", "node",       "tasks", "policy",   "sampler", "evaluator", "reward",
                                    "learner", "experiment", "sdpo",  "tracking", "store",   "monitor"};
  for (auto& [k, n] : root) {
    std::string key(k.str());
    if (!sections.count(key)) {
      errs.push_back({file, n.source().begin.line, n.source().begin.column, key,
                      "unknown section (expected one of cluster, node, tasks, policy, sampler, "
                      "evaluator, reward, learner, experiment, sdpo, tracking, store, monitor)"});
    } else if (key == "node" ? !n.is_array_of_tables() : !n.is_table()) {
      errs.push_back({file, n.source().begin.line, n.source().begin.column, key,
                      key == "node" ? "expected an array of tables ([[node]])" : "expected a table ([" + key + "])"});
    }
  }

  // Reads one [section] table through a TableReader; `body` reads its keys.
  auto section = [&](const char* name, void (*read)(TableReader&, Config&, const toml::table&)) {
    const toml::table* t = root.get(name) ? root.get(name)->as_table() : nullptr;
    toml::table out;
    TableReader r(t, name, file, c.base_dir, out, errs);
    read(r, c, root);
    r.finish();
    resolved.insert_or_assign(name, std::move(out));
  };

  section("cluster", read_cluster);

  resolved.insert_or_assign("node", read_nodes(root, c, file, errs));

  section("tasks", read_tasks);
  section("policy", read_policy);
  section("sampler", read_sampler);
  section("evaluator", read_evaluator);
  section("reward", read_reward);
  section("learner", read_learner);
  section("experiment", read_experiment);
  section("sdpo", read_sdpo);
  if (c.experiment.mode != Mode::sdpo) resolved.erase("sdpo");  // a resolved config re-reads cleanly
  section("tracking", read_tracking);
  section("store", read_store);
  section("monitor", read_monitor);

  // Whole-config checks.
  std::set<std::string> roles;
  for (auto& n : c.nodes)
    for (auto& r : n.roles) roles.insert(r);
  for (auto* need : {"supervisor", "sampler", "evaluator"}) {
    if (!roles.count(need)) errs.push_back({file, 1, 1, "node", std::string("no node has the role \"") + need + "\""});
  }
  bool cluster = false;
  for (auto& n : c.nodes) cluster = cluster || n.port != 0;
  std::string learner_at, monitor_at;            // the first node with the learner, monitor role
  for (size_t i = 0; i < c.nodes.size(); ++i) {  // a node's samplers are of the run's backend
    const auto& n = c.nodes[i];
    const std::string at = "node[" + std::to_string(i) + "]";
    for (auto [role, first] : {std::pair<const char*, std::string*>{"learner", &learner_at}, {"monitor", &monitor_at}})
      if (cluster && std::find(n.roles.begin(), n.roles.end(), role) != n.roles.end()) {
        if (!first->empty())
          errs.push_back(
              {file, 1, 1, at + ".roles",
               std::string("the ") + role + " role is on " + *first + " already: one node runs a run's " + role});
        else
          *first = "node \"" + n.name + "\"";
      }
    const bool head = std::find(n.roles.begin(), n.roles.end(), "supervisor") != n.roles.end();
    const bool samples = std::find(n.roles.begin(), n.roles.end(), "sampler") != n.roles.end();
    if (!cluster && !head && (!n.sampler_devices.empty() || !n.sampler_urls.empty()))
      errs.push_back({file, 1, 1, at + (n.sampler_devices.empty() ? ".sampler_urls" : ".sampler_devices"),
                      "no [[node]] has a port, so every role runs in one process: give the samplers to the "
                      "supervisor's node or to [sampler]"});
    if (cluster && c.sampler.backend == "replay" && head != samples)
      errs.push_back({file, 1, 1, at + ".roles",
                      head ? "the replay sampler runs on the head: give this node (the supervisor's) the sampler role"
                           : "the replay sampler runs on the head only (its records are the run's actions): take the "
                             "sampler role off this node"});
    if (!n.sampler_devices.empty() && c.sampler.backend != "libtorch")
      errs.push_back({file, 1, 1, at + ".sampler_devices",
                      "only the libtorch backend takes devices (this is the " + c.sampler.backend + " backend)"});
    if (!n.sampler_urls.empty() && c.sampler.backend != "openai")
      errs.push_back({file, 1, 1, at + ".sampler_urls",
                      "only the openai backend takes server urls (this is the " + c.sampler.backend + " backend)"});
  }

  if (!errs.empty()) return errs;
  std::ostringstream os;
  os << resolved;
  c.resolved_toml = shortest_floats(os.str());
  return c;
}

ConfigResult load_config(const std::string& path, const std::vector<std::string>& sets) {
  std::error_code ec;
  if (fs::is_directory(path, ec))
    return std::vector<ConfigError>{{path, 0, 0, "(file)", "is a directory, not a config file"}};
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::vector<ConfigError>{{path, 0, 0, "(file)", "cannot open config file"}};
  std::stringstream ss;
  ss << in.rdbuf();
  if (sets.empty()) return parse_config(ss.str(), path);
  toml::table root;
  try {
    root = toml::parse(ss.str(), path);
  } catch (const toml::parse_error& e) {
    return std::vector<ConfigError>{
        {path, e.source().begin.line, e.source().begin.column, "(syntax)", std::string(e.description())}};
  }
  std::vector<ConfigError> errs;
  if (!apply_overrides(root, sets, errs)) return errs;
  auto r = read_config(root, path);
  if (auto* e = std::get_if<std::vector<ConfigError>>(&r)) blame_overrides(*e, sets);
  return r;
}

namespace {
// KEY and VALUE of "KEY=VALUE" (false: no '=' or an empty key).
bool split_set(const std::string& set, std::string& key, std::string& value) {
  const auto eq = set.find('=');
  if (eq == std::string::npos || eq == 0) return false;
  key = set.substr(0, eq);
  value = set.substr(eq + 1);
  while (!key.empty() && key.back() == ' ') key.pop_back();
  return !key.empty();
}
}  // namespace

bool apply_overrides(toml::table& root, const std::vector<std::string>& sets, std::vector<ConfigError>& errs) {
  const size_t before = errs.size();
  for (auto& set : sets) {
    std::string key, text;
    if (!split_set(set, key, text)) {
      errs.push_back({"--set " + set, 0, 0, "(override)", "expected KEY=VALUE, e.g. learner.learning_rate=2e-5"});
      continue;
    }
    std::vector<std::string> path;
    for (size_t at = 0;;) {
      const auto dot = key.find('.', at);
      path.push_back(key.substr(at, dot == std::string::npos ? std::string::npos : dot - at));
      if (dot == std::string::npos) break;
      at = dot + 1;
    }
    if (std::any_of(path.begin(), path.end(), [](const std::string& p) { return p.empty(); }) || path.size() < 2) {
      errs.push_back({"--set " + set, 0, 0, key,
                      "expected SECTION.KEY (a dotted path such as sampler.temperature), got \"" + key + "\""});
      continue;
    }
    // The value as TOML; a bare word that is not TOML is a string.
    toml::table parsed;
    try {
      parsed = toml::parse("v = " + text);
    } catch (const toml::parse_error&) {
      parsed = toml::table{{"v", text}};
    }
    toml::table* t = &root;
    bool ok = true;
    for (size_t i = 0; i + 1 < path.size() && ok; ++i) {
      toml::node* n = t->get(path[i]);
      if (!n) {
        t->insert(path[i], toml::table{});
        n = t->get(path[i]);
      }
      if (!n->is_table()) {
        errs.push_back({"--set " + set, 0, 0, key,
                        path[i] + (n->is_array_of_tables() ? " is an array of tables ([[" + path[i] +
                                                                 "]]): edit it in "
                                                                 "the file"
                                                           : " is not a table")});
        ok = false;
        break;
      }
      t = n->as_table();
    }
    if (ok) t->insert_or_assign(path.back(), std::move(*parsed.get("v")));
  }
  return errs.size() == before;
}

void blame_overrides(std::vector<ConfigError>& errs, const std::vector<std::string>& sets) {
  for (auto& e : errs)
    for (auto& set : sets) {
      std::string key, value;
      if (!split_set(set, key, value)) continue;
      // The reader names a key as SECTION.KEY (a node's as node[i].KEY, never overridden).
      if (e.key == key || e.key.rfind(key + ".", 0) == 0) {
        e.file = "--set " + set;
        e.line = e.column = 0;
      }
    }
}

}  // namespace kernelrl
