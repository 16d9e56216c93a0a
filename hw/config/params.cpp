#include "hw/config/params.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>

namespace tpusim::config {

namespace fs = std::filesystem;

namespace {

// Const lookup: the non-const operator[] of yaml-cpp may insert the key it asks for.
YAML::Node child(const YAML::Node& n, const std::string& key) { return n[key]; }

std::vector<std::string> split_key(const std::string& key) {
  std::vector<std::string> parts;
  std::string part;
  std::istringstream in(key);
  while (std::getline(in, part, '.')) parts.push_back(part);
  return parts;
}

// Deep merge of `over` onto `base` (both mappings): mappings merge key by key,
// anything else replaces. Returns a fresh tree; neither input is modified.
YAML::Node merged(const YAML::Node& base, const YAML::Node& over) {
  if (!base.IsMap() || !over.IsMap()) return YAML::Clone(over);
  YAML::Node out = YAML::Clone(base);
  for (const auto& kv : over) {
    const std::string k = kv.first.as<std::string>();
    const YAML::Node prev = child(out, k);
    out[k] = prev ? merged(prev, kv.second) : YAML::Clone(kv.second);
  }
  return out;
}

YAML::Node load_yaml_file(const fs::path& path) {
  if (fs::is_directory(path)) throw ConfigError(path.string() + ": is a directory, not a preset file");
  std::ifstream in(path);
  if (!in) throw ConfigError(path.string() + ": cannot open");
  std::stringstream text;
  text << in.rdbuf();
  try {
    return YAML::Load(text.str());
  } catch (const YAML::Exception& e) {
    throw ConfigError(path.string() + ":" + std::to_string(e.mark.line + 1) + ":" +
                      std::to_string(e.mark.column + 1) + ": " + e.msg);
  }
}

// "FILE:LINE:COLUMN" of a node read from FILE (just FILE for a node built here).
std::string where(const fs::path& file, const YAML::Node& n) {
  const YAML::Mark m = n.Mark();
  if (m.is_null()) return file.string();
  return file.string() + ":" + std::to_string(m.line + 1) + ":" + std::to_string(m.column + 1);
}

// The text of a key or an include path; yaml-cpp would throw a "bad conversion" that
// names no file for a list or a mapping written there.
std::string scalar_text(const YAML::Node& n, const fs::path& file, const char* what) {
  if (!n.IsScalar()) throw ConfigError(where(file, n) + ": " + what + " must be a plain word, not a list or a section");
  return n.Scalar();
}

// Replaces every `include:` mapping below `node`, read from `file`, by the merge it
// stands for. `chain` is the files being included, outermost first, to name a cycle.
YAML::Node resolve_includes(const YAML::Node& node, const fs::path& file, std::vector<fs::path>& chain) {
  if (!node.IsMap()) return node;
  YAML::Node own(YAML::NodeType::Map);
  for (const auto& kv : node) {
    const std::string k = scalar_text(kv.first, file, "a key");
    if (k != "include") own[k] = resolve_includes(kv.second, file, chain);
  }
  const YAML::Node include = child(node, "include");
  if (!include) return own;
  const std::string rel = scalar_text(include, file, "an include");
  const fs::path inc = file.parent_path() / rel;
  const std::string at = where(file, include) + ": include '" + rel + "': ";
  for (const fs::path& f : chain) {
    std::error_code ec;
    if (fs::equivalent(f, inc, ec)) throw ConfigError(at + "includes itself (through " + f.string() + ")");
  }
  if (chain.size() > 16) throw ConfigError(at + "includes nested more than 16 deep");
  YAML::Node loaded;
  try {
    loaded = load_yaml_file(inc);
  } catch (const ConfigError& e) {
    throw ConfigError(at + e.what());
  }
  chain.push_back(inc);
  YAML::Node base = resolve_includes(loaded, inc, chain);
  chain.pop_back();
  if (!base.IsMap()) throw ConfigError(at + inc.string() + ": an included file must hold a mapping");
  return merged(base, own);
}

void collect_leaves(const YAML::Node& node, const std::string& prefix, std::vector<std::string>& out) {
  if (node.IsMap()) {
    for (const auto& kv : node)
      collect_leaves(kv.second, prefix.empty() ? kv.first.as<std::string>() : prefix + "." + kv.first.as<std::string>(),
                     out);
  } else {
    out.push_back(prefix);
  }
}

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] != b[j - 1])});
      diag = up;
    }
  }
  return row[b.size()];
}

enum class Kind { kInt, kDouble, kBool, kString, kList, kMap };

