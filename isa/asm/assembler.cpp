#include "isa/asm/assembler.h"

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>

#include "isa/io/npy.h"
#include "isa/io/printable.h"
#include "isa/numerics/bf16.h"

namespace tpusim::isa {

namespace {

enum class Tok { kIdent, kNumber, kString, kPunct };

struct Token {
  Tok kind;
  std::string text;
  int col;  // 1-based
};

struct Fixup {
  size_t core_index, instr_index;
  std::string label;
  int line, col;
};

struct CoreSel {
  uint32_t chip, core;
};

bool is_ident_start(char c) { return std::isalpha(static_cast<unsigned char>(c)) || c == '_' || c == '.'; }
bool is_ident_char(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' || c == '@';
}

class Assembler {
 public:
  Assembler(const std::string& file, const std::string& base) : file_(file), base_(base) {}

  Bundle run(const std::string& text);

 private:
  // Error at the current line and the column of token `t` (or no column).
  [[noreturn]] void error_at(int col, const std::string& msg) const {
    std::string s = file_ + ":" + std::to_string(line_);
    if (col > 0) s += ":" + std::to_string(col);
    throw AsmError(s + ": error: " + msg);
  }
  [[noreturn]] void error(const Token& t, const std::string& msg) const { error_at(t.col, msg); }

  std::vector<Token> tokenize(const std::string& line);
  void parse_line(const std::vector<Token>& toks);
  void directive(const std::vector<Token>& toks);
  void instruction(const std::vector<Token>& toks, size_t start);

  // Operand parsing over a token range [b, e).
  using Range = std::pair<size_t, size_t>;
  std::vector<Range> split_commas(const std::vector<Token>& t, size_t b, size_t e) const;
  int64_t expr(const std::vector<Token>& t, size_t& i, size_t e) const;
  int64_t expr_term(const std::vector<Token>& t, size_t& i, size_t e) const;
  int64_t expr_factor(const std::vector<Token>& t, size_t& i, size_t e) const;
  int64_t full_expr(const std::vector<Token>& t, Range r) const;
  int32_t imm32(const std::vector<Token>& t, Range r) const;
  uint32_t float_bits(const std::vector<Token>& t, Range r, bool bf16) const;
  int reg(const std::vector<Token>& t, Range r, char prefix, int limit, const char* what) const;
  int flag_operand(const std::vector<Token>& t, Range r) const;
  void address(const std::vector<Token>& t, Range r, uint8_t& base, int32_t& offset) const;
  void location(const Token& tok, Space& space, int& chip, int& core, bool io) const;
  DmaEndpoint endpoint(const std::vector<Token>& t, Range r) const;
  void parse_with(const OpInfo& info, const std::vector<Token>& t, const std::vector<Range>& ops, Instr& in,
                  std::string& label, int& label_col);
  void io_directive(const std::vector<Token>& t, IoKind kind);
  CoreProgram& current();

