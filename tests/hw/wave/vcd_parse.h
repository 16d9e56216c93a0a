// A VCD as the tests read it: every variable by its full name (scopes joined with
// '.', SystemC's root scope left out), each change with its time, the last value,
// and the times seen. Binary values come out as decimal text, whatever their zero
// padding; real values as written.
#pragma once

#include <cstdint>
#include <map>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace tpusim::testing {

struct ParsedVcd {
  std::map<std::string, std::string> id_to_name;
  std::map<std::string, std::string> last;  // name -> last value text
  std::map<std::string, std::vector<std::pair<uint64_t, std::string>>> changes;  // name -> (time, value text)
  std::vector<uint64_t> times;
};

inline ParsedVcd parse_vcd(const std::string& vcd) {
  ParsedVcd p;
  std::istringstream in(vcd);
  std::string line;
  std::vector<std::string> scope;
  uint64_t now = 0;
  while (std::getline(in, line)) {
    std::istringstream w(line);
    std::string a, b, c, d, e;
    w >> a;
    if (a == "$scope") {
      w >> b >> c;
      scope.push_back(c);
    } else if (a == "$upscope") {
      scope.pop_back();
    } else if (a == "$var") {
      w >> b >> c >> d >> e;
      std::string full;
      for (const auto& s : scope)
        if (s != "SystemC") full += s + ".";  // the kernel's root scope
      p.id_to_name[d] = full + e;
    } else if (!a.empty() && a[0] == '#') {
      now = std::stoull(a.substr(1));
      p.times.push_back(now);
    } else if (!a.empty() && (a[0] == 'b' || a[0] == 'r')) {
      w >> b;
      const std::string& name = p.id_to_name.at(b);
      const std::string value = a[0] == 'b' ? std::to_string(std::stoull(a.substr(1), nullptr, 2)) : a.substr(1);
      p.last[name] = value;
      p.changes[name].emplace_back(now, value);
    }
  }
  return p;
}

}  // namespace tpusim::testing
