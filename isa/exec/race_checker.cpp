#include "isa/exec/race_checker.h"

#include <algorithm>
#include <climits>
#include <cstdint>
#include <iterator>
#include <utility>

namespace tpusim::exec {

namespace {

int64_t floor_div(int64_t a, int64_t b) {  // b > 0
  return a >= 0 ? a / b : -((-a + b - 1) / b);
}

// Past this many visited runs an overlap test gives up and says "overlaps", so a
// pathological pair of patterns costs a bounded time and stays conservative.
constexpr int64_t kOverlapBudget = 1 << 20;

// Extent of the runs of dims d.. (the bytes [base, base + extent) cover them).
int64_t extent_from(const BytePattern& p, int d) {
  int64_t e = p.run;
  for (int k = d; k < std::min(p.ndims, BytePattern::kMaxDims); ++k) e += (p.count[k] - 1) * p.stride[k];
  return e;
}

// Whether some run of p's dims d.. placed at `base` meets [lo, hi).
bool hits(const BytePattern& p, int d, int64_t base, int64_t lo, int64_t hi, int64_t& budget) {
  if (--budget < 0) return true;
  if (d >= std::min(p.ndims, BytePattern::kMaxDims)) return base < hi && lo < base + p.run;
  const int64_t s = p.stride[d], inner = extent_from(p, d + 1);
  const int64_t first = std::max<int64_t>(0, floor_div(lo - inner - base, s) + 1);
  const int64_t last = std::min<int64_t>(p.count[d] - 1, floor_div(hi - 1 - base, s));
  for (int64_t i = first; i <= last; ++i)
    if (hits(p, d + 1, base + i * s, lo, hi, budget)) return true;
  return false;
}

// Whether some run of a's dims d.. at `base` meets some byte of b.
bool runs_meet(const BytePattern& a, int d, int64_t base, const BytePattern& b, int64_t& budget) {
  if (budget < 0) return true;
  if (d >= std::min(a.ndims, BytePattern::kMaxDims)) return hits(b, 0, b.base, base, base + a.run, budget);
  // Only the indices whose sub-extent meets b's bounding range can matter.
  const int64_t s = a.stride[d], inner = extent_from(a, d + 1);
  const int64_t first = std::max<int64_t>(0, floor_div(b.lo - inner - base, s) + 1);
  const int64_t last = std::min<int64_t>(a.count[d] - 1, floor_div(b.hi - 1 - base, s));
  for (int64_t i = first; i <= last; ++i)
    if (runs_meet(a, d + 1, base + i * s, b, budget)) return true;
  return false;
}

int64_t runs_of(const BytePattern& p) {
  int64_t n = 1;
  for (int d = 0; d < p.ndims; ++d) n *= p.count[d];
  return n;
}

BytePattern dma_end(const DmaPlan& p, bool dst) {
  int64_t count[BytePattern::kMaxDims] = {}, stride[BytePattern::kMaxDims] = {};
  for (int d = 0; d < p.ndims; ++d) {
    count[d] = p.dims[d].count;
    stride[d] = dst ? p.dims[d].dst_stride : p.dims[d].src_stride;
  }
  return BytePattern::strided(dst ? p.dst_addr : p.src_addr, static_cast<int64_t>(p.bytes), p.ndims, count, stride);
}

}  // namespace

BytePattern BytePattern::contiguous(int64_t lo, int64_t hi) {
  BytePattern p;
  p.base = p.lo = lo;
  p.run = std::max<int64_t>(0, hi - lo);
  p.hi = lo + p.run;
  return p;
}

BytePattern BytePattern::strided(int64_t base, int64_t run, int ndims, const int64_t* count, const int64_t* stride) {
  BytePattern p;
  p.base = base;
  p.run = run;
  for (int d = 0; d < ndims; ++d) {
    if (count[d] <= 1 || stride[d] == 0) continue;  // a replicated dim touches the same bytes again
    int64_t s = stride[d];
    if (s < 0) {  // as a set of bytes the walk's direction does not matter
      p.base += (count[d] - 1) * s;
      s = -s;
    }
    p.count[p.ndims] = count[d];
    p.stride[p.ndims] = s;
    ++p.ndims;
  }
  // Widest stride outermost, so the interval tests prune the most.
  for (int i = 0; i < p.ndims; ++i)
    for (int j = i + 1; j < p.ndims; ++j)
      if (p.stride[j] > p.stride[i]) {
        std::swap(p.stride[i], p.stride[j]);
        std::swap(p.count[i], p.count[j]);
      }
  p.lo = p.base;
  p.hi = p.base + (run > 0 ? extent_from(p, 0) : 0);
  return p;
}

BytePattern BytePattern::dma_src(const DmaPlan& p) { return dma_end(p, false); }
BytePattern BytePattern::dma_dst(const DmaPlan& p) { return dma_end(p, true); }

bool BytePattern::overlaps(const BytePattern& o) const {
  if (empty() || o.empty() || hi <= o.lo || o.hi <= lo) return false;
  int64_t budget = kOverlapBudget;
  // Walk the runs of the pattern with fewer of them; test each against the other.
  return runs_of(*this) <= runs_of(o) ? runs_meet(*this, 0, base, o, budget) : runs_meet(o, 0, o.base, *this, budget);
}

RaceChecker::RaceChecker(size_t cores, size_t streams)
    : cores_(cores),
      streams_(std::max<size_t>(1, streams)),
      agents_(cores * streams_),
      running_(agents_, false),
      log_(agents_),
      merged_(agents_ * agents_, 0) {
  for (size_t c = 0; c < cores_; ++c) running_[c * streams_] = true;  // every core's stream 0
  running_count_ = cores_;
  if (streams_ > 1) {
    rel_.assign(agents_, 0);
    knows_.assign(agents_ * streams_, 0);
    forked_.assign(cores_, false);
  }
}

static_assert(isa::kStreams == 4, "RaceChecker::Cell::read's initialiser lists one entry a stream");

std::vector<uint32_t> RaceChecker::release(size_t who) {
  std::vector<uint32_t> snap(knows_.begin() + static_cast<std::ptrdiff_t>(who * streams_),
                             knows_.begin() + static_cast<std::ptrdiff_t>((who + 1) * streams_));
  snap[who % streams_] = ++rel_[who];
  return snap;
}

void RaceChecker::acquire(size_t who, const std::vector<uint32_t>& snapshot) {
  for (size_t s = 0; s < snapshot.size(); ++s)
    if (s != who % streams_) knows_[who * streams_ + s] = std::max(knows_[who * streams_ + s], snapshot[s]);
}

RaceChecker::Cell& RaceChecker::Shadow::at(int64_t cell) {
  const int64_t n = floor_div(cell, kCellsPerPage);
  auto& page = pages[n];
  if (!page) page = std::make_unique<Cell[]>(kCellsPerPage);
  return page[static_cast<size_t>(cell - n * kCellsPerPage)];
}

void RaceChecker::sibling_access(size_t who, const Memory* mem, const BytePattern& bytes, bool write) {
  const size_t core = who / streams_, me = who % streams_;
  if (streams_ == 1 || bytes.empty() || !forked_[core]) return;
  Shadow& sh = shadows_[mem];
  if (sh.grain == 0) sh.grain = mem->size() <= 65536 ? 4 : 256;
  const uint32_t* knows = &knows_[who * streams_];
  auto race = [&](size_t other, bool other_wrote) {
    throw Fault(std::string("race: ") + (write ? "writes" : "reads") + " bytes [" + std::to_string(bytes.lo) + ", " +
                std::to_string(bytes.hi) + ") of " + mem->name() + " that stream " + std::to_string(other) +
                " of this core " + (other_wrote ? "wrote" : "read") +
                ", with no flag it released, fork or DMA it issued since ordering the two");
  };
  // Every run of the pattern (innermost dims fastest), cell by cell.
  int64_t idx[BytePattern::kMaxDims] = {};
  for (;;) {
    int64_t a = bytes.base;
    for (int d = 0; d < bytes.ndims; ++d) a += idx[d] * bytes.stride[d];
    for (int64_t c = floor_div(a, sh.grain), last = floor_div(a + bytes.run - 1, sh.grain); c <= last; ++c) {
      Cell& cell = sh.at(c);
      if (cell.writer != kNone && cell.writer != me && knows[cell.writer] <= cell.written) race(cell.writer, true);
      if (write) {
        for (size_t s = 0; s < streams_; ++s)
          if (s != me && cell.read[s] != kNoRead && knows[s] <= cell.read[s]) race(s, false);
        cell.writer = static_cast<uint8_t>(me);
        cell.written = rel_[who];
        std::fill(std::begin(cell.read), std::end(cell.read), kNoRead);
      } else {
        cell.read[me] = rel_[who];
      }
    }
    int d = bytes.ndims - 1;
    for (; d >= 0 && ++idx[d] == bytes.count[d]; --d) idx[d] = 0;
    if (d < 0) break;
  }
}

const RaceChecker::Record* RaceChecker::find(uint64_t id) const {
  if (id < first_id_ || id - first_id_ >= records_.size()) return nullptr;
  const Record& r = records_[static_cast<size_t>(id - first_id_)];
  return r.live ? &r : nullptr;
}

RaceChecker::Record* RaceChecker::find(uint64_t id) {
  return const_cast<Record*>(static_cast<const RaceChecker*>(this)->find(id));
}

void RaceChecker::access(size_t who, const Memory* mem, const BytePattern& bytes, bool write) const {
  if (bytes.empty()) return;
  const auto it = by_memory_.find(mem);
  if (it == by_memory_.end()) return;
  for (uint64_t id : it->second.ids) {  // oldest first, so a fault names the oldest DMA it races with
    const Record* r = find(id);
    if (!r || r->observed[who]) continue;
    const std::string range = "bytes [" + std::to_string(bytes.lo) + ", " + std::to_string(bytes.hi) + ") of ";
    if (r->dst == mem && bytes.overlaps(r->dst_bytes))
      throw Fault(std::string("race: ") + (write ? "writes " : "reads ") + range + mem->name() + " that the DMA at " +
                  r->where + " writes, before waiting on its completion flag");
    if (write && r->src == mem && bytes.overlaps(r->src_bytes))
      throw Fault("race: overwrites " + range + mem->name() + " that the DMA at " + r->where +
                  " reads, before waiting on its completion flag");
  }
}

void RaceChecker::dma_issued(size_t who, const DmaPlan& p, size_t dest, const std::string& where) {
  if (p.total_bytes() == 0) return;
  const uint64_t id = first_id_ + records_.size();
  records_.emplace_back();
  Record& r = records_.back();
  r.live = true;
  r.src = p.src;
  r.dst = p.dst;
  r.src_bytes = BytePattern::dma_src(p);
  r.dst_bytes = BytePattern::dma_dst(p);
  r.issuer = who;
  r.epoch = epoch_;
  r.known = log_[who].size();
  r.observed.assign(agents_, false);
  r.where = where;
  if (streams_ > 1) r.plain = release(who);  // the engines start it after the vld/vst before it
  ++live_;
  by_memory_[p.src].ids.push_back(id);
  if (p.dst != p.src) by_memory_[p.dst].ids.push_back(id);
  if (p.flag >= 0) pending_[{who / streams_, p.flag}].ids.push_back(id);
  if (p.rflag >= 0 && dest != kNoCore) pending_[{dest, p.rflag}].ids.push_back(id);
}

// Agent `who` now knows DMA `id` is done (no knowledge passed on).
void RaceChecker::mark(size_t who, uint64_t id) {
  Record* r = find(id);
  if (!r || r->observed[who]) return;
  if (r->issuer / streams_ == who / streams_) acquire(who, r->plain);
  r->observed[who] = true;
  log_[who].push_back(id);
  if (running_[who] && ++r->seen == running_count_) retire(id);
}

// Agent `who` takes over agent `from`'s log up to `upto` (the part it has not yet).
void RaceChecker::merge(size_t who, size_t from, size_t upto) {
  size_t& done = merged_[who * agents_ + from];
  for (; done < upto; ++done) mark(who, log_[from][done]);
}

// Agent `who` waited for DMA `id`: it knows that DMA, and all its issuer knew when
// issuing it (the part of the issuer's log `who` has not taken over already).
void RaceChecker::observe(size_t who, uint64_t id) {
  const Record* r = find(id);
  if (!r || r->observed[who]) return;
  const size_t issuer = r->issuer, known = r->known;
  const bool inherits = r->epoch == epoch_ && issuer != who;
  mark(who, id);
  if (inherits) merge(who, issuer, known);
}

// Every running agent has observed DMA `id`: forget it.
void RaceChecker::retire(uint64_t id) {
  Record& r = records_[static_cast<size_t>(id - first_id_)];
  r.live = false;
  r.observed = {};
  r.where = {};
  r.plain = {};
  --live_;
  auto prune = [&](const Memory* m) {
    MemoryIndex& mi = by_memory_[m];
    if (++mi.dead * 2 <= mi.ids.size()) return;
    mi.ids.erase(std::remove_if(mi.ids.begin(), mi.ids.end(), [&](uint64_t k) { return !find(k); }), mi.ids.end());
    mi.dead = 0;
  };
  prune(r.src);
  if (r.dst != r.src) prune(r.dst);
  while (!records_.empty() && !records_.front().live) {
    records_.pop_front();
    ++first_id_;
  }
}

// After the running agents changed: forget the DMAs all of them have observed.
void RaceChecker::retire_all_seen() {
  std::vector<uint64_t> done;
  for (size_t i = 0; i < records_.size(); ++i)
    if (records_[i].live && records_[i].seen == running_count_) done.push_back(first_id_ + i);
  for (uint64_t id : done) retire(id);
}

void RaceChecker::wait_satisfied(size_t who, int flag) {
  const size_t core = who / streams_, stream = who % streams_;
  if (const auto it = pending_.find({core, flag}); it != pending_.end()) {
    FlagDmas& fd = it->second;
    fd.taken.resize(streams_, 0);
    // Taken before observing: an observe may retire ids, never add to this list.
    const size_t from = fd.taken[stream], to = fd.ids.size();
    fd.taken[stream] = to;
    for (size_t i = from; i < to; ++i) observe(who, fd.ids[i]);
    // Once every running stream of the core has taken an id, no wait needs it
    // again: a stream forked later starts from its parent's place (stream_forked).
    size_t least = SIZE_MAX;
    for (size_t s = 0; s < streams_; ++s)
      if (running_[core * streams_ + s]) least = std::min(least, fd.taken[s]);
    if (least != SIZE_MAX && least > 0 && least * 2 >= fd.ids.size()) {
      fd.ids.erase(fd.ids.begin(), fd.ids.begin() + static_cast<std::ptrdiff_t>(least));
      for (size_t& t : fd.taken) t = t > least ? t - least : 0;
    }
  }
  if (const auto it = released_.find({core, flag}); it != released_.end())
    for (size_t s = 0; s < streams_; ++s) {
      if (s == stream) continue;
      const Release& r = it->second[s];
      acquire(who, r.plain);
      if (r.log > 0) merge(who, core * streams_ + s, r.log);
    }
}

void RaceChecker::flag_released(size_t who, int flag) {
  auto& per_stream = released_[{who / streams_, flag}];
  per_stream.resize(streams_);
  per_stream[who % streams_].log = log_[who].size();
  if (streams_ > 1) per_stream[who % streams_].plain = release(who);
}

void RaceChecker::stream_forked(size_t parent, size_t child) {
  if (running_[child]) return;
  running_[child] = true;
  ++running_count_;
  if (streams_ > 1) {
    forked_[child / streams_] = true;
    acquire(child, release(parent));
  }
  // What the child knew in an earlier run still holds (a DMA seen done stays done).
  for (Record& r : records_)
    if (r.live && r.observed[child]) ++r.seen;
  merge(child, parent, log_[parent].size());
  // A wait of the child on a flag need not look at DMAs the parent already took.
  const size_t core = child / streams_;
  for (auto it = pending_.lower_bound({core, INT_MIN}); it != pending_.end() && it->first.first == core; ++it) {
    FlagDmas& fd = it->second;
    fd.taken.resize(streams_, 0);
    fd.taken[child % streams_] = std::max(fd.taken[child % streams_], fd.taken[parent % streams_]);
  }
}

void RaceChecker::stream_halted(size_t who) {
  if (!running_[who]) return;
  running_[who] = false;
  --running_count_;
  for (Record& r : records_)
    if (r.live && r.observed[who]) --r.seen;
  retire_all_seen();
}

// What one agent has observed, all know afterwards: every DMA some agent observed
// is forgotten; those no agent has waited for yet stay in flight for all.
void RaceChecker::barrier_released() {
  std::vector<uint64_t> known;
  for (size_t i = 0; i < records_.size(); ++i)
    if (records_[i].live && std::find(records_[i].observed.begin(), records_[i].observed.end(), true) !=
                                records_[i].observed.end())
      known.push_back(first_id_ + i);
  for (uint64_t id : known) retire(id);
  for (auto& l : log_) l.clear();
  std::fill(merged_.begin(), merged_.end(), 0);
  released_.clear();
  ++epoch_;
}

}  // namespace tpusim::exec