  std::string file_, base_;
  int line_ = 0;
  Bundle bundle_;
  bool target_given_ = false;
  bool code_seen_ = false;
  std::map<std::string, int64_t> symbols_;
  std::map<std::string, int> flags_;
  std::vector<std::map<std::string, uint32_t>> labels_;  // per core program
  std::vector<Fixup> fixups_;
  int cur_ = -1;
  int32_t op_id_ = -1;
};

std::vector<Token> Assembler::tokenize(const std::string& s) {
  std::vector<Token> out;
  size_t i = 0;
  while (i < s.size()) {
    char c = s[i];
    if (c == '#') break;
    if (c == ' ' || c == '\t' || c == '\r') {
      ++i;
      continue;
    }
    int col = static_cast<int>(i) + 1;
    if (std::isdigit(static_cast<unsigned char>(c))) {
      size_t j = i;
      bool hex = s.compare(i, 2, "0x") == 0 || s.compare(i, 2, "0X") == 0;
      while (j < s.size()) {
        char d = s[j];
        if (std::isalnum(static_cast<unsigned char>(d)) || d == '.' || d == '_') {
          ++j;
        } else if ((d == '+' || d == '-') && !hex && j > i && (s[j - 1] == 'e' || s[j - 1] == 'E')) {
          ++j;
        } else {
          break;
        }
      }
      out.push_back({Tok::kNumber, s.substr(i, j - i), col});
      i = j;
    } else if (is_ident_start(c)) {
      size_t j = i;
      while (j < s.size() && is_ident_char(s[j])) ++j;
      out.push_back({Tok::kIdent, s.substr(i, j - i), col});
      i = j;
    } else if (c == '"') {
      size_t j = s.find('"', i + 1);
      if (j == std::string::npos) error_at(col, "unterminated string");
      out.push_back({Tok::kString, s.substr(i + 1, j - i - 1), col});
      i = j + 1;
    } else if (std::strchr(",[]()+-*:=/", c)) {
      out.push_back({Tok::kPunct, std::string(1, c), col});
      ++i;
    } else {
      error_at(col, std::string("unexpected character '") + io::printable(c) + "'");
    }
  }
  return out;
}

std::vector<Assembler::Range> Assembler::split_commas(const std::vector<Token>& t, size_t b, size_t e) const {
  std::vector<Range> out;
  int depth = 0;
  size_t start = b;
  for (size_t i = b; i < e; ++i) {
    if (t[i].kind != Tok::kPunct) continue;
    const char c = t[i].text[0];
    if (c == '[' || c == '(') ++depth;
    if (c == ']' || c == ')') {
      if (--depth < 0) error(t[i], std::string("unbalanced '") + c + "'");
    }
    if (c == ',' && depth == 0) {
      if (start == i) error(t[i], "empty operand");
      out.push_back({start, i});
      start = i + 1;
    }
  }
  if (depth != 0) error(t[e - 1], "unbalanced brackets");
  if (start < e) {
    out.push_back({start, e});
  } else if (e > b) {
    error(t[e - 1], "empty operand after ','");
  }
  return out;
}

// Integer literal: decimal or 0x hex, optional K/M/G (x1024^n) suffix.
bool parse_int_literal(const std::string& s, int64_t& v) {
  std::string body = s;
  int64_t mult = 1;
  if (!body.empty() && !(body.size() > 2 && (body[1] == 'x' || body[1] == 'X'))) {
    char suf = body.back();
    if (suf == 'K' || suf == 'k') mult = 1ll << 10;
    if (suf == 'M') mult = 1ll << 20;
    if (suf == 'G') mult = 1ll << 30;
    if (mult != 1) body.pop_back();
  }
  if (body.empty() || body.size() > 20) return false;
  errno = 0;
  char* end = nullptr;
  unsigned long long u = std::strtoull(body.c_str(), &end, 0);
  if (errno || *end || body[0] == '-' || body[0] == '+') return false;
  if (u > (1ull << 48)) return false;
  if (static_cast<int64_t>(u) > (1ll << 48) / mult) return false;
  v = static_cast<int64_t>(u) * mult;
  return true;
}

int64_t Assembler::expr_factor(const std::vector<Token>& t, size_t& i, size_t e) const {
  if (i >= e) error_at(i > 0 && i - 1 < t.size() ? t[i - 1].col : 0, "expected a value");
  const Token& k = t[i];
  if (k.kind == Tok::kPunct && k.text == "-") {
    ++i;
    return -expr_factor(t, i, e);
  }
  if (k.kind == Tok::kPunct && k.text == "(") {
    ++i;
    int64_t v = expr(t, i, e);
    if (i >= e || t[i].text != ")") error(k, "expected ')'");
    ++i;
    return v;
  }
  if (k.kind == Tok::kNumber) {
    int64_t v;
    if (!parse_int_literal(k.text, v)) error(k, "bad integer '" + k.text + "'");
    ++i;
    return v;
  }
  if (k.kind == Tok::kIdent) {
    auto it = symbols_.find(k.text);
    if (it == symbols_.end()) error(k, "undefined symbol '" + k.text + "'");
    ++i;
    return it->second;
  }
  error(k, "expected a value, got '" + k.text + "'");
}

int64_t Assembler::expr_term(const std::vector<Token>& t, size_t& i, size_t e) const {
  int64_t v = expr_factor(t, i, e);
  while (i < e && t[i].kind == Tok::kPunct && (t[i].text == "*" || t[i].text == "/")) {
    const Token& op = t[i++];
    int64_t r = expr_factor(t, i, e);
    if (op.text == "*") {
      if (v != 0 && (std::llabs(r) > (1ll << 50) / std::max<int64_t>(1, std::llabs(v)))) error(op, "value too large");
      v *= r;
    } else {
      if (r == 0) error(op, "division by zero in expression");
      v /= r;
    }
  }
  return v;
}

int64_t Assembler::expr(const std::vector<Token>& t, size_t& i, size_t e) const {
  int64_t v = expr_term(t, i, e);
  while (i < e && t[i].kind == Tok::kPunct && (t[i].text == "+" || t[i].text == "-")) {
    const bool plus = t[i++].text == "+";
    int64_t r = expr_term(t, i, e);
    v = plus ? v + r : v - r;
    if (std::llabs(v) > (1ll << 50)) error(t[i - 1], "value too large");
  }
  return v;
}

int64_t Assembler::full_expr(const std::vector<Token>& t, Range r) const {
  size_t i = r.first;
  int64_t v = expr(t, i, r.second);
  if (i != r.second) error(t[i], "unexpected '" + t[i].text + "' in expression");
  return v;
}

int32_t Assembler::imm32(const std::vector<Token>& t, Range r) const {
  int64_t v = full_expr(t, r);
  if (v < INT32_MIN || v > static_cast<int64_t>(UINT32_MAX)) error(t[r.first], "immediate does not fit in 32 bits");
  return static_cast<int32_t>(static_cast<uint32_t>(v));
}

// fp32 (or bf16) literal: decimal float, inf, nan, or 0x raw bits.
uint32_t Assembler::float_bits(const std::vector<Token>& t, Range r, bool bf16) const {
  size_t i = r.first;
  bool negative = false;
  if (i < r.second && t[i].text == "-") {
    negative = true;
    ++i;
  }
  if (i + 1 != r.second) error(t[r.first], "expected a floating-point literal");
  const Token& k = t[i];
  uint32_t bits;
  if (k.kind == Tok::kNumber && (k.text.rfind("0x", 0) == 0 || k.text.rfind("0X", 0) == 0)) {
    int64_t v;
    if (!parse_int_literal(k.text, v) || v > (bf16 ? 0xFFFF : 0xFFFFFFFFll)) error(k, "bad raw bit pattern '" + k.text + "'");
    bits = static_cast<uint32_t>(v);
    if (negative) bits ^= bf16 ? 0x8000u : 0x80000000u;
    return bits;
  }
  float f;
  if (k.kind == Tok::kIdent && (k.text == "inf" || k.text == "nan")) {
    f = k.text == "inf" ? INFINITY : NAN;
  } else if (k.kind == Tok::kNumber) {
    errno = 0;
    char* end = nullptr;
    f = std::strtof(k.text.c_str(), &end);
    if (*end || k.text.find_first_of("xX") != std::string::npos) error(k, "bad number '" + k.text + "'");
  } else {
    error(k, "expected a floating-point literal, got '" + k.text + "'");
  }
  bits = num::f32_bits(f);
  if (negative) bits ^= 0x80000000u;
  if (bf16) bits = num::fp32_to_bf16(num::f32_from_bits(bits));
  return bits;
}

int Assembler::reg(const std::vector<Token>& t, Range r, char prefix, int limit, const char* what) const {
  const Token& k = t[r.first];
  if (r.second != r.first + 1 || k.kind != Tok::kIdent) error(k, std::string("expected ") + what);
  const std::string& s = k.text;
  size_t plen = prefix == 'x' ? 3 : 1;
  if (prefix == 'x' ? s.rfind("mxu", 0) != 0 : s[0] != prefix) error(k, std::string("expected ") + what + ", got '" + s + "'");
  if (s.size() <= plen || s.size() > plen + 3) error(k, std::string("expected ") + what + ", got '" + s + "'");
  int v = 0;
  for (size_t j = plen; j < s.size(); ++j) {
    if (!std::isdigit(static_cast<unsigned char>(s[j]))) error(k, std::string("expected ") + what + ", got '" + s + "'");
    v = v * 10 + (s[j] - '0');
  }
  if (v >= limit) {
    std::string noun = what;
    if (noun.rfind("a ", 0) == 0) noun = noun.substr(2);
    if (noun.rfind("an ", 0) == 0) noun = noun.substr(3);
    noun = noun.substr(0, noun.find(" ("));
    error(k, noun + " '" + s + "' out of range (0.." + std::to_string(limit - 1) + ")");
  }
  return v;
}

int Assembler::flag_operand(const std::vector<Token>& t, Range r) const {
  const Token& k = t[r.first];
  if (r.second == r.first + 1 && k.kind == Tok::kIdent) {
    auto it = flags_.find(k.text);
    if (it != flags_.end()) return it->second;
  }
  static const std::string what = "a sync flag (f0..f" + std::to_string(kSyncFlags - 1) + " or a .flag name)";
  return reg(t, r, 'f', kSyncFlags, what.c_str());
}

void Assembler::address(const std::vector<Token>& t, Range r, uint8_t& base, int32_t& offset) const {
  if (t[r.first].text != "[" || t[r.second - 1].text != "]") error(t[r.first], "expected an address [sN + offset]");
  size_t b = r.first + 1, e = r.second - 1;
  if (b == e) error(t[r.first], "empty address");
  base = 0;
  offset = 0;
  const Token& k = t[b];
  if (k.kind == Tok::kIdent && k.text.size() >= 2 && k.text[0] == 's' &&
      std::isdigit(static_cast<unsigned char>(k.text[1])) && symbols_.find(k.text) == symbols_.end()) {
    base = static_cast<uint8_t>(reg(t, {b, b + 1}, 's', kScalarRegs, "a scalar register"));
    ++b;
    if (b == e) return;
    if (t[b].text != "+" && t[b].text != "-") error(t[b], "expected '+' or '-' after the base register");
    if (t[b].text == "+") ++b;  // '-' stays as a unary minus of the expression
  }
  offset = imm32(t, {b, e});
}

// SPACE[@chipN[.cM]|@cM] as one identifier token.
void Assembler::location(const Token& tok, Space& space, int& chip, int& core, bool io) const {
  const std::string& s = tok.text;
  size_t at = s.find('@');
  std::string sp = s.substr(0, at);
  if (sp == "hbm") space = Space::kHbm;
  else if (sp == "vmem") space = Space::kVmem;
  else if (sp == "smem") space = Space::kSmem;
  else if (sp == "host") space = Space::kHost;
  else error(tok, "unknown memory space '" + sp + "' (hbm, vmem, smem, host)");
  chip = -1;
  core = -1;
  if (at == std::string::npos) return;
  std::string rest = s.substr(at + 1);
  auto number = [&](const std::string& x, size_t from) {
    if (from >= x.size() || x.size() - from > 4) error(tok, "bad target '" + s + "'");
    int v = 0;
    for (size_t j = from; j < x.size(); ++j) {
      if (!std::isdigit(static_cast<unsigned char>(x[j]))) error(tok, "bad target '" + s + "'");
      v = v * 10 + (x[j] - '0');
    }
    return v;
  };
  std::string chip_part = rest, core_part;
  size_t dot = rest.find('.');
  if (dot != std::string::npos) {
    chip_part = rest.substr(0, dot);
    core_part = rest.substr(dot + 1);
  }
  if (chip_part.rfind("chip", 0) == 0) {
    chip = number(chip_part, 4);
  } else if (dot == std::string::npos && !chip_part.empty() && chip_part[0] == 'c') {
    core_part = chip_part;
  } else {
    error(tok, "bad target '" + s + "' (use @chipN, @cM or @chipN.cM)");
  }
  if (!core_part.empty()) {
    if (core_part.rfind("core", 0) == 0) core = number(core_part, 4);
    else if (core_part[0] == 'c') core = number(core_part, 1);
    else error(tok, "bad target '" + s + "'");
  }
  (void)io;
}

DmaEndpoint Assembler::endpoint(const std::vector<Token>& t, Range r) const {
  if (r.second - r.first < 3 || t[r.first].kind != Tok::kIdent || t[r.first + 1].text != ":")
    error(t[r.first], "expected a DMA endpoint SPACE:[sN + offset]");
  DmaEndpoint e;
  int chip, core;
  location(t[r.first], e.space, chip, core, false);
  e.chip = static_cast<int16_t>(chip);
  e.core = static_cast<int16_t>(core);
  address(t, {r.first + 2, r.second}, e.reg, e.offset);
  return e;
}

CoreProgram& Assembler::current() {
  if (cur_ < 0) {
    bundle_.cores.push_back(CoreProgram{0, 0, file_, {}, {}, {}});
    labels_.emplace_back();
    cur_ = 0;
  }
  return bundle_.cores[static_cast<size_t>(cur_)];
}

void Assembler::parse_with(const OpInfo& info, const std::vector<Token>& t, const std::vector<Range>& ops, Instr& in,
                           std::string& label, int& label_col) {
  size_t npos = std::strlen(info.signature);
  if (info.op == Op::kDma) npos = 2;
  // Positional operands come first; key=value options after.
  size_t positional = 0;
  while (positional < ops.size() &&
         !(ops[positional].second - ops[positional].first >= 2 && t[ops[positional].first].kind == Tok::kIdent &&
           t[ops[positional].first + 1].text == "="))
    ++positional;
  if (positional != npos) {
    const Token& k = ops.empty() ? t.back() : t[ops[0].first - 1];  // the mnemonic
    error(k, std::string("'") + info.mnemonic + "' takes " + std::to_string(npos) + " operand(s), got " +
                 std::to_string(positional));
  }
  uint16_t* regs[4] = {&in.a, &in.b, &in.c, &in.d};
  int r = 0, imms = 0;
  auto put_imm = [&](int32_t v) { (imms++ == 0 ? in.imm : in.imm2) = v; };
  if (info.op == Op::kDma) {
    in.dst = endpoint(t, ops[0]);
    in.src = endpoint(t, ops[1]);
  } else {
    for (size_t j = 0; j < npos; ++j) {
      const Range o = ops[j];
      switch (info.signature[j]) {
        case 'S': *regs[r++] = static_cast<uint8_t>(reg(t, o, 's', kScalarRegs, "a scalar register")); break;
        case 'V': *regs[r++] = static_cast<uint8_t>(reg(t, o, 'v', kVectorRegs, "a vector register")); break;
        case 'M': *regs[r++] = static_cast<uint8_t>(reg(t, o, 'm', kMaskRegs, "a mask register")); break;
        case 'X': *regs[r++] = static_cast<uint8_t>(reg(t, o, 'x', 16, "an MXU (mxuN)")); break;
        case 'F': *regs[r++] = static_cast<uint16_t>(flag_operand(t, o)); break;
        case 'I': put_imm(imm32(t, o)); break;
        case 'R': put_imm(static_cast<int32_t>(float_bits(t, o, false))); break;
        case 'L':
          if (o.second != o.first + 1 || t[o.first].kind != Tok::kIdent) error(t[o.first], "expected a label");
          label = t[o.first].text;
          label_col = t[o.first].col;
          put_imm(0);
          break;
        case 'A': {
          int32_t off;
          uint8_t base;
          address(t, o, base, off);
          *regs[r++] = base;
          put_imm(off);
          break;
        }
        default: break;
      }
    }
  }
  // Defaults of the options.
  if (info.flags & kOpOptMask) r++;  // mask field c, default m0
  if (info.flags & kOpOptStride)
    in.imm2 = (info.op == Op::kVldBf16 || info.op == Op::kVstBf16) ? 2 * kLanes : 4 * kLanes;
  bool seen_bytes = false;
  for (size_t j = positional; j < ops.size(); ++j) {
    const Range o = ops[j];
    if (!(o.second - o.first >= 3 && t[o.first].kind == Tok::kIdent && t[o.first + 1].text == "="))
      error(t[o.first], "positional operand after an option");
    const std::string& key = t[o.first].text;
    const Range v{o.first + 2, o.second};
    if (key == "stride" && (info.flags & kOpOptStride)) {
      in.imm2 = imm32(t, v);
    } else if (key == "mask" && (info.flags & kOpOptMask)) {
      in.c = static_cast<uint8_t>(reg(t, v, 'm', kMaskRegs, "a mask register"));
    } else if (key == "k" && (info.flags & kOpOptK)) {
      in.imm = imm32(t, v);
    } else if (info.op == Op::kDma && key == "bytes") {
      in.imm = imm32(t, v);
      seen_bytes = true;
    } else if (info.op == Op::kDma && key == "dim") {
      if (in.ndims >= kMaxDmaDims) error(t[o.first], "at most 3 'dim=' per DMA");
      // dim=COUNT:SRC_STRIDE:DST_STRIDE
      std::vector<Range> parts;
      size_t s = v.first;
      for (size_t q = v.first; q <= v.second; ++q)
        if (q == v.second || t[q].text == ":") {
          if (q == s) error(t[std::min(q, v.second - 1)], "empty field in dim=COUNT:SRC_STRIDE:DST_STRIDE");
          parts.push_back({s, q});
          s = q + 1;
        }
      if (parts.size() != 3) error(t[o.first], "expected dim=COUNT:SRC_STRIDE:DST_STRIDE");
      int64_t count = full_expr(t, parts[0]);
      if (count < 0 || count > static_cast<int64_t>(UINT32_MAX)) error(t[parts[0].first], "bad dimension count");
      DmaDim& d = in.dims[in.ndims++];
      d.count = static_cast<uint32_t>(count);
      d.src_stride = imm32(t, parts[1]);
      d.dst_stride = imm32(t, parts[2]);
    } else if (info.op == Op::kDma && key == "tc") {
      const int64_t c = full_expr(t, v);
      if (c < 0 || c >= kTrafficClasses) error(t[v.first], "expected tc=0 (bulk) or tc=1 (urgent)");
      in.tc = static_cast<uint8_t>(c);
    } else if (info.op == Op::kDma && key == "way") {
      const std::string w = v.second == v.first + 1 ? t[v.first].text : "";
      if (w != "+" && w != "-") error(t[v.first], "expected way=+ or way=-");
      in.way = static_cast<int8_t>(w == "+" ? 1 : -1);
    } else if (info.op == Op::kDma && (key == "flag" || key == "rflag")) {
      (key == "flag" ? in.flag : in.rflag) = static_cast<int16_t>(flag_operand(t, v));
    } else {
      error(t[o.first], "unknown option '" + key + "' for '" + info.mnemonic + "'");
    }
  }
  if (info.op == Op::kDma && !seen_bytes) error(t[ops[0].first], "dma needs bytes=N");
  if (info.op == Op::kDma && in.imm < 0) error(t[ops[0].first], "negative DMA byte count");
}

void Assembler::instruction(const std::vector<Token>& t, size_t start) {
  const Token& m = t[start];
  if (m.kind != Tok::kIdent) error(m, "expected an instruction, got '" + m.text + "'");
  // The opcodes of each mnemonic (overloads: several), looked up once a line: a
  // compare against every opcode's mnemonic was a sixth of a 256-replica compile.
  static const std::map<std::string, std::vector<const OpInfo*>, std::less<>> by_mnemonic = [] {
    std::map<std::string, std::vector<const OpInfo*>, std::less<>> m;
    for (int o = 0; o < op_count(); ++o) m[op_info(static_cast<Op>(o)).mnemonic].push_back(&op_info(static_cast<Op>(o)));
    return m;
  }();
  const auto found = by_mnemonic.find(m.text);
  if (found == by_mnemonic.end()) error(m, "unknown instruction '" + m.text + "'");
  const std::vector<const OpInfo*>& cands = found->second;
  const auto ops = split_commas(t, start + 1, t.size());
  CoreProgram& prog = current();
  code_seen_ = true;
  // With overloads (add reg/imm, vbcast imm/reg) report the candidate that got
  // furthest into the line; on a tie, the later (more general) one.
  std::string best_error;
  int best_col = -1;
  for (const OpInfo* info : cands) {
    Instr in;
    in.op = info->op;
    std::string label;
    int label_col = 0;
    try {
      parse_with(*info, t, ops, in, label, label_col);
    } catch (const AsmError& e) {
      const std::string msg = e.what();
      const size_t c1 = msg.find(':', file_.size());
      const size_t c2 = c1 == std::string::npos ? c1 : msg.find(':', c1 + 1);
      const int col = c2 == std::string::npos ? 0 : std::atoi(msg.c_str() + c2 + 1);
      if (col >= best_col) {
        best_col = col;
        best_error = msg;
      }
      continue;
    }
    if (in.op == Op::kOpMark) op_id_ = in.imm;
    in.line = static_cast<uint32_t>(line_);
    in.op_id = op_id_;
    if (!label.empty())
      fixups_.push_back({static_cast<size_t>(cur_), prog.code.size(), label, line_, label_col});
    prog.code.push_back(in);
    return;
  }
  throw AsmError(best_error);
}

void Assembler::io_directive(const std::vector<Token>& t, IoKind kind) {
  // .input NAME DTYPE [SHAPE] LOC:ADDR [strides=[...]] [data=[...] | file="x.npy"]
  //        [split=[LOC:ADDR, ...] | copies=[LOC:ADDR, ...]]
  size_t i = 1;
  if (i >= t.size() || t[i].kind != Tok::kIdent) error_at(t[0].col, "expected a tensor name");
  IoEntry e;
  e.kind = kind;
  e.name = t[i++].text;
  if (i >= t.size()) error_at(t[0].col, "expected a dtype (f32, bf16, i32)");
  if (t[i].text == "f32") e.dtype = Dtype::kF32;
  else if (t[i].text == "bf16") e.dtype = Dtype::kBf16;
  else if (t[i].text == "i32") e.dtype = Dtype::kI32;
  else error(t[i], "unknown dtype '" + t[i].text + "' (f32, bf16, i32)");
  ++i;
  if (i >= t.size() || t[i].text != "[") error_at(i < t.size() ? t[i].col : t.back().col, "expected a shape [d0, d1, ...]");
  size_t close = i + 1;
  while (close < t.size() && t[close].text != "]") ++close;
  if (close >= t.size()) error(t[i], "unterminated shape");
  if (close > i + 1)
    for (auto r : split_commas(t, i + 1, close)) {
      int64_t d = full_expr(t, r);
      if (d < 0 || d > (1ll << 32)) error(t[r.first], "bad dimension");
      e.shape.push_back(d);
    }
  i = close + 1;
  if (i + 2 >= t.size() + 0 || t[i].kind != Tok::kIdent || t[i + 1].text != ":")
    error_at(i < t.size() ? t[i].col : t.back().col, "expected a location SPACE[@chipN.cM]:ADDR");
  int chip, core;
  location(t[i], e.space, chip, core, true);
  e.chip = chip < 0 ? 0 : static_cast<uint32_t>(chip);
  e.core = core < 0 ? 0 : static_cast<uint32_t>(core);
  size_t j = i + 2;
  size_t end = j;
  while (end < t.size() && !(t[end].kind == Tok::kIdent && end + 1 < t.size() && t[end + 1].text == "=")) ++end;
  int64_t addr = full_expr(t, {j, end});
  if (addr < 0) error(t[j], "negative address");
  e.addr = static_cast<uint64_t>(addr);
  i = end;
  bool have_data = false;
  while (i < t.size()) {
    const Token& key = t[i];
    if (key.kind != Tok::kIdent || i + 1 >= t.size() || t[i + 1].text != "=") error(key, "expected key=value");
    i += 2;
    if (key.text == "strides" || key.text == "data" || key.text == "split" || key.text == "copies") {
      if (i >= t.size() || t[i].text != "[") error(key, "expected '[' after " + key.text + "=");
      size_t c = i + 1;
      int depth = 1;
      while (c < t.size() && depth) {
        if (t[c].text == "[") ++depth;
        if (t[c].text == "]" && --depth == 0) break;
        ++c;
      }
      if (c >= t.size()) error(t[i], "unterminated list");
      auto items = c > i + 1 ? split_commas(t, i + 1, c) : std::vector<Range>{};
      if (key.text == "strides") {
        for (auto r : items) {
          int64_t s = full_expr(t, r);
          if (s < 0) error(t[r.first], "negative stride");
          e.strides.push_back(s);
        }
        if (e.strides.size() != e.shape.size()) error(key, "strides= needs one stride per dimension");
      } else if (key.text == "split" || key.text == "copies") {
        if (e.spread != IoSpread::kOne) error(key, "give one of split= and copies=, once");
        if (items.empty()) error(key, key.text + "= names no place");
        e.spread = key.text == "split" ? IoSpread::kSplit : IoSpread::kCopies;
        for (auto r : items) {
          if (r.second - r.first < 3 || t[r.first].kind != Tok::kIdent || t[r.first + 1].text != ":")
            error(t[r.first], "expected a place SPACE@chipN.cM:ADDR");
          IoPlace pl;
          int pchip, pcore;
          location(t[r.first], pl.space, pchip, pcore, true);
          pl.chip = pchip < 0 ? 0 : static_cast<uint32_t>(pchip);
          pl.core = pcore < 0 ? 0 : static_cast<uint32_t>(pcore);
          const int64_t a = full_expr(t, {r.first + 2, r.second});
          if (a < 0) error(t[r.first + 2], "negative address");
          pl.addr = static_cast<uint64_t>(a);
          e.more.push_back(pl);
        }
      } else {
        if (kind != IoKind::kConst) error(key, "only .const takes data");
        if (items.size() != e.elements())
          error(key, "data has " + std::to_string(items.size()) + " values, shape needs " + std::to_string(e.elements()));
        for (auto r : items) {
          if (e.dtype == Dtype::kI32) {
            int32_t v = imm32(t, r);
            for (int b = 0; b < 4; ++b) e.data.push_back(static_cast<uint8_t>(static_cast<uint32_t>(v) >> (8 * b)));
          } else {
            uint32_t bits = float_bits(t, r, e.dtype == Dtype::kBf16);
            for (size_t b = 0; b < dtype_size(e.dtype); ++b) e.data.push_back(static_cast<uint8_t>(bits >> (8 * b)));
          }
        }
        have_data = true;
      }
      i = c + 1;
    } else if (key.text == "file") {
      if (kind != IoKind::kConst) error(key, "only .const takes file=");
      if (i >= t.size() || (t[i].kind != Tok::kString && t[i].kind != Tok::kIdent)) error(key, "expected file=\"path.npy\"");
      std::string path = t[i].text;
      if (path.empty() || path[0] != '/') path = base_ + "/" + path;
      io::NpyArray a;
      try {
        a = io::read_npy(path);
      } catch (const std::exception& ex) {
        error(t[i], ex.what());
      }
      if (a.shape != e.shape) error(t[i], "shape of " + path + " does not match the declared shape");
      const size_t n = a.elements();
      if (e.dtype == Dtype::kF32 && a.dtype == io::NpyDtype::kF32) {
        e.data = a.data;
      } else if (e.dtype == Dtype::kI32 && a.dtype == io::NpyDtype::kI32) {
        e.data = a.data;
      } else if (e.dtype == Dtype::kBf16 && a.dtype == io::NpyDtype::kU16) {
        e.data = a.data;
      } else if (e.dtype == Dtype::kBf16 && a.dtype == io::NpyDtype::kF32) {
        for (size_t k = 0; k < n; ++k) {
          uint16_t h = num::fp32_to_bf16(a.as<float>()[k]);
          e.data.push_back(static_cast<uint8_t>(h));
          e.data.push_back(static_cast<uint8_t>(h >> 8));
        }
      } else {
        error(t[i], std::string("dtype of ") + path + " (" + io::npy_descr(a.dtype) + ") does not fit " +
                        dtype_name(e.dtype));
      }
      have_data = true;
      ++i;
    } else {
      error(key, "unknown key '" + key.text + "'");
    }
  }
  if (kind == IoKind::kConst && !have_data) error_at(t[0].col, ".const needs data=[...] or file=\"x.npy\"");
  for (const auto& o : bundle_.io)
    if (o.name == e.name) error(t[1], "'" + e.name + "' is already defined");
  bundle_.io.push_back(std::move(e));
}

void Assembler::directive(const std::vector<Token>& t) {
  const std::string& d = t[0].text;
  auto need = [&](size_t n, const char* usage) {
    if (t.size() < n) error(t[0], std::string("usage: ") + usage);
  };
  if (d == ".target") {
    if (code_seen_ || cur_ >= 0) error(t[0], ".target must come before any .core or code");
    for (size_t i = 1; i < t.size();) {
      if (t[i].kind != Tok::kIdent || i + 2 >= t.size() + 0 || t[i + 1].text != "=") error(t[i], "expected key=value");
      size_t e = i + 2;
      while (e < t.size() && !(t[e].kind == Tok::kIdent && e + 1 < t.size() && t[e + 1].text == "=")) ++e;
      const int64_t v = full_expr(t, {i + 2, e});
      if (v < 0) error(t[i + 2], "negative value");
      const std::string& k = t[i].text;
      Target& tg = bundle_.target;
      auto u32v = [&]() {
        if (v > UINT32_MAX) error(t[i + 2], "value too large");
        return static_cast<uint32_t>(v);
      };
      if (k == "chips") tg.chips = u32v();
      else if (k == "cores") tg.cores_per_chip = u32v();
      else if (k == "mxus") tg.mxus_per_core = u32v();
      else if (k == "mxu_rows") tg.mxu_rows = u32v();
      else if (k == "mxu_cols") tg.mxu_cols = u32v();
      else if (k == "fifo_rows") tg.fifo_rows = u32v();
      else if (k == "vmem") tg.vmem_bytes = static_cast<uint64_t>(v);
      else if (k == "smem") tg.smem_bytes = static_cast<uint64_t>(v);
      else if (k == "hbm") tg.hbm_bytes = static_cast<uint64_t>(v);
      else if (k == "host") tg.host_bytes = static_cast<uint64_t>(v);
      else error(t[i], "unknown target parameter '" + k + "'");
      i = e;
    }
    std::string err = bundle_.target.check();
    if (!err.empty()) error(t[0], err);
    target_given_ = true;
  } else if (d == ".core") {
    need(2, ".core chipN.coreM | .core M");
    if (t.size() != 2) error(t[2], "unexpected '" + t[2].text + "'");
    const std::string& s = t[1].text;
    uint32_t chip = 0, core = 0;
    int64_t v;
    if (t[1].kind == Tok::kNumber && parse_int_literal(s, v) && v < 255) {
      core = static_cast<uint32_t>(v);
    } else {
      Space sp;
      int c1, c2;
      location(Token{Tok::kIdent, "vmem@" + s, t[1].col}, sp, c1, c2, true);
      chip = c1 < 0 ? 0 : static_cast<uint32_t>(c1);
      core = c2 < 0 ? 0 : static_cast<uint32_t>(c2);
    }
    if (chip >= bundle_.target.chips || core >= bundle_.target.cores_per_chip) {
      if (target_given_)
        error(t[1], "chip" + std::to_string(chip) + ".core" + std::to_string(core) + " is outside the target (" +
                        std::to_string(bundle_.target.chips) + " chip(s) x " +
                        std::to_string(bundle_.target.cores_per_chip) + " core(s))");
      // Without .target the bundle grows to fit the cores used.
      bundle_.target.chips = std::max(bundle_.target.chips, chip + 1);
      bundle_.target.cores_per_chip = std::max(bundle_.target.cores_per_chip, core + 1);
    }
    cur_ = -1;
    for (size_t p = 0; p < bundle_.cores.size(); ++p)
      if (bundle_.cores[p].chip == chip && bundle_.cores[p].core == core) cur_ = static_cast<int>(p);
    if (cur_ < 0) {
      bundle_.cores.push_back(CoreProgram{chip, core, file_, {}, {}, {}});
      labels_.emplace_back();
      cur_ = static_cast<int>(bundle_.cores.size()) - 1;
    }
    op_id_ = -1;
  } else if (d == ".equ") {
    need(3, ".equ NAME VALUE");
    if (t[1].kind != Tok::kIdent) error(t[1], "expected a name");
    symbols_[t[1].text] = full_expr(t, {2, t.size()});
  } else if (d == ".region") {
    need(5, ".region NAME SPACE ADDR SIZE");
    if (t[1].kind != Tok::kIdent) error(t[1], "expected a name");
    Space sp;
    int c1, c2;
    location(t[2], sp, c1, c2, true);
    auto parts = split_commas(t, 3, t.size());
    // ADDR SIZE are two expressions separated by whitespace: split at the token
    // boundary where a complete expression ends.
    size_t i = 3;
    int64_t addr = expr(t, i, t.size());
    if (i >= t.size()) error(t.back(), "expected the region size");
    int64_t size = full_expr(t, {i, t.size()});
    (void)parts;
    symbols_[t[1].text] = addr;
    symbols_[t[1].text + ".size"] = size;
    symbols_[t[1].text + ".end"] = addr + size;
  } else if (d == ".flag") {
    need(3, ".flag NAME N");
    if (t[1].kind != Tok::kIdent) error(t[1], "expected a name");
    int64_t v = full_expr(t, {2, t.size()});
    if (v < 0 || v >= kSyncFlags) error(t[2], "flag number must be 0.." + std::to_string(kSyncFlags - 1));
    flags_[t[1].text] = static_cast<int>(v);
  } else if (d == ".vmem") {
    // A buffer of the current core's VMEM plan (instr.h VmemBuffer): op=N addr=A bytes=B.
    VmemBuffer v;
    bool have[3] = {false, false, false};
    for (size_t i = 1; i < t.size();) {
      if (t[i].kind != Tok::kIdent || i + 2 >= t.size() + 0 || t[i + 1].text != "=") error(t[i], "expected key=value");
      size_t e = i + 2;
      while (e < t.size() && !(t[e].kind == Tok::kIdent && e + 1 < t.size() && t[e + 1].text == "=")) ++e;
      const int64_t x = full_expr(t, {i + 2, e});
      const std::string& k = t[i].text;
      if (k == "op") {
        if (x < -1 || x > INT32_MAX) error(t[i + 2], "op id out of range (-1..2^31-1)");
        v.op_id = static_cast<int32_t>(x), have[0] = true;
      } else if (k == "addr" || k == "bytes") {
        if (x < 0) error(t[i + 2], "negative value");
        (k == "addr" ? v.addr : v.bytes) = static_cast<uint64_t>(x);
        have[k == "addr" ? 1 : 2] = true;
      } else {
        error(t[i], "unknown key '" + k + "' (op, addr, bytes)");
      }
      i = e;
    }
    if (!have[0] || !have[1] || !have[2]) error(t[0], "usage: .vmem op=N addr=A bytes=B");
    if (v.bytes == 0) error(t[0], "empty VMEM buffer");
    if (v.addr > bundle_.target.vmem_bytes || v.bytes > bundle_.target.vmem_bytes - v.addr)
      error(t[0], "VMEM buffer does not fit in vmem (" + std::to_string(bundle_.target.vmem_bytes) + " bytes)");
    current().vmem_plan.push_back(v);
  } else if (d == ".opname") {
    // The graph op behind an op id: .opname N "text" (for timelines).
    if (t.size() < 3 || t.back().kind != Tok::kString) error(t[0], "usage: .opname N \"name\"");
    const int64_t id = full_expr(t, {1, t.size() - 1});
    if (id < 0 || id > INT32_MAX) error(t[1], "op id out of range (0..2^31-1)");
    const std::string& name = t.back().text;
    if (name.empty() || name.size() > kMaxOpNameBytes)
      error(t.back(), "op name must be 1.." + std::to_string(kMaxOpNameBytes) + " bytes");
    for (char ch : name)
      if (static_cast<unsigned char>(ch) < 0x20 || ch == 0x7f) error(t.back(), "control character in an op name");
    if (!bundle_.op_names.emplace(static_cast<int32_t>(id), name).second)
      error(t[1], "op " + std::to_string(id) + " already has a name");
  } else if (d == ".opflops") {
    // The model FLOPs of the graph op behind an op id: .opflops N F (stats' flops).
    if (t.size() < 3) error(t[0], "usage: .opflops N FLOPS");
    const int64_t id = full_expr(t, {1, 2});
    if (id < 0 || id > INT32_MAX) error(t[1], "op id out of range (0..2^31-1)");
    const int64_t flops = full_expr(t, {2, t.size()});
    if (flops < 0) error(t[2], "FLOPs must be non-negative");
    if (!bundle_.op_flops.emplace(static_cast<int32_t>(id), static_cast<uint64_t>(flops)).second)
      error(t[1], "op " + std::to_string(id) + " already has FLOPs");
  } else if (d == ".input") {
    io_directive(t, IoKind::kInput);
  } else if (d == ".output") {
    io_directive(t, IoKind::kOutput);
  } else if (d == ".const") {
    io_directive(t, IoKind::kConst);
  } else {
    error(t[0], "unknown directive '" + d + "'");
  }
}

void Assembler::parse_line(const std::vector<Token>& t) {
  if (t.empty()) return;
  size_t start = 0;
  // Labels: NAME ':' at the start of a line (several may stack).
  while (start + 1 < t.size() && t[start].kind == Tok::kIdent && t[start].text[0] != '.' &&
         t[start + 1].text == ":") {
    CoreProgram& prog = current();
    auto& labels = labels_[static_cast<size_t>(cur_)];
    const std::string& name = t[start].text;
    if (labels.count(name)) error(t[start], "label '" + name + "' defined twice");
    labels[name] = static_cast<uint32_t>(prog.code.size());
    prog.labels.push_back({name, static_cast<uint32_t>(prog.code.size())});
    start += 2;
  }
  if (start >= t.size()) return;
  if (t[start].kind == Tok::kIdent && t[start].text[0] == '.') {
    if (start != 0) error(t[start], "a directive cannot follow a label");
    directive(t);
    return;
  }
  instruction(t, start);
}

Bundle Assembler::run(const std::string& text) {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    ++line_;
    if (line.size() > 1u << 20) error_at(0, "line too long");
    parse_line(tokenize(line));
  }
  for (const auto& f : fixups_) {
    const auto& labels = labels_[f.core_index];
    auto it = labels.find(f.label);
    line_ = f.line;
    if (it == labels.end()) error_at(f.col, "undefined label '" + f.label + "'");
    bundle_.cores[f.core_index].code[f.instr_index].imm = static_cast<int32_t>(it->second);
  }
  std::string err = check_bundle(bundle_);
  if (!err.empty()) {
    // Point at the instruction's line when the message names one.
    size_t p = err.find("(line ");
    if (p != std::string::npos) {
      line_ = std::atoi(err.c_str() + p + 6);
      error_at(0, err);
    }
    throw AsmError(file_ + ": error: " + err);
  }
  return std::move(bundle_);
}

std::string hex(uint64_t v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(v));
  return buf;
}

