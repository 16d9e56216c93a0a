// The streamed all-reduce's consumes in arrival order (docs/codegen.md "Arrival
// order"). A stream's program order comes from a timed run of a rough model; on
// the chip the landings come in another order, and a core waiting on one landing
// cannot serve another that is already there (v4-4x4x4 32 MiB: ~1/3 of the
// landing-wait cycles had the next consume wholly ready). Here, at the first
// event not done, a dispatch lets one of the next few events that commute with
// everything before it go first, but only when every wait of its code already
// holds: it then cannot block on anything the program order would have done
// first, so the programs stay deadlock-free.
#include <cassert>

#include "compiler/lower/emitter.h"

namespace tpusim::compiler::lowering {

namespace {

// How many events a dispatch looks at: the first not done and up to 3 after it
// (v4-4x4x4 32 MiB: the next consume was wholly ready in 1/3 of the landing-wait
// cycles, one of the next 3 in 3/5).
constexpr size_t kArrivalWindow = 4;

// What an event's code does, read back from its text (only the lowering's own
// instructions are understood; anything else makes the event stay in place).
struct Range {
  char space;  // 'v' vmem, 'h' hbm, 's' smem
  int64_t lo, hi;
};
struct Dma {
  int flag = -1;
  std::vector<Range> reads, writes;  // local bytes only
};
struct EventCode {
  bool ok = true;
  std::vector<std::pair<int, int64_t>> waits;  // (flag, count), in order
  std::set<int> raises;                        // this core's flags it raises (fadd, DMA flags)
  std::vector<Range> reads, writes;            // local bytes
  std::vector<Dma> dmas;
  // A push into another core's HBM (a copy straight into its y): the receiver's
  // readiness for it is known only through earlier events' landings, so such an
  // event never goes early. Pushes into VMEM slots wait for their own credits.
  bool remote_hbm = false;
};

bool overlap(const std::vector<Range>& a, const std::vector<Range>& b) {
  for (const Range& x : a)
    for (const Range& y : b)
      if (x.space == y.space && x.lo < y.hi && y.lo < x.hi) return true;
  return false;
}

// "[sR + OFF]" with R one of the lowering's address bases (emitter.h addr_ref).
bool parse_addr(const std::string& t, int64_t* a) {
  int r = 0;
  long long off = 0;
  if (std::sscanf(t.c_str(), "[s%d + %lld]", &r, &off) != 2) return false;
  if (r == 0) *a = off;
  else if (r == 31) *a = kWindow1 + off;
  else if (r == 30) *a = kWindow2 + off;
  else return false;
  return true;
}

// "space[@target]:[sR + OFF]": local (no target) or not; false if not understood.
bool parse_endpoint(const std::string& t, bool* local, char* space, int64_t* a) {
  const size_t colon = t.find(':');
  if (colon == std::string::npos) return false;
  const std::string sp = t.substr(0, colon);
  *local = sp.find('@') == std::string::npos;
  *space = sp[0];
  if (*space != 'v' && *space != 'h' && *space != 's') return false;
  return parse_addr(t.substr(colon + 1), a);
}

int parse_flag(const std::string& t) {  // "fN"
  return t.size() > 1 && t[0] == 'f' ? std::atoi(t.c_str() + 1) : -1;
}

EventCode read_code(const std::string& text, int64_t tile_bytes) {
  EventCode c;
  std::istringstream in(text);
  std::string l;
  while (c.ok && std::getline(in, l)) {
    const size_t b = l.find_first_not_of(' ');
    if (b == std::string::npos) continue;
    l = l.substr(b);
    const std::string op = l.substr(0, l.find(' '));
    std::vector<std::string> args;  // the operands, split at ", "
    for (size_t p = op.size() + 1; p <= l.size();) {
      const size_t e = std::min(l.find(", ", p), l.size());
      args.push_back(l.substr(p, e - p));
      p = e + 2;
    }
    if (op == "wait" && args.size() == 2 && parse_flag(args[0]) >= 0) {
      c.waits.emplace_back(parse_flag(args[0]), std::atoll(args[1].c_str()));
    } else if ((op == "fadd" || op == "fset") && args.size() == 2 && parse_flag(args[0]) >= 0) {
      c.raises.insert(parse_flag(args[0]));
    } else if ((op == "vld" || op == "vst") && args.size() == 2) {
      int64_t a = 0;
      c.ok = parse_addr(args[1], &a);
      (op == "vld" ? c.reads : c.writes).push_back(Range{'v', a, a + tile_bytes});
    } else if (op == "vadd" && args.size() == 3) {
      // registers only: every event loads its operands before it adds
    } else if (op == "dma" && args.size() >= 3) {
      Dma d;
      bool dst_local = false, src_local = false;
      char ds = 0, ss = 0;
      int64_t da = 0, sa = 0, bytes = -1;
      c.ok = parse_endpoint(args[0], &dst_local, &ds, &da) && parse_endpoint(args[1], &src_local, &ss, &sa);
      for (size_t k = 2; k < args.size() && c.ok; ++k) {
        const std::string& o = args[k];
        if (o.rfind("bytes=", 0) == 0) bytes = std::atoll(o.c_str() + 6);
        else if (o.rfind("flag=", 0) == 0) d.flag = parse_flag(o.substr(5));
        else if (o.rfind("rflag=", 0) == 0) {
          if (dst_local) c.raises.insert(parse_flag(o.substr(6)));
        } else if (o != "tc=1" && o != "tc=0") c.ok = false;  // dim=...: strided, not read here
      }
      if (!c.ok || bytes < 0) {
        c.ok = false;
        break;
      }
      if (dst_local) d.writes.push_back(Range{ds, da, da + bytes});
      if (!dst_local && ds == 'h') c.remote_hbm = true;
      if (src_local) d.reads.push_back(Range{ss, sa, sa + bytes});
      if (d.flag >= 0) c.raises.insert(d.flag);
      c.reads.insert(c.reads.end(), d.reads.begin(), d.reads.end());
      c.writes.insert(c.writes.end(), d.writes.begin(), d.writes.end());
      c.dmas.push_back(std::move(d));
    } else {
      c.ok = false;
    }
  }
  return c;
}

}  // namespace

void Emitter::emit_in_arrival_order(const std::vector<std::string>& texts, const std::vector<ArrivalEvent>& events,
                                    int stream, int mode) {
  const size_t n = texts.size();
  auto& out = cs_[static_cast<size_t>(cur_)];
  std::vector<std::vector<size_t>> cand(n);  // cand[k]: events that may go while k is the first not done
  std::vector<EventCode> code;
  assert(mode == 1 || mode == 2);  // 0 (program order) never comes here
  const int64_t tile_bytes = kTileElems * 4;
  for (size_t k = 0; k < n; ++k) {
    code.push_back(read_code(texts[k], tile_bytes));
    // The landing its wait covers writes its slot (or y) as the event's own
    // write: a later event that reads it relies on that wait.
    if (events[k].space) code[k].writes.push_back(Range{events[k].space, events[k].lo, events[k].hi});
  }
  // The DMAs each event's waits cover: those on the flag since its last wait.
  // An event may rely on an earlier one's wait (the emitter waits once a flag),
  // so a later event must not touch what an earlier one's waits cover.
  std::map<int, std::vector<const Dma*>> since_wait;
  std::vector<std::vector<Range>> covered(n);
  for (size_t k = 0; k < n; ++k) {
    for (const auto& [f, cnt] : code[k].waits) {
      for (const Dma* d : since_wait[f]) {
        covered[k].insert(covered[k].end(), d->reads.begin(), d->reads.end());
        covered[k].insert(covered[k].end(), d->writes.begin(), d->writes.end());
      }
      since_wait[f].clear();
    }
    for (const Dma& d : code[k].dmas)
      if (d.flag >= 0) since_wait[d.flag].push_back(&d);
  }
  // Event j may go before event i < j: neither waits on a flag the other
  // raises, their bytes are apart, and j touches nothing i's waits cover.
  auto commute = [&](size_t i, size_t j) {
    const EventCode &a = code[i], &b = code[j];
    if (!a.ok || !b.ok) return false;
    for (const auto& [f, cnt] : b.waits)
      if (a.raises.count(f)) return false;
    for (const auto& [f, cnt] : a.waits)
      if (b.raises.count(f)) return false;
    return !overlap(a.writes, b.reads) && !overlap(a.reads, b.writes) && !overlap(a.writes, b.writes) &&
           !overlap(covered[i], b.reads) && !overlap(covered[i], b.writes);
  };
  for (size_t k = 0; k < n; ++k) {
    if (events[k].flag < 0 || !code[k].ok) continue;  // a front without a landing stays a plain wait
    for (size_t j = k + 1; j < n && j < k + kArrivalWindow; ++j) {
      bool ok = !events[j].pinned && !code[j].remote_hbm && code[j].waits.size() <= 6;
      for (size_t i = k; i < j && ok; ++i) ok = commute(i, j);
      if (ok) cand[k].push_back(j);
    }
  }
  if (std::all_of(cand.begin(), cand.end(), [](const std::vector<size_t>& c) { return c.empty(); })) {
    for (const std::string& t : texts) out << t;  // the program order as it is
    return;
  }
  // Each stream's registers (the lowering's other code leaves s20..s28 alone
  // while the streams run): done = bit d for the event d after the first not done
  // that went already; back = d while an event that went early runs (0 when it
  // runs in order); t for tests.
  const std::string done = "s" + std::to_string(20 + 3 * stream), back = "s" + std::to_string(21 + 3 * stream);
  const std::string t = "s" + std::to_string(22 + 3 * stream);
  const std::string tag = "arr" + std::to_string(labels_++) + "_";
  auto L = [&](const char* what, size_t k) { return tag + what + std::to_string(k); };
  auto landing = [&](size_t k) { return std::make_pair(events[k].flag, events[k].count); };
  auto cond = [](const std::pair<int, int64_t>& w) {
    return "f" + std::to_string(w.first) + ", " + std::to_string(w.second);
  };
  line("li " + done + ", 0");
  line("li " + back + ", 0");
  // early_of[j]: the distances d for which j is a candidate of k = j - d; reach[k]:
  // some event after k may have gone before k is done (done may be nonzero).
  std::vector<std::vector<size_t>> early_of(n);
  std::vector<bool> reach(n, false);
  for (size_t k = 0; k < n; ++k)
    for (size_t j : cand[k]) {
      early_of[j].push_back(j - k);
      for (size_t i = k; i < j; ++i) reach[i] = true;
    }
  for (size_t k = 0; k < n; ++k) {
    out << L("d", k) << ":\n";
    if (!cand[k].empty()) {
      // Mode 2 (a check) takes a candidate that is ready before the first.
      if (mode != 2) {
        line("ftest " + t + ", " + cond(landing(k)));
        line("bne " + t + ", s0, " + L("f", k));
      }
      for (size_t j : cand[k]) {
        const std::string bit = std::to_string(1u << (j - k)), next = L("n", k) + "_" + std::to_string(j);
        line("and " + t + ", " + done + ", " + bit);
        line("bne " + t + ", s0, " + next);
        for (const auto& w : code[j].waits) {
          line("ftest " + t + ", " + cond(w));
          line("beq " + t + ", s0, " + next);
        }
        line("or " + done + ", " + done + ", " + bit);
        line("li " + back + ", " + std::to_string(j - k));
        line("jmp " + L("f", j));
        out << next << ":\n";
      }
      if (mode == 2) {
        line("ftest " + t + ", " + cond(landing(k)));
        line("bne " + t + ", s0, " + L("f", k));
      }
      // Nothing ready: wait for the first's landing or the first candidate's not
      // yet there, and look again (each wait names a flag that was low, so this
      // ends: with every candidate's landing there, the first's own wait).
      for (size_t j : cand[k]) {
        if (events[j].flag < 0) continue;
        const std::string next = L("w", k) + "_" + std::to_string(j);
        line("and " + t + ", " + done + ", " + std::to_string(1u << (j - k)));
        line("bne " + t + ", s0, " + next);
        line("ftest " + t + ", " + cond(landing(j)));
        line("bne " + t + ", s0, " + next);
        line("wait.any " + cond(landing(k)) + ", " + cond(landing(j)));
        line("jmp " + L("d", k));
        out << next << ":\n";
      }
    }
    out << L("f", k) << ":\n" << texts[k];
    // After event k: back to the dispatch it went early from, else (in order)
    // past the events after it that went already.
    for (size_t d : early_of[k]) {
      line("li " + t + ", " + std::to_string(d));
      line("beq " + back + ", " + t + ", " + L("b", k) + "_" + std::to_string(d));
    }
    if (reach[k]) {
      const size_t most = std::min(n - 1 - k, kArrivalWindow - 1);
      for (size_t m = 1; m <= most; ++m) {
        line("shr " + done + ", " + done + ", 1");
        line("and " + t + ", " + done + ", 1");
        line("beq " + t + ", s0, " + L("d", k + m));
      }
      line("shr " + done + ", " + done + ", 1");
      line("jmp " + L("d", k + most + 1));
    } else if (!early_of[k].empty()) {
      line("jmp " + L("d", k + 1));
    }
    for (size_t d : early_of[k]) {
      out << L("b", k) << "_" << d << ":\n";
      line("li " + back + ", 0");
      line("jmp " + L("d", k - d));
    }
  }
  out << L("d", n) << ":\n";
}

}  // namespace tpusim::compiler::lowering
