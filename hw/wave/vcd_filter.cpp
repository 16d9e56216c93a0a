#include "hw/wave/vcd_filter.h"

#include <fcntl.h>
#include <fnmatch.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <istream>
#include <map>
#include <ostream>
#include <sstream>
#include <stdexcept>

extern char** environ;

namespace tpusim::wave {

namespace {

// SystemC puts every traced variable under a root scope named after the kernel.
constexpr const char* kSystemCRoot = "SystemC";

uint64_t unit_in_ps(const std::string& text) {
  // "1 ps", "10ns", "1 us" ...
  size_t i = 0;
  while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
  size_t j = i;
  while (j < text.size() && std::isdigit(static_cast<unsigned char>(text[j]))) ++j;
  if (j == i) throw std::runtime_error("VCD: malformed $timescale '" + text + "'");
  const uint64_t n = std::stoull(text.substr(i, j - i));
  std::string unit;
  for (; j < text.size(); ++j)
    if (!std::isspace(static_cast<unsigned char>(text[j]))) unit += text[j];
  if (unit == "ps") return n;
  if (unit == "ns") return n * 1000;
  if (unit == "us") return n * 1000000;
  if (unit == "ms") return n * 1000000000ull;
  if (unit == "s") return n * 1000000000000ull;
  throw std::runtime_error("VCD: $timescale unit '" + unit + "' finer than ps is not supported");
}

// The identifier code a value-change line refers to, and whether it is one.
bool change_id(const std::string& line, std::string& id) {
  if (line.empty()) return false;
  const char c = line[0];
  if (c == 'b' || c == 'B' || c == 'r' || c == 'R') {
    const auto sp = line.find(' ');
    if (sp == std::string::npos) return false;
    id = line.substr(sp + 1);
    while (!id.empty() && std::isspace(static_cast<unsigned char>(id.front()))) id.erase(id.begin());
    return !id.empty();
  }
  if (c == '0' || c == '1' || c == 'x' || c == 'X' || c == 'z' || c == 'Z') {
    id = line.substr(1);
    return !id.empty();
  }
  return false;
}

std::string join(const std::vector<std::string>& parts) {
  std::string out;
  for (const auto& p : parts) out += (out.empty() ? "" : ".") + p;
  return out;
}

}  // namespace

bool scope_matches(const std::vector<std::string>& scopes, const std::string& name) {
  if (scopes.empty()) return true;
  for (const auto& glob : scopes) {
    if (fnmatch(glob.c_str(), name.c_str(), 0) == 0) return true;
    if (fnmatch((glob + ".*").c_str(), name.c_str(), 0) == 0) return true;
  }
  return false;
}

void filter_vcd(std::istream& in, std::ostream& out, const FilterOptions& options) {
  // Header: copy declarations of kept variables, with the scopes that hold them.
  std::vector<std::string> scope_path;          // as in the file, SystemC root included
  size_t written_depth = 0;                     // how many of scope_path are written
  std::map<std::string, bool> kept;             // id -> kept
  std::string timescale_text;
  std::string line;
  std::ostringstream header;
  header << "$version\n tpusim (SystemC sc_trace, filtered)\n$end\n";
  bool in_timescale = false, in_skip = false, definitions_done = false;
  while (!definitions_done && std::getline(in, line)) {
    std::istringstream words(line);
    std::string w;
    words >> w;
    if (in_timescale) {
      if (w == "$end") {
        in_timescale = false;
        header << "$timescale\n " << timescale_text << "\n$end\n";
      } else {
        timescale_text += line;
      }
      continue;
    }
    if (in_skip) {
      if (line.find("$end") != std::string::npos) in_skip = false;
      continue;
    }
    if (w == "$date" || w == "$version" || w == "$comment") {
      if (line.find("$end") == std::string::npos) in_skip = true;
    } else if (w == "$timescale") {
      std::string rest;
      std::getline(words, rest);
      const auto end = rest.find("$end");
      if (end != std::string::npos) {
        timescale_text = rest.substr(0, end);
        header << "$timescale\n " << timescale_text << "\n$end\n";
      } else {
        timescale_text = rest;
        in_timescale = true;
      }
    } else if (w == "$scope") {
      std::string kind, name;
      words >> kind >> name;
      scope_path.push_back(name);
    } else if (w == "$upscope") {
      if (scope_path.empty()) throw std::runtime_error("VCD: $upscope without $scope");
      if (written_depth == scope_path.size()) {
        header << "$upscope $end\n";
        --written_depth;
      }
      scope_path.pop_back();
    } else if (w == "$var") {
      std::string type, width, id, name;
      words >> type >> width >> id >> name;
      if (id.empty() || name.empty()) throw std::runtime_error("VCD: malformed $var line '" + line + "'");
      std::vector<std::string> full(scope_path.begin(), scope_path.end());
      if (!full.empty() && full.front() == kSystemCRoot) full.erase(full.begin());
      full.push_back(name);
      const bool keep = scope_matches(options.scopes, join(full));
      kept[id] = keep;
      if (keep) {
        for (; written_depth < scope_path.size(); ++written_depth)
          header << "$scope module " << scope_path[written_depth] << " $end\n";
        header << line << "\n";
      }
    } else if (w == "$enddefinitions") {
      while (written_depth > 0) {
        header << "$upscope $end\n";
        --written_depth;
      }
      header << "$enddefinitions $end\n";
      definitions_done = true;
    }
  }
  if (!definitions_done) throw std::runtime_error("VCD: no $enddefinitions (truncated file?)");
  const uint64_t unit_ps = timescale_text.empty() ? 1 : unit_in_ps(timescale_text);
  const uint64_t begin = options.begin_ps / unit_ps;
  const uint64_t end = options.end_ps == std::numeric_limits<uint64_t>::max() ? options.end_ps : options.end_ps / unit_ps;
  out << header.str();

  // Body: values before the window only update the current state; the window
  // opens with a dump of that state.
  std::map<std::string, std::string> current;  // id -> last change line, kept ids only
  bool window_open = false;
  uint64_t now = 0;
  auto open_window = [&](uint64_t at) {
    out << "#" << at << "\n$dumpvars\n";
    for (const auto& [id, change] : current) out << change << "\n";
    out << "$end\n";
    window_open = true;
  };
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    if (line[0] == '#') {
      try {
        now = std::stoull(line.substr(1));
      } catch (const std::exception&) {
        throw std::runtime_error("VCD: malformed time '" + line + "'");
      }
      if (now > end) break;
      if (!window_open && now >= begin) open_window(begin);
      if (window_open && now > begin) out << line << "\n";
      continue;
    }
    std::string id;
    if (!change_id(line, id)) continue;  // $dumpvars, $end, $comment and the like
    auto k = kept.find(id);
    if (k == kept.end()) throw std::runtime_error("VCD: value change for undeclared id '" + id + "'");
    if (!k->second) continue;
    current[id] = line;
    if (window_open && now >= begin) out << line << "\n";
  }
  if (!window_open) open_window(begin);
  if (end != std::numeric_limits<uint64_t>::max()) out << "#" << end << "\n";
}