std::string float_text(uint32_t bits) {
  float f = num::f32_from_bits(bits);
  if (std::isnan(f)) return hex(bits);
  if (std::isinf(f)) return f > 0 ? "inf" : "-inf";
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.9g", static_cast<double>(f));
  std::string s = buf;
  // Keep it a float literal (the parser reads digits-only text the same way, but
  // a '.' says what it is).
  if (s.find_first_of(".en") == std::string::npos) s += ".0";
  return s;
}

std::string bf16_text(uint16_t h) {
  uint32_t bits = static_cast<uint32_t>(h) << 16;
  if (num::fp32_to_bf16(num::f32_from_bits(bits)) != h || std::isnan(num::f32_from_bits(bits))) return hex(h);
  return float_text(bits);
}

std::string endpoint_text(const DmaEndpoint& e) {
  std::string s = space_name(e.space);
  if (e.chip >= 0) {
    s += "@chip" + std::to_string(e.chip);
    if (e.core >= 0) s += ".c" + std::to_string(e.core);
  } else if (e.core >= 0) {
    s += "@c" + std::to_string(e.core);
  }
  return s + ":[s" + std::to_string(e.reg) + (e.offset < 0 ? " - " : " + ") +
         std::to_string(e.offset < 0 ? -static_cast<int64_t>(e.offset) : e.offset) + "]";
}

