#include "isa/bundle/bundle_file.h"

#include <algorithm>
#include <cstring>

#include "isa/asm/encoding.h"
#include "isa/io/npy.h"

namespace tpusim::isa {

namespace {

class Writer {
 public:
  void u8(uint8_t v) { out.push_back(v); }
  void u32(uint32_t v) {
    for (int i = 0; i < 4; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
  }
  void u64(uint64_t v) {
    for (int i = 0; i < 8; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
  }
  void str(const std::string& s) {
    u32(static_cast<uint32_t>(s.size()));
    out.insert(out.end(), s.begin(), s.end());
  }
  void bytes(const std::vector<uint8_t>& b) {
    u64(b.size());
    out.insert(out.end(), b.begin(), b.end());
  }
  std::vector<uint8_t> out;
};

class Reader {
 public:
  Reader(const std::vector<uint8_t>& b, const std::string& name) : b_(b), name_(name) {}
  [[noreturn]] void fail(const std::string& what) const {
    throw BundleError(name_ + ": bad bundle: " + what + " (at byte " + std::to_string(pos_) + ")");
  }
  void need(uint64_t n, const char* what) const {
    if (n > b_.size() - pos_) fail(std::string("truncated ") + what);
  }
  uint8_t u8(const char* what) {
    need(1, what);
    return b_[pos_++];
  }
  uint32_t u32(const char* what) {
    need(4, what);
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(b_[pos_++]) << (8 * i);
    return v;
  }
  uint64_t u64(const char* what) {
    need(8, what);
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(b_[pos_++]) << (8 * i);
    return v;
  }
  std::string str(const char* what) {
    uint32_t n = u32(what);
    need(n, what);
    std::string s(reinterpret_cast<const char*>(b_.data() + pos_), n);
    pos_ += n;
    return s;
  }
  std::vector<uint8_t> bytes(const char* what) {
    uint64_t n = u64(what);
    need(n, what);
    std::vector<uint8_t> v(b_.begin() + static_cast<std::ptrdiff_t>(pos_),
                           b_.begin() + static_cast<std::ptrdiff_t>(pos_ + n));
    pos_ += n;
    return v;
  }
  // A count of items each at least `min_item_bytes` long: bounded by what is left,
  // so a corrupt count cannot make the loader allocate gigabytes.
  uint64_t count(const char* what, uint64_t min_item_bytes) {
    uint64_t n = u32(what);
    if (n * min_item_bytes > b_.size() - pos_) fail(std::string("truncated ") + what);
    return n;
  }
  bool at_end() const { return pos_ == b_.size(); }

 private:
  const std::vector<uint8_t>& b_;
  const std::string& name_;
  size_t pos_ = 0;
};

// A place in the I/O table, an entry's own and each further one alike: u8 space,
// u32 chip, u32 core, u64 address. `table` names the table in messages.
void write_place(Writer& w, const IoPlace& p) {
  w.u8(static_cast<uint8_t>(p.space));
  w.u32(p.chip);
  w.u32(p.core);
  w.u64(p.addr);
}
IoPlace read_place(Reader& r, const char* space_what, const char* table) {
  IoPlace p;
  const uint8_t sp = r.u8(space_what);
  if (sp >= kSpaceCount) r.fail(std::string("bad memory space in the ") + table);
  p.space = static_cast<Space>(sp);
  p.chip = r.u32(table);
  p.core = r.u32(table);
  p.addr = r.u64(table);
  return p;
}

}  // namespace

std::vector<uint8_t> serialize_bundle(const Bundle& b) {
  Writer w;
  // Version 2 sections: the cores' VMEM plans and the op name table.
  bool plan = !b.op_names.empty();
  for (const auto& p : b.cores) plan |= !p.vmem_plan.empty();
  bool places = false;
  for (const auto& e : b.io) places |= e.spread != IoSpread::kOne;
  const bool flops = !b.op_flops.empty() || places;  // each version has the sections of the ones before
  plan |= flops;
  for (char c : kBundleMagic) w.u8(static_cast<uint8_t>(c));
  w.u32(places ? kBundleVersionPlaces : flops ? kBundleVersionFlops : plan ? kBundleVersion : kBundleVersionNoPlan);
  const Target& t = b.target;
  w.u32(t.chips);
  w.u32(t.cores_per_chip);
  w.u32(t.mxus_per_core);
  w.u32(t.mxu_rows);
  w.u32(t.mxu_cols);
  w.u32(t.fifo_rows);
  w.u64(t.vmem_bytes);
  w.u64(t.smem_bytes);
  w.u64(t.hbm_bytes);
  w.u64(t.host_bytes);
  w.u32(static_cast<uint32_t>(b.cores.size()));
  for (const auto& p : b.cores) {
    w.u32(p.chip);
    w.u32(p.core);
    w.str(p.source);
    const auto words = encode(p.code);
    w.u32(static_cast<uint32_t>(p.code.size()));
    w.u32(static_cast<uint32_t>(words.size()));
    for (uint64_t x : words) w.u64(x);
    for (const auto& in : p.code) {
      w.u32(in.line);
      w.u32(static_cast<uint32_t>(in.op_id));
    }
    w.u32(static_cast<uint32_t>(p.labels.size()));
    for (const auto& l : p.labels) {
      w.str(l.first);
      w.u32(l.second);
    }
    if (plan) {
      w.u32(static_cast<uint32_t>(p.vmem_plan.size()));
      for (const auto& v : p.vmem_plan) {
        w.u32(static_cast<uint32_t>(v.op_id));
        w.u64(v.addr);
        w.u64(v.bytes);
      }
    }
  }
  w.u32(static_cast<uint32_t>(b.io.size()));
  for (const auto& e : b.io) {
    w.u8(static_cast<uint8_t>(e.kind));
    w.str(e.name);
    w.u8(static_cast<uint8_t>(e.dtype));
    w.u32(static_cast<uint32_t>(e.shape.size()));
    for (auto d : e.shape) w.u64(static_cast<uint64_t>(d));
    w.u32(static_cast<uint32_t>(e.strides.size()));
    for (auto s : e.strides) w.u64(static_cast<uint64_t>(s));
    write_place(w, {e.space, e.chip, e.core, e.addr});
    w.bytes(e.data);
    if (places) {
      w.u8(static_cast<uint8_t>(e.spread));
      w.u32(static_cast<uint32_t>(e.more.size()));
      for (const auto& pl : e.more) write_place(w, pl);
    }
  }
  if (plan) {
    w.u32(static_cast<uint32_t>(b.op_names.size()));
    for (const auto& [id, name] : b.op_names) {
      w.u32(static_cast<uint32_t>(id));
      w.str(name);
    }
  }
  if (flops) {
    w.u32(static_cast<uint32_t>(b.op_flops.size()));
    for (const auto& [id, n] : b.op_flops) {
      w.u32(static_cast<uint32_t>(id));
      w.u64(n);
    }
  }
  // Trailer: total length, so truncation at any section boundary is detected.
  w.u64(w.out.size() + 8);
  return std::move(w.out);
}

Bundle parse_bundle(const std::vector<uint8_t>& bytes, const std::string& name) {
  Reader r(bytes, name);
  if (bytes.size() < 12 || std::memcmp(bytes.data(), kBundleMagic, 8) != 0)
    throw BundleError(name + ": not a tpusim bundle (bad magic)" +
                      std::string(name.size() > 2 && name.compare(name.size() - 2, 2, ".s") == 0
                                      ? "; assemble a program with `tpusim asm FILE.s -o FILE.tpb` first"
                                      : ""));
  for (int i = 0; i < 8; ++i) r.u8("magic");
  const uint32_t version = r.u32("version");
  if (version < kBundleVersionNoPlan || version > kBundleVersionPlaces)
    throw BundleError(name + ": bundle format version " + std::to_string(version) + ", this tpusim reads versions " +
                      std::to_string(kBundleVersionNoPlan) + " to " + std::to_string(kBundleVersionPlaces) +
                      " (re-assemble or re-compile it)");
  Bundle b;
  Target& t = b.target;
  t.chips = r.u32("target");
  t.cores_per_chip = r.u32("target");
  t.mxus_per_core = r.u32("target");
  t.mxu_rows = r.u32("target");
  t.mxu_cols = r.u32("target");
  t.fifo_rows = r.u32("target");
  t.vmem_bytes = r.u64("target");
  t.smem_bytes = r.u64("target");
  t.hbm_bytes = r.u64("target");
  t.host_bytes = r.u64("target");
  const uint64_t ncores = r.count("core table", 20);
  for (uint64_t c = 0; c < ncores; ++c) {
    CoreProgram p;
    p.chip = r.u32("core table");
    p.core = r.u32("core table");
    p.source = r.str("core source name");
    const uint64_t ninstr = r.u32("instruction count");
    const uint64_t nwords = r.count("instruction words", 8);
    std::vector<uint64_t> words(nwords);
    for (auto& x : words) x = r.u64("instruction words");
    try {
      p.code = decode(words.data(), words.size());
    } catch (const DecodeError& e) {
      r.fail("chip" + std::to_string(p.chip) + ".core" + std::to_string(p.core) + " code: " + e.what());
    }
    if (p.code.size() != ninstr) r.fail("instruction count does not match the code");
    r.need(8 * ninstr, "line table");
    for (auto& in : p.code) {
      in.line = r.u32("line table");
      in.op_id = static_cast<int32_t>(r.u32("op id table"));
    }
    const uint64_t nlabels = r.count("label table", 8);
    for (uint64_t l = 0; l < nlabels; ++l) {
      std::string n = r.str("label table");
      p.labels.push_back({n, r.u32("label table")});
    }
    if (version >= 2) {
      const uint64_t nplan = r.count("VMEM plan", 20);
      for (uint64_t v = 0; v < nplan; ++v) {
        VmemBuffer buf;
        buf.op_id = static_cast<int32_t>(r.u32("VMEM plan"));
        buf.addr = r.u64("VMEM plan");
        buf.bytes = r.u64("VMEM plan");
        p.vmem_plan.push_back(buf);
      }
    }
    b.cores.push_back(std::move(p));
  }
  const uint64_t nio = r.count("I/O table", 30);
  for (uint64_t i = 0; i < nio; ++i) {
    IoEntry e;
    const uint8_t kind = r.u8("I/O table");
    if (kind > 2) r.fail("bad I/O kind");
    e.kind = static_cast<IoKind>(kind);
    e.name = r.str("I/O name");
    const uint8_t dt = r.u8("I/O dtype");
    if (dt > 2) r.fail("bad dtype in the I/O table");
    e.dtype = static_cast<Dtype>(dt);
    const uint64_t rank = r.count("I/O shape", 8);
    for (uint64_t d = 0; d < rank; ++d) e.shape.push_back(static_cast<int64_t>(r.u64("I/O shape")));
    const uint64_t ns = r.count("I/O strides", 8);
    for (uint64_t d = 0; d < ns; ++d) e.strides.push_back(static_cast<int64_t>(r.u64("I/O strides")));
    const IoPlace own = read_place(r, "I/O space", "I/O table");
    e.space = own.space;
    e.chip = own.chip;
    e.core = own.core;
    e.addr = own.addr;
    e.data = r.bytes("constant data");
    if (version >= kBundleVersionPlaces) {
      const uint8_t spread = r.u8("I/O spread");
      if (spread > 2) r.fail("bad spread in the I/O table");
      e.spread = static_cast<IoSpread>(spread);
      const uint64_t nplaces = r.count("I/O places", 17);
      for (uint64_t k = 0; k < nplaces; ++k) e.more.push_back(read_place(r, "I/O places", "I/O places"));
    }
    b.io.push_back(std::move(e));
  }
  if (version >= 2) {
    const uint64_t nnames = r.count("op name table", 8);
    for (uint64_t i = 0; i < nnames; ++i) {
      const auto id = static_cast<int32_t>(r.u32("op name table"));
      std::string name = r.str("op name table");
      if (!b.op_names.emplace(id, std::move(name)).second) r.fail("op " + std::to_string(id) + " named twice");
    }
  }
  if (version >= 3) {
    const uint64_t n = r.count("op FLOPs table", 12);
    for (uint64_t i = 0; i < n; ++i) {
      const auto id = static_cast<int32_t>(r.u32("op FLOPs table"));
      if (!b.op_flops.emplace(id, r.u64("op FLOPs table")).second)
        r.fail("op " + std::to_string(id) + " has FLOPs twice");
    }
  }
  const uint64_t total = r.u64("trailer");
  if (total != bytes.size()) r.fail("length trailer does not match the file size");
  if (!r.at_end()) r.fail("trailing bytes");
  std::string err = check_bundle(b);
  if (!err.empty()) throw BundleError(name + ": inconsistent bundle: " + err);
  return b;
}

std::map<int32_t, uint64_t> vmem_in_use_by_op(const CoreProgram& prog) {
  std::map<int32_t, std::vector<std::pair<uint64_t, uint64_t>>> spans;
  for (const auto& v : prog.vmem_plan) spans[v.op_id].push_back({v.addr, v.addr + v.bytes});
  std::map<int32_t, uint64_t> use;
  for (auto& [op, list] : spans) {
    std::sort(list.begin(), list.end());
    uint64_t total = 0, lo = list[0].first, hi = list[0].second;
    for (const auto& [b, e] : list) {
      if (b > hi) {
        total += hi - lo;
        lo = b;
      }
      hi = std::max(hi, e);
    }
    use[op] = total + (hi - lo);
  }
  return use;
}

Bundle read_bundle(const std::string& path) {
  std::vector<uint8_t> bytes;
  try {
    bytes = io::read_file(path);
  } catch (const std::exception& e) {
    throw BundleError(e.what());
  }
  return parse_bundle(bytes, path);
}

void write_bundle(const std::string& path, const Bundle& b) {
  try {
    io::write_file_atomic(path, serialize_bundle(b));
  } catch (const std::exception& e) {
    throw BundleError(e.what());
  }
}

}  // namespace tpusim::isa
