#include "wiring/child.hpp"

#include <spawn.h>
#include <sys/wait.h>
#include <csignal>
#include <fcntl.h>
#include <unistd.h>

#include <filesystem>

extern char** environ;

namespace kernelrl {

namespace {
// argv started as a child with `fa`'s redirections; its pid, or -1.
int spawn(const std::vector<std::string>& argv, posix_spawn_file_actions_t& fa) {
  std::vector<char*> av;
  for (auto& a : argv) av.push_back(const_cast<char*>(a.c_str()));
  av.push_back(nullptr);
  pid_t pid = 0;
  int rc = posix_spawn(&pid, av[0], &fa, nullptr, av.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  return rc == 0 ? int(pid) : -1;
}
}  // namespace

int run_child(const std::vector<std::string>& argv, const std::string& out) {
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  if (!out.empty()) posix_spawn_file_actions_addopen(&fa, 1, out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  const int pid = spawn(argv, fa);
  if (pid < 0) return -1;
  int status = 0;
  if (waitpid(pid, &status, 0) < 0) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
}

int start_child(const std::vector<std::string>& argv, const std::string& log) {
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  if (!log.empty()) {
    posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
  }
  return spawn(argv, fa);
}

bool finish_child(int pid, double timeout_s) {
  if (pid <= 0) return true;
  int status = 0;
  for (double waited = 0; waited < timeout_s; waited += 0.1) {
    if (waitpid(pid, &status, WNOHANG) == pid) return true;
    usleep(100000);
  }
  kill(pid, SIGKILL);
  waitpid(pid, &status, 0);
  return false;
}

bool clear_unfinished(const std::string& dir) {
  namespace fs = std::filesystem;
  const fs::path store = fs::path(dir) / "store.sqlite";
  if (!fs::exists(store) || fs::exists(fs::path(dir) / "compute.json")) return false;
  std::error_code ec;
  for (const char* suffix : {"", "-wal", "-shm"}) fs::remove(store.string() + suffix, ec);
  return true;
}

std::string self_exe() {
  std::error_code ec;
  auto p = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::string("launch") : p.string();
}

}  // namespace kernelrl
