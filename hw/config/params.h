// A chip or board preset as a tree of named parameters, read from the YAML files
// in configs/ and overridden by the user's `--set KEY=VALUE`. Keys are dotted
// paths ("core.mxu.rows"). Every parameter a preset can take is present in the
// preset file itself, so an override of a key the file lacks is a typo, reported
// with the nearest known key, never silently ignored.
#pragma once

#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace tpusim::config {

// Every configuration problem; the message names the file and the key.
class ConfigError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class Params {
 public:
  Params() = default;

  // Reads a YAML file. A mapping with an `include: PATH` entry (PATH relative to
  // the including file) is the included file's mapping with this mapping's other
  // entries merged over it, recursively; that is how a board builds on a chip and
  // a chip on an HBM timing table.
  static Params load(const std::string& path);
  static Params parse(const std::string& yaml_text, const std::string& source_name);

  // "KEY=VALUE": VALUE must have the type the preset gives KEY (integer, number,
  // boolean, string, or a list written in YAML flow style).
  void set(const std::string& assignment);
  void set(const std::string& key, const std::string& value);

  bool has(const std::string& key) const;
  int64_t get_int(const std::string& key) const;
  double get_double(const std::string& key) const;
  bool get_bool(const std::string& key) const;
  std::string get_string(const std::string& key) const;
  std::vector<double> get_double_list(const std::string& key) const;
  std::vector<int64_t> get_int_list(const std::string& key) const;
  // The subtree at KEY, for units that read a whole section (an HBM timing table).
  YAML::Node node(const std::string& key) const;
  // The preset as its file has it, before any `set` override: the hardware the
  // published figures were measured on. The DMA engine's share of the published
  // latency is taken against this memory, so a what-if memory (`--set hbm.*`)
  // changes the memory's share only.
  Params as_loaded() const;

  // Every leaf key, sorted, for listings and for "did you mean".
  std::vector<std::string> leaf_keys() const;
  // The whole tree after includes and overrides, as YAML text (deterministic).
  std::string dump() const;
  const std::string& source() const { return source_; }

 private:
  YAML::Node find(const std::string& key) const;  // throws on a missing key
  std::string nearest_key(const std::string& key) const;  // "" when none is near
  YAML::Node root_;
  YAML::Node loaded_;  // a copy of root_ before the first set(); null until then
  std::string source_;
};

// The folder that holds the preset files: $TPUSIM_CONFIGS if set, else the
// configs/ folder of the source tree this binary was built from.
std::string configs_dir();
// A preset by name (chips/NAME.yaml or boards/NAME.yaml under configs_dir()) or
// by a path to a YAML file; throws ConfigError naming what was tried.
std::string find_preset(const std::string& name_or_path);
// The names of all chip and board presets, sorted.
std::vector<std::string> preset_names();
// find_preset + load + every `--set` override, in order.
Params load_preset(const std::string& name_or_path, const std::vector<std::string>& overrides = {});

}  // namespace tpusim::config