std::string addr_text(uint8_t reg, int32_t off) {
  return "[s" + std::to_string(reg) + (off < 0 ? " - " : " + ") +
         std::to_string(off < 0 ? -static_cast<int64_t>(off) : off) + "]";
}

}  // namespace

Bundle assemble(const std::string& text, const std::string& filename, const std::string& base_dir) {
  Assembler a(filename, base_dir);
  return a.run(text);
}

Bundle assemble_file(const std::string& path) {
  std::vector<uint8_t> bytes;
  try {
    bytes = io::read_file(path);
  } catch (const std::exception& e) {
    throw AsmError(std::string(e.what()));
  }
  size_t slash = path.find_last_of('/');
  std::string base = slash == std::string::npos ? "." : path.substr(0, slash);
  return assemble(std::string(bytes.begin(), bytes.end()), path, base);
}

std::string print_instr(const Instr& in, const CoreProgram& prog) {
  const OpInfo& info = op_info(in.op);
  std::string s = info.mnemonic;
  std::vector<std::string> ops;
  const uint16_t regs[4] = {in.a, in.b, in.c, in.d};
  int r = 0, imms = 0;
  auto next_imm = [&]() { return imms++ == 0 ? in.imm : in.imm2; };
  if (in.op == Op::kDma) {
    ops.push_back(endpoint_text(in.dst));
    ops.push_back(endpoint_text(in.src));
    ops.push_back("bytes=" + std::to_string(in.imm));
    for (int d = 0; d < in.ndims && d < kMaxDmaDims; ++d)
      ops.push_back("dim=" + std::to_string(in.dims[d].count) + ":" + std::to_string(in.dims[d].src_stride) + ":" +
                    std::to_string(in.dims[d].dst_stride));
    if (in.flag >= 0) ops.push_back("flag=f" + std::to_string(in.flag));
    if (in.rflag >= 0) ops.push_back("rflag=f" + std::to_string(in.rflag));
    if (in.tc) ops.push_back("tc=" + std::to_string(in.tc));
    if (in.way) ops.push_back(in.way > 0 ? "way=+" : "way=-");
  } else {
    for (const char* c = info.signature; *c; ++c) {
      switch (*c) {
        case 'S': ops.push_back("s" + std::to_string(regs[r++])); break;
        case 'V': ops.push_back("v" + std::to_string(regs[r++])); break;
        case 'M': ops.push_back("m" + std::to_string(regs[r++])); break;
        case 'X': ops.push_back("mxu" + std::to_string(regs[r++])); break;
        case 'F': ops.push_back("f" + std::to_string(regs[r++])); break;
        case 'I': ops.push_back(std::to_string(next_imm())); break;
        case 'R': ops.push_back(float_text(static_cast<uint32_t>(next_imm()))); break;
        case 'L': {
          const int32_t target = next_imm();
          std::string name;
          for (const auto& l : prog.labels)
            if (static_cast<int32_t>(l.second) == target) {
              name = l.first;
              break;
            }
          ops.push_back(name.empty() ? "__L" + std::to_string(target) : name);
          break;
        }
        case 'A': {
          uint8_t base = regs[r++];
          ops.push_back(addr_text(base, next_imm()));
          break;
        }
        default: break;
      }
    }
    if (info.flags & kOpOptStride) {
      const int32_t def = (in.op == Op::kVldBf16 || in.op == Op::kVstBf16) ? 2 * kLanes : 4 * kLanes;
      if (in.imm2 != def) ops.push_back("stride=" + std::to_string(in.imm2));
    }
    if ((info.flags & kOpOptMask) && in.c != 0) ops.push_back("mask=m" + std::to_string(in.c));
    if ((info.flags & kOpOptK) && in.imm != 0) ops.push_back("k=" + std::to_string(in.imm));
  }
  for (size_t i = 0; i < ops.size(); ++i) s += (i ? ", " : " ") + ops[i];
  return s;
}