Kind kind_of(const YAML::Node& n) {
  if (n.IsMap()) return Kind::kMap;
  if (n.IsSequence()) return Kind::kList;
  int64_t i;
  double d;
  bool b;
  if (YAML::convert<int64_t>::decode(n, i)) return Kind::kInt;
  if (YAML::convert<double>::decode(n, d)) return Kind::kDouble;
  if (YAML::convert<bool>::decode(n, b)) return Kind::kBool;
  return Kind::kString;
}

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::kInt: return "an integer";
    case Kind::kDouble: return "a number";
    case Kind::kBool: return "true or false";
    case Kind::kString: return "a string";
    case Kind::kList: return "a list like [1, 2]";
    case Kind::kMap: return "a section";
  }
  return "?";
}

template <typename T>
T convert_or_throw(const YAML::Node& n, const std::string& source, const std::string& key, const char* what) {
  T value;
  if (!n.IsScalar() || !YAML::convert<T>::decode(n, value))
    throw ConfigError(source + ": " + key + ": expected " + what);
  return value;
}

}  // namespace

Params Params::load(const std::string& path) {
  Params p;
  p.source_ = path;
  std::vector<fs::path> chain{path};
  p.root_ = resolve_includes(load_yaml_file(path), path, chain);
  if (!p.root_.IsMap()) throw ConfigError(path + ": a preset must be a mapping of parameters");
  return p;
}

Params Params::parse(const std::string& yaml_text, const std::string& source_name) {
  Params p;
  p.source_ = source_name;
  try {
    p.root_ = YAML::Load(yaml_text);
  } catch (const YAML::Exception& e) {
    throw ConfigError(source_name + ":" + std::to_string(e.mark.line + 1) + ": " + e.msg);
  }
  // Includes are relative to the folder source_name names, the working directory
  // for a bare name.
  std::vector<fs::path> chain;
  p.root_ = resolve_includes(p.root_, source_name, chain);
  if (!p.root_.IsMap()) throw ConfigError(source_name + ": a preset must be a mapping of parameters");
  return p;
}

std::string Params::nearest_key(const std::string& key) const {
  std::string best;
  size_t best_d = 4;  // suggest only near misses
  for (const auto& k : leaf_keys()) {
    const size_t d = edit_distance(k, key);
    if (d < best_d) best_d = d, best = k;
  }
  return best;
}

YAML::Node Params::find(const std::string& key) const {
  YAML::Node walk = root_;
  for (const auto& part : split_key(key)) {
    if (!walk.IsMap() || !child(walk, part)) {
      // A unit asked for a key the preset lacks: the file left it out, or misspelt it.
      std::string msg = source_ + ": missing parameter '" + key + "'";
      const std::string near = nearest_key(key);
      if (!near.empty()) msg += " (the preset has '" + near + "')";
      throw ConfigError(msg);
    }
    walk.reset(child(walk, part));  // reset, not =: Node::operator= would rewrite the tree
  }
  return walk;
}

bool Params::has(const std::string& key) const {
  YAML::Node walk = root_;
  for (const auto& part : split_key(key)) {
    if (!walk.IsMap() || !child(walk, part)) return false;
    walk.reset(child(walk, part));  // reset, not =: Node::operator= would rewrite the tree
  }
  return true;
}

void Params::set(const std::string& assignment) {
  const auto eq = assignment.find('=');
  if (eq == std::string::npos || eq == 0)
    throw ConfigError("--set " + assignment + ": expected KEY=VALUE");
  set(assignment.substr(0, eq), assignment.substr(eq + 1));
}

