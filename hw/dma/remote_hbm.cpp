#include "hw/dma/remote_hbm.h"

#include <algorithm>

namespace tpusim::hw {

RemoteHbm::RemoteHbm(MemoryHub& hub, const DmaParams& p, uint32_t source) : hub_(hub), p_(p), source_(source) {
  sink_ = [this](uint64_t token, uint64_t) { landed_.push_back(token); };
}

std::vector<RemoteHbm::Beat> RemoteHbm::beats(const exec::DmaPlan& pl, bool src_side) const {
  std::vector<Beat> out;
  uint32_t count[isa::kMaxDmaDims] = {1, 1, 1};
  for (int d = 0; d < pl.ndims; ++d) count[d] = pl.dims[d].count;
  for (uint32_t i2 = 0; i2 < count[2]; ++i2)
    for (uint32_t i1 = 0; i1 < count[1]; ++i1)
      for (uint32_t i0 = 0; i0 < count[0]; ++i0) {
        int64_t a = src_side ? pl.src_addr : pl.dst_addr;
        const uint32_t idx[3] = {i0, i1, i2};
        for (int k = 0; k < pl.ndims; ++k)
          a += static_cast<int64_t>(idx[k]) * (src_side ? pl.dims[k].src_stride : pl.dims[k].dst_stride);
        for (uint64_t off = 0; off < pl.bytes; off += p_.chunk_bytes)
          out.push_back({static_cast<uint64_t>(a) + off,
                         static_cast<uint32_t>(std::min<uint64_t>(p_.chunk_bytes, pl.bytes - off))});
      }
  return out;
}

RemoteHbm::Stream* RemoteHbm::add(std::unique_ptr<Stream> s, bool write) {
  s->write = write;
  s->serial = next_serial_++;
  s->cycles_per_byte = (write ? p_.vmem_to_hbm : p_.hbm_to_vmem).cycles_per_kib / 1024.0;
  for (const Beat& b : s->beats) s->total_bytes += b.bytes;
  Stream* raw = s.get();
  by_serial_[raw->serial] = raw;
  if (write) {
    ++write_transfers_;
    landings_.push_back(std::move(s));
  } else {
    ++read_transfers_;
    reads_.push_back(std::move(s));
  }
  return raw;
}

void RemoteHbm::read(std::vector<Beat> beats, uint64_t first, uint64_t step_bytes, Progress progress) {
  auto s = std::make_unique<Stream>();
  s->beats = std::move(beats);
  s->first = first;
  s->back.assign(s->beats.size(), 0);
  s->step = std::max<uint64_t>(1, step_bytes);
  s->next_report = s->step;
  s->progress = std::move(progress);
  add(std::move(s), false);
}

void RemoteHbm::land(std::vector<Beat> beats, uint64_t now, uint64_t first, Retire retire) {
  if (beats.empty() && landings_.empty()) {
    retire(now);
    last_activity_ = std::max(last_activity_, now);
    return;
  }
  auto s = std::make_unique<Stream>();
  s->beats = std::move(beats);
  s->first = first;
  s->retire = std::move(retire);
  add(std::move(s), true);
}

bool RemoteHbm::issue(Stream& s, uint64_t cycle) {
  while (s.issued < s.beats.size() && next_issue(s) <= cycle) {
    const Beat& b = s.beats[s.issued];
    if (!hub_.enqueue(b.addr, b.bytes, s.write, source_, cycle, &sink_, (s.serial << 32) | s.issued)) return false;
    s.bytes_issued += b.bytes;
    ++s.issued;
  }
  return true;
}

void RemoteHbm::tick(uint64_t cycle) {
  for (uint64_t token : landed_) {
    auto it = by_serial_.find(token >> 32);
    if (it == by_serial_.end()) continue;
    Stream& s = *it->second;
    ++s.landed;
    if (s.write) {
      bytes_written_ += s.beats[token & 0xffffffffu].bytes;
      continue;
    }
    bytes_read_ += s.beats[token & 0xffffffffu].bytes;
    s.back[token & 0xffffffffu] = 1;
    while (s.prefix < s.beats.size() && s.back[s.prefix]) s.prefix_bytes += s.beats[s.prefix++].bytes;
    if (s.prefix_bytes >= s.next_report || s.prefix == s.beats.size()) {
      s.progress(s.prefix_bytes, cycle);
      s.next_report = (s.prefix_bytes / s.step + 1) * s.step;
    }
  }
  if (!landed_.empty()) last_activity_ = std::max(last_activity_, cycle);
  landed_.clear();
  // Reads whose bytes are all back are done; landings retire in order.
  for (size_t i = 0; i < reads_.size();) {
    if (reads_[i]->landed == reads_[i]->beats.size()) {
      count(*reads_[i], cycle);
      by_serial_.erase(reads_[i]->serial);
      reads_.erase(reads_.begin() + static_cast<std::ptrdiff_t>(i));
    } else {
      ++i;
    }
  }
  while (!landings_.empty() && landings_.front()->landed == landings_.front()->beats.size()) {
    count(*landings_.front(), cycle);
    landings_.front()->retire(cycle);
    last_activity_ = std::max(last_activity_, cycle);
    by_serial_.erase(landings_.front()->serial);
    landings_.pop_front();
  }
  // Beats due, writes first (in landing order), then reads (in start order).
  backpressured_ = false;
  for (auto& s : landings_)
    if (!backpressured_ && !issue(*s, cycle)) backpressured_ = true;
  for (auto& s : reads_)
    if (!backpressured_ && !issue(*s, cycle)) backpressured_ = true;
  if (backpressured_) ++stall_backpressure_cycles_;
}

void RemoteHbm::count(const Stream& s, uint64_t cycle) const {
  if (tl_ && s.bytes_issued > 0)
    tl_->rate(track_, "HBM bandwidth (GB/s)", s.first, std::max(cycle, s.first + 1), double(s.bytes_issued), 1e-9);
}

uint64_t RemoteHbm::next_event_cycle(uint64_t now) const {
  uint64_t next = kNever;
  if (!landed_.empty()) next = now + 1;
  for (const auto& s : landings_) {
    // One whose writes are all in retires in the tick its predecessor does.
    if (s->issued < s->beats.size()) next = std::min(next, backpressured_ ? now + 1 : std::max(now + 1, next_issue(*s)));
  }
  for (const auto& s : reads_)
    if (s->issued < s->beats.size()) next = std::min(next, backpressured_ ? now + 1 : std::max(now + 1, next_issue(*s)));
  return next;
}

nlohmann::json RemoteHbm::stats_json() const {
  return {{"read_transfers", read_transfers_},
          {"bytes_read", bytes_read_},
          {"write_transfers", write_transfers_},
          {"bytes_written", bytes_written_},
          {"stall_memory_backpressure_cycles", stall_backpressure_cycles_}};
}

}  // namespace tpusim::hw