std::string print_bundle(const Bundle& b, bool pcs) {
  std::ostringstream o;
  const Target& t = b.target;
  o << ".target chips=" << t.chips << " cores=" << t.cores_per_chip << " mxus=" << t.mxus_per_core
    << " mxu_rows=" << t.mxu_rows << " mxu_cols=" << t.mxu_cols << " fifo_rows=" << t.fifo_rows
    << " vmem=" << t.vmem_bytes << " smem=" << t.smem_bytes << " hbm=" << t.hbm_bytes << " host=" << t.host_bytes
    << "\n";
  for (const auto& e : b.io) {
    o << "." << io_kind_name(e.kind) << " " << e.name << " " << dtype_name(e.dtype) << " [";
    for (size_t i = 0; i < e.shape.size(); ++i) o << (i ? ", " : "") << e.shape[i];
    o << "] " << place_text({e.space, e.chip, e.core, e.addr});
    if (!e.strides.empty()) {
      o << " strides=[";
      for (size_t i = 0; i < e.strides.size(); ++i) o << (i ? ", " : "") << e.strides[i];
      o << "]";
    }
    if (e.spread != IoSpread::kOne) {
      o << " " << io_spread_name(e.spread) << "=[";
      for (size_t i = 0; i < e.more.size(); ++i) o << (i ? ", " : "") << place_text(e.more[i]);
      o << "]";
    }
    if (e.kind == IoKind::kConst) {
      o << " data=[";
      const size_t n = e.data.size() / dtype_size(e.dtype);
      for (size_t i = 0; i < n; ++i) {
        if (i) o << ", ";
        const uint8_t* p = e.data.data() + i * dtype_size(e.dtype);
        if (e.dtype == Dtype::kBf16) {
          o << bf16_text(static_cast<uint16_t>(p[0] | p[1] << 8));
        } else {
          uint32_t v = static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 |
                       static_cast<uint32_t>(p[2]) << 16 | static_cast<uint32_t>(p[3]) << 24;
          o << (e.dtype == Dtype::kI32 ? std::to_string(static_cast<int32_t>(v)) : float_text(v));
        }
      }
      o << "]";
    }
    o << "\n";
  }
  for (const auto& [id, name] : b.op_names) o << ".opname " << id << " \"" << name << "\"\n";
  for (const auto& [id, flops] : b.op_flops) o << ".opflops " << id << " " << flops << "\n";
  for (const auto& p : b.cores) {
    o << "\n.core chip" << p.chip << ".core" << p.core << "\n";
    for (const auto& v : p.vmem_plan)
      o << ".vmem op=" << v.op_id << " addr=" << hex(v.addr) << " bytes=" << v.bytes << "\n";
    // Labels the branches need but the program does not name.
    std::vector<std::pair<std::string, uint32_t>> labels = p.labels;
    for (const auto& in : p.code) {
      const char* sig = op_info(in.op).signature;
      if (std::strchr(sig, 'L') == nullptr || in.op == Op::kDma) continue;
      bool named = false;
      for (const auto& l : labels) named |= static_cast<int32_t>(l.second) == in.imm;
      if (!named) labels.push_back({"__L" + std::to_string(in.imm), static_cast<uint32_t>(in.imm)});
    }
    for (size_t i = 0; i <= p.code.size(); ++i) {
      for (const auto& l : labels)
        if (l.second == i) o << l.first << ":\n";
      if (i < p.code.size()) {
        o << "  " << print_instr(p.code[i], p);
        if (pcs) o << "  # pc " << i;
        o << "\n";
      }
    }
  }
  return o.str();
}

}  // namespace tpusim::isa
