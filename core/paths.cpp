#include "core/paths.hpp"

#include "core/files.hpp"

#include <cstdlib>
#include <cerrno>
#include <cstring>
#include <ftw.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <filesystem>
#include <mutex>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

namespace fs = std::filesystem;

namespace kernelrl {

std::string make_run_dir(const std::string& root, const std::string& name) {
  std::time_t t = std::time(nullptr);
  char stamp[32];
  std::strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", std::gmtime(&t));
  fs::create_directories(root);
  for (int i = 0;; ++i) {
    fs::path p = fs::path(root) / (name + "-" + stamp + (i ? "-" + std::to_string(i) : ""));
    if (fs::create_directory(p)) {
      // The owner's and the group's: not a candidate's (its own uid) where no namespace hides it.
      fs::permissions(p, fs::perms::owner_all | fs::perms::group_read | fs::perms::group_exec);
      return fs::absolute(p).lexically_normal().string();
    }
  }
}

namespace {

// Removes $TMPDIR/kernelrl-PID-* folders of this user whose process is gone.
void sweep_dead_temp_dirs(const fs::path& tmp) {
  std::error_code ec;
  for (auto& e : fs::directory_iterator(tmp, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("kernelrl-", 0) != 0) continue;
    char* end = nullptr;
    const long pid = std::strtol(name.c_str() + 9, &end, 10);
    if (pid <= 0 || !end || *end != '-' || pid == getpid()) continue;
    struct stat st {};
    if (lstat(e.path().c_str(), &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != geteuid()) continue;
    if (::kill(pid_t(pid), 0) == 0 || errno != ESRCH) continue;  // running (or not ours to ask)
    std::string err;
    remove_tree(e.path().string(), err);
  }
}

std::string make_process_temp_dir() {
  std::error_code ec;
  fs::path tmp = fs::temp_directory_path(ec);
  if (ec) return "";
  sweep_dead_temp_dirs(tmp);
  std::string dir = (tmp / ("kernelrl-" + std::to_string(getpid()) + "-XXXXXX")).string();
  if (mkdtemp(dir.data()) == nullptr) return "";
  chmod(dir.c_str(), 0711);
  return dir;
}

}  // namespace

const std::string& process_temp_dir() {
  // Never destroyed: the exit handler below runs after the destructors of statics made later.
  static const std::string* dir = [] {
    auto* d = new std::string(make_process_temp_dir());
    if (!d->empty())
      std::atexit([] {
        std::string err;
        remove_tree(process_temp_dir(), err);
      });
    return d;
  }();
  return *dir;
}

double now_s() {
  using namespace std::chrono;
  return duration<double>(system_clock::now().time_since_epoch()).count();
}

double mono_s() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

std::string iso_now() {
  std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return buf;
}

std::string checkpoint_dir(const std::string& checkpoints, uint64_t version) {
  return (std::filesystem::path(checkpoints) / ("step-" + std::to_string(version))).string();
}

std::vector<std::pair<uint64_t, std::string>> list_checkpoints(const std::string& checkpoints,
                                                               std::vector<std::string>* passed_over) {
  namespace fs = std::filesystem;
  std::vector<std::pair<uint64_t, std::string>> out;
  std::error_code ec;
  for (auto& d : fs::directory_iterator(checkpoints, ec)) {
    auto name = d.path().filename().string();
    if (name.size() <= 5 || name.rfind("step-", 0) != 0 ||
        name.find_first_not_of("0123456789", 5) != std::string::npos || name.size() > 5 + 18)
      continue;
    // Complete: its manifest verifies (sizes here; a resume also checks the hashes). A folder
    // from before manifests counts when its learner.json has contents.
    std::string why;
    std::error_code ec;
    const bool listed = fs::exists(d.path() / "manifest.json", ec);
    if (listed ? !verify_manifest(d.path().string(), false, why)
               : fs::file_size(d.path() / "learner.json", ec) == 0 || ec) {
      if (passed_over)
        passed_over->push_back(d.path().string() + ": " +
                               (listed ? why : "no manifest.json and an empty or missing learner.json"));
      continue;
    }
    out.emplace_back(std::stoull(name.substr(5)), d.path().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::string source_dir() {
  const char* env = std::getenv("KERNELRL_ROOT");
  return env && *env ? std::string(env) : std::string(KERNELRL_SOURCE_DIR);
}

namespace {
std::string remove_error;  // the first failure of one remove_tree walk (nftw takes no context)
int remove_entry(const char* path, const struct stat*, int, struct FTW*) {
  if (::remove(path) != 0 && errno != ENOENT && remove_error.empty())
    remove_error = std::string(path) + ": " + std::strerror(errno);
  return 0;
}
}  // namespace

bool remove_tree(const std::string& path, std::string& err) {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) return true;  // nothing there
  static std::mutex mu;                              // remove_error is shared
  std::lock_guard<std::mutex> lock(mu);
  remove_error.clear();
  if (::nftw(path.c_str(), remove_entry, 16, FTW_DEPTH | FTW_PHYS) != 0 && remove_error.empty())
    remove_error = path + ": " + std::strerror(errno);
  if (remove_error.empty() && ::lstat(path.c_str(), &st) == 0) remove_error = path + ": still there";
  err = remove_error;
  return err.empty();
}

}  // namespace kernelrl
