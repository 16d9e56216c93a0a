#include "isa/exec/race_checker.h"

#include <algorithm>
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

void RaceChecker::access(size_t who, const Memory* mem, const BytePattern& bytes, bool write) const {
  if (bytes.empty()) return;
  for (const Record& r : records_) {
    if (r.observed[who]) continue;
    const std::string range = "bytes [" + std::to_string(bytes.lo) + ", " + std::to_string(bytes.hi) + ") of ";
    if (r.dst == mem && bytes.overlaps(r.dst_bytes))
      throw Fault(std::string("race: ") + (write ? "writes " : "reads ") + range + mem->name() + " that the DMA at " +
                  r.where + " writes, before waiting on its completion flag");
    if (write && r.src == mem && bytes.overlaps(r.src_bytes))
      throw Fault("race: overwrites " + range + mem->name() + " that the DMA at " + r.where +
                  " reads, before waiting on its completion flag");
  }
}

void RaceChecker::dma_issued(size_t who, const DmaPlan& p, size_t dest, const std::string& where) {
  if (p.total_bytes() == 0) return;
  Record r;
  r.id = next_id_++;
  r.src = p.src;
  r.dst = p.dst;
  r.src_bytes = BytePattern::dma_src(p);
  r.dst_bytes = BytePattern::dma_dst(p);
  r.issuer = who;
  r.dest = dest;
  r.flag = p.flag;
  r.rflag = p.rflag;
  r.observed.assign(cores_, false);
  for (const Record& o : records_)
    if (o.observed[who]) r.inherited.push_back(o.id);
  r.where = where;
  records_.push_back(std::move(r));
}

void RaceChecker::observe(size_t who, Record& r) {
  if (r.observed[who]) return;
  r.observed[who] = true;
  for (uint64_t id : r.inherited)
    for (Record& o : records_)
      if (o.id == id) o.observed[who] = true;
}

void RaceChecker::wait_satisfied(size_t who, int flag) {
  for (Record& r : records_)
    if ((r.issuer == who && r.flag == flag) || (r.dest == who && r.rflag == flag)) observe(who, r);
  collect();
}

void RaceChecker::barrier_released() {
  for (Record& r : records_)
    if (std::find(r.observed.begin(), r.observed.end(), true) != r.observed.end())
      std::fill(r.observed.begin(), r.observed.end(), true);
  collect();
}

void RaceChecker::collect() {
  records_.erase(std::remove_if(records_.begin(), records_.end(),
                                [](const Record& r) {
                                  return std::find(r.observed.begin(), r.observed.end(), false) == r.observed.end();
                                }),
                 records_.end());
}

}  // namespace tpusim::exec