void Params::set(const std::string& key, const std::string& value) {
  if (!has(key)) {
    // Every parameter is in the preset file, so an override of another key is a typo.
    std::string msg = source_ + ": unknown parameter '" + key + "'";
    const std::string near = nearest_key(key);
    if (!near.empty()) msg += " (did you mean '" + near + "'?)";
    throw ConfigError(msg);
  }
  const YAML::Node old = find(key);
  const Kind want = kind_of(old);
  if (want == Kind::kMap) throw ConfigError("--set " + key + ": names a section, not a parameter");
  YAML::Node parsed;
  try {
    parsed = YAML::Load(value);
  } catch (const YAML::Exception&) {
    throw ConfigError("--set " + key + "=" + value + ": expected " + kind_name(want));
  }
  Kind got = parsed.IsNull() ? Kind::kString : kind_of(parsed);
  // Sweeps write clocks and sizes as 1.2e9 or 4e6: a number that is a whole
  // integer (and exact in a double) is one.
  if (want == Kind::kInt && got == Kind::kDouble) {
    const double d = parsed.as<double>();
    if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) <= 9007199254740992.0)
      parsed = YAML::Node(static_cast<int64_t>(d)), got = Kind::kInt;
  }
  // An integer is a fine value for a number; a number with a fraction is not an integer.
  const bool ok = got == want || (want == Kind::kDouble && got == Kind::kInt) ||
                  (want == Kind::kString && (got == Kind::kInt || got == Kind::kDouble || got == Kind::kBool));
  if (!ok || (want == Kind::kString && value.empty()))
    throw ConfigError("--set " + key + "=" + value + ": expected " + kind_name(want));
  if (want == Kind::kList) {
    for (const auto& item : parsed)
      if (kind_of(item) != kind_of(old[0]) && !(kind_of(old[0]) == Kind::kDouble && kind_of(item) == Kind::kInt))
        throw ConfigError("--set " + key + "=" + value + ": list items must be " + kind_name(kind_of(old[0])));
  }
  if (loaded_.IsNull()) loaded_ = YAML::Clone(root_);
  // Rebuild the path so the new node replaces the old one in the tree.
  auto parts = split_key(key);
  std::function<void(YAML::Node, size_t)> assign = [&](YAML::Node n, size_t i) {
    if (i + 1 == parts.size()) {
      n[parts[i]] = want == Kind::kString ? YAML::Node(value) : parsed;
      return;
    }
    assign(n[parts[i]], i + 1);
  };
  assign(root_, 0);
}

int64_t Params::get_int(const std::string& key) const {
  return convert_or_throw<int64_t>(find(key), source_, key, "an integer");
}

double Params::get_double(const std::string& key) const {
  return convert_or_throw<double>(find(key), source_, key, "a number");
}

bool Params::get_bool(const std::string& key) const {
  return convert_or_throw<bool>(find(key), source_, key, "true or false");
}

std::string Params::get_string(const std::string& key) const {
  return convert_or_throw<std::string>(find(key), source_, key, "a string");
}

std::vector<double> Params::get_double_list(const std::string& key) const {
  const YAML::Node n = find(key);
  if (!n.IsSequence()) throw ConfigError(source_ + ": " + key + ": expected a list of numbers");
  std::vector<double> out;
  for (const auto& item : n) out.push_back(convert_or_throw<double>(item, source_, key, "a list of numbers"));
  return out;
}

std::vector<int64_t> Params::get_int_list(const std::string& key) const {
  const YAML::Node n = find(key);
  if (!n.IsSequence()) throw ConfigError(source_ + ": " + key + ": expected a list of integers");
  std::vector<int64_t> out;
  for (const auto& item : n) out.push_back(convert_or_throw<int64_t>(item, source_, key, "a list of integers"));
  return out;
}

YAML::Node Params::node(const std::string& key) const { return YAML::Clone(find(key)); }

Params Params::as_loaded() const {
  Params p;
  p.source_ = source_;
  p.root_ = YAML::Clone(loaded_.IsNull() ? root_ : loaded_);
  return p;
}

std::vector<std::string> Params::leaf_keys() const {
  std::vector<std::string> out;
  collect_leaves(root_, "", out);
  std::sort(out.begin(), out.end());
  return out;
}

std::string Params::dump() const {
  YAML::Emitter out;
  out << root_;
  return out.c_str();
}

std::string configs_dir() {
  if (const char* env = std::getenv("TPUSIM_CONFIGS"); env && *env) return env;
  return TPUSIM_SOURCE_CONFIGS_DIR;
}

std::string find_preset(const std::string& name_or_path) {
  if (name_or_path.find('/') != std::string::npos || fs::path(name_or_path).extension() == ".yaml") {
    if (fs::is_regular_file(name_or_path)) return name_or_path;
    if (fs::is_directory(name_or_path)) throw ConfigError(name_or_path + ": is a directory, not a preset file");
    throw ConfigError(name_or_path + ": no such preset file");
  }
  for (const char* kind : {"chips", "boards"}) {
    fs::path p = fs::path(configs_dir()) / kind / (name_or_path + ".yaml");
    if (fs::is_regular_file(p)) return p.string();
  }
  std::string known;
  for (const auto& n : preset_names()) known += (known.empty() ? "" : ", ") + n;
  throw ConfigError("unknown preset '" + name_or_path + "' (known: " + known + ")");
}

std::vector<std::string> preset_names() {
  std::vector<std::string> names;
  for (const char* kind : {"chips", "boards"}) {
    fs::path dir = fs::path(configs_dir()) / kind;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(dir, ec))
      if (e.path().extension() == ".yaml") names.push_back(e.path().stem().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

Params load_preset(const std::string& name_or_path, const std::vector<std::string>& overrides) {
  Params p = Params::load(find_preset(name_or_path));
  for (const auto& o : overrides) p.set(o);
  return p;
}

}  // namespace tpusim::config
