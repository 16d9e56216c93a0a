// Runs a tpusim command as a child process, as a user would, capturing its exit
// status and output. SystemC allows one elaboration per process, so the tests of
// `tpusim run` drive the real binary instead of linking it.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace tpusim::testing {

struct Completed {
  int exit_code = -1;  // -1: did not exit normally (signal)
  std::string out, err;
};

inline std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

// argv[0] is the program path. stdout/stderr go through files in `scratch_dir`.
// A child still running after `timeout_s` is killed (SIGALRM survives exec), so
// a hung simulator fails its test instead of stalling the suite.
inline Completed spawn(const std::vector<std::string>& argv, const std::string& scratch_dir,
                       unsigned timeout_s = 120) {
  const std::string out_path = scratch_dir + "/.spawn.out", err_path = scratch_dir + "/.spawn.err";
  Completed c;
  const pid_t pid = ::fork();
  if (pid == 0) {
    const int o = ::open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int e = ::open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (o < 0 || e < 0) ::_exit(127);
    ::dup2(o, 1);
    ::dup2(e, 2);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    ::setenv("SYSTEMC_DISABLE_COPYRIGHT_MESSAGE", "1", 1);
    ::alarm(timeout_s);
    ::execv(args[0], args.data());
    ::_exit(127);
  }
  if (pid < 0) return c;
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0)
    if (errno != EINTR) return c;
  if (WIFEXITED(status)) c.exit_code = WEXITSTATUS(status);
  c.out = slurp(out_path);
  c.err = slurp(err_path);
  if (WIFSIGNALED(status))
    c.err += "(killed by signal " + std::to_string(WTERMSIG(status)) +
             (WTERMSIG(status) == SIGALRM ? ", timed out" : "") + ")\n";
  return c;
}

// Lines of `text` (without the final newline's empty line).
inline int count_lines(const std::string& text) {
  int n = 0;
  for (char ch : text) n += ch == '\n';
  if (!text.empty() && text.back() != '\n') ++n;
  return n;
}

}  // namespace tpusim::testing