void finish_wave(const std::string& raw_vcd, const std::string& out_path, const FilterOptions& options) {
  namespace fs = std::filesystem;
  const bool fst = fs::path(out_path).extension() == ".fst";
  const std::string filtered = out_path + (fst ? ".partial.vcd" : ".partial");
  {
    std::ifstream in(raw_vcd);
    if (!in) throw std::runtime_error(raw_vcd + ": cannot read the traced waveform");
    std::ofstream out(filtered, std::ios::trunc);
    if (!out) throw std::runtime_error(out_path + ": cannot write the waveform");
    // vcd2fst stamps the conversion's wall-clock time into the FST header unless
    // the VCD has a $date, so two runs of one program gave different .fst bytes.
    if (fst) out << "$date\n not recorded (tpusim waveforms are deterministic)\n$end\n";
    try {
      filter_vcd(in, out, options);
    } catch (...) {
      out.close();
      std::remove(filtered.c_str());
      throw;
    }
    if (!out.flush()) {
      std::remove(filtered.c_str());
      throw std::runtime_error(out_path + ": error while writing the waveform");
    }
  }
  std::string ready = filtered;
  if (fst) {
    ready = out_path + ".partial";
    const char* argv[] = {"vcd2fst", filtered.c_str(), ready.c_str(), nullptr};
    pid_t pid = 0;
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
    int rc = posix_spawnp(&pid, "vcd2fst", &actions, nullptr, const_cast<char* const*>(argv), environ);
    posix_spawn_file_actions_destroy(&actions);
    int status = 0;
    if (rc == 0) waitpid(pid, &status, 0);
    std::remove(filtered.c_str());
    if (rc != 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0 || !fs::exists(ready)) {
      std::remove(ready.c_str());
      throw std::runtime_error(out_path + ": vcd2fst failed (is gtkwave installed?)");
    }
  }
  std::error_code ec;
  fs::rename(ready, out_path, ec);
  if (ec) {
    std::remove(ready.c_str());
    throw std::runtime_error(out_path + ": cannot write the waveform: " + ec.message());
  }
}

}  // namespace tpusim::wave
