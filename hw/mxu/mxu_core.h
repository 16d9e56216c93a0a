// The MXU as plain C++ (no SystemC): weight staging double buffered against the
// array's active weights, LHS streaming, pipeline fill and drain, the result FIFO,
// and the operation interface the TensorCore sequencer drives. Both SystemC views
// (mxu_sc.h) wrap this one class, so they cannot disagree on timing or counters.
//
// Cycle convention: now() is the cycle in which the owner may issue ops; tick()
// ends that cycle (counting it as busy and/or stalled) and enters the next one,
// delivering what the pipeline produces there. skip(n) is n ticks done in jumps
// between the cycles at which anything changes.
//
// Values: with Datapath::kTile an mmul's 8 result rows are computed with
// num::mxu_matmul (one chunk, k = R, rows = R) and released into the FIFO at the
// cycles the systolic pipeline produces them. With Datapath::kExternal a per-PE
// grid (pe_grid.h) computes them and hands each row in with deliver_row(); all
// control (ports, stalls, FIFO, pops, counters) stays here.
#pragma once

#include <array>
#include <cstdint>
#include <deque>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "hw/mxu/mxu_params.h"

namespace tpusim::hw::mxu {

inline constexpr uint64_t kNever = std::numeric_limits<uint64_t>::max();

// One vector register: sublane s, lane l at v[s * kLanes + l] (the layout of
// isa's VReg, so the two copy with memcpy).
struct Vreg {
  std::array<float, kSublanes * kLanes> v{};
  float& at(int s, int l) { return v[static_cast<size_t>(s * kLanes + l)]; }
  float at(int s, int l) const { return v[static_cast<size_t>(s * kLanes + l)]; }
};

// mpop.add: vd = add(vd, popped), lane by lane with the contract's fp32 add.
void add_into(Vreg& vd, const Vreg& popped);

enum class MxuOpKind { kPush, kPushTransposed, kSwap, kMatmul, kPop, kPopAdd };
const char* op_name(MxuOpKind kind);  // the ISA mnemonic: "mpush", "mpush.t", ...

// Why an op cannot issue in a cycle. Counted per cycle for the op the owner has
// declared pending (set_pending).
enum class MxuStall {
  kNone,
  kStagingPortBusy,   // an mpush or the bulk load of an mswap holds the staging buffer
  kArrayBusy,         // LHS port still streaming the previous mmul, or weights loading
  kFifoFull,          // no room for 8 more result rows until an mpop in progress frees them
  kWaitingForResults, // mpop: the next result row has not left the pipeline yet
  kResultPortBusy,    // mpop: the previous mpop is still reading its rows
};
inline constexpr int kMxuStallReasons = 6;
const char* stall_name(MxuStall stall);  // "staging_port_busy", ...

// Whether an op can issue now: a stall (wait and ask again) or a program fault
// (it never can: FIFO overflow/underflow, staging overrun, bad operand).
struct MxuReadiness {
  MxuStall stall = MxuStall::kNone;
  std::string fault;  // empty unless the op is a program error
  bool can_issue() const { return stall == MxuStall::kNone && fault.empty(); }
};

// Thrown by an issue call that check() would have refused.
class MxuFault : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct MxuCounters {
  uint64_t busy_cycles = 0;  // cycles with an mmul in the pipeline, a push/bulk load or an mpop under way
  std::array<uint64_t, kMxuStallReasons> stall_cycles{};  // per MxuStall (index 0 unused)
  uint64_t macs = 0;         // multiply-accumulates the array performed: 8 x R x C per mmul
  uint64_t pushes = 0;       // mpush + mpush.t
  uint64_t swaps = 0;
  uint64_t matmuls = 0;
  uint64_t pops = 0;         // mpop + mpop.add
  uint64_t result_rows = 0;  // rows that entered the result FIFO
  bool operator==(const MxuCounters& o) const;
  bool operator!=(const MxuCounters& o) const { return !(*this == o); }
  // ("busy_cycles", n), ("stall_cycles.fifo_full", n), ... in a fixed order, for stats dumps.
  std::vector<std::pair<std::string, uint64_t>> named() const;
};

// What an mmul issue tells the sequencer: when its result vreg can start popping.
struct MatmulTicket {
  uint64_t seq = 0;              // per-unit mmul sequence number, from 0
  uint64_t first_row_cycle = 0;  // row 0 enters the FIFO (an mpop can issue from here)
  uint64_t last_row_cycle = 0;   // row 7 enters the FIFO
};

// A finished mpop: the popped rows (lanes >= C are +0.0), written to vd at done_cycle.
struct PoppedVreg {
  uint64_t tag = 0;         // the owner's tag given to pop()
  uint64_t seq = 0;         // the mmul it came from
  bool accumulate = false;  // mpop.add: the owner applies add_into(vd, data)
  uint64_t issue_cycle = 0;
  uint64_t done_cycle = 0;
  Vreg data;
};

// External datapath: an mmul's operands as they enter the array.
struct ArrayLaunch {
  uint64_t seq = 0;
  uint64_t issue_cycle = 0;  // LHS row i reaches the array's first PE in cycle issue_cycle + i
  int bank = 0;              // which of the PEs' two weight registers the wavefront reads
  std::vector<uint16_t> lhs; // 8 x R bf16, lanes of invalid weight rows already +0.0
};

// External datapath: a bulk load of the staging buffer into one weight bank.
struct WeightLoad {
  uint64_t issue_cycle = 0;
  int bank = 0;
  std::vector<uint16_t> weights;  // R x C bf16 (row k, column n at k * C + n); invalid rows +0.0
};

class MxuCore {
 public:
  enum class Datapath { kTile, kExternal };

  explicit MxuCore(const MxuParams& params, Datapath datapath = Datapath::kTile);

  const MxuParams& params() const { return params_; }
  uint64_t now() const { return now_; }
  const MxuCounters& counters() const { return counters_; }

  // --- time ---
  void tick();
  void skip(uint64_t n);
  // The next cycle after now() at which the owner has something to do: the pending
  // op can issue, or an mpop's vreg is written. kNever if none without a new op.
  // (Internal changes between, such as rows entering the FIFO, are folded into skip.)
  uint64_t next_event_cycle() const;
  // The next cycle after now() at which any state changes (every row arrival).
  uint64_t next_internal_event_cycle() const;
  // The cycle at which busy() turns false if no op issues before (now() if not
  // busy); kNever while a row's arrival is not known yet (external datapath).
  uint64_t idle_cycle() const;

  // --- operation interface ---
  MxuReadiness check(MxuOpKind kind) const;
  // The first cycle >= now() at which `kind` could issue if nothing else issues
  // first; kNever for a fault, or (external datapath) while a needed row's arrival
  // is not known yet.
  uint64_t earliest_issue_cycle(MxuOpKind kind) const;
  // The op waiting at the head of this unit's queue (or none): each cycle from
  // `from_cycle` on in which it cannot issue is counted as a stall of its reason.
  // The unit takes one op per cycle, so the cycle of the previous issue never
  // counts, whatever `from_cycle` says.
  void set_pending(std::optional<MxuOpKind> kind, uint64_t from_cycle = 0) {
    pending_ = kind;
    pending_from_ = from_cycle;
  }
  std::optional<MxuOpKind> pending() const { return pending_; }

  // Issue at now(). Each throws MxuFault (naming the op and the problem) when
  // check() would not allow it.
  void push(const Vreg& v, bool transposed);
  // mswap k=valid_rows; valid_rows <= 0 (no k, as the ISA encodes it): rows
  // [0, rows pushed) are valid, all R after an mpush.t.
  void swap(int valid_rows = -1);
  MatmulTicket matmul(const Vreg& lhs);
  // Returns the cycle its vreg is written; collect it with take_popped().
  uint64_t pop(bool accumulate, uint64_t tag = 0);
  // The oldest finished mpop (done_cycle <= now()), if any.
  std::optional<PoppedVreg> take_popped();

  // When the head result vreg (the next to pop) has row 0 in the FIFO; kNever if
  // none is outstanding or its arrival is not known yet.
  uint64_t head_ready_cycle() const;
  int fifo_rows() const;       // rows in the FIFO now (arrived, not yet popped)
  int inflight_rows() const;   // rows issued into the array, not yet in the FIFO
  int outstanding_vregs() const { return static_cast<int>(unpopped_); }
  int staging_rows() const { return staging_rows_; }
  int active_bank() const { return active_bank_; }
  bool busy() const;

  // --- observation ---
  // Called as each result row enters the FIFO: (mmul seq, row 0..7, cycle, C values).
  using RowObserver = std::function<void(uint64_t seq, int row, uint64_t cycle, const float* values)>;
  void set_row_observer(RowObserver fn) { row_observer_ = std::move(fn); }
  // Timing only: skip the arithmetic (benchmarks of the control path).
  void set_compute_values(bool on) { compute_values_ = on; }
  // Off: finished mpops are not queued for take_popped() (an owner that has the
  // values from elsewhere, as hw/core does).
  void set_keep_popped(bool on) { keep_popped_ = on; }

  // --- external datapath ---
  std::optional<ArrayLaunch> take_launch();
  std::optional<WeightLoad> take_weight_load();
  // Row `row` (C values) of mmul `seq` enters the FIFO at `cycle` (>= now()).
  // Throws std::logic_error if it breaks the FIFO order.
  void deliver_row(uint64_t seq, int row, const float* values, uint64_t cycle);

 private:
  struct WeightTile {
    std::vector<uint16_t> w;  // R x C bf16, invalid rows +0.0
    int valid_rows = 0;
  };
  struct ResultVreg {
    uint64_t seq = 0;
    uint64_t issue = 0;
    std::array<uint64_t, kSublanes> arrival{};  // cycle each row enters the FIFO (kNever: not known)
    int arrived = 0;                            // rows already in the FIFO
    int freed = 0;                              // rows already read out by an mpop
    bool pop_started = false;
    bool computed = false;
    std::shared_ptr<const WeightTile> weights;  // tile datapath
    std::vector<uint16_t> lhs;                  // tile datapath: 8 x R bf16 until computed
    std::vector<float> out;                     // 8 x C fp32
  };
  struct PopInProgress {
    uint64_t start = 0, done = 0, tag = 0;
    bool accumulate = false;
  };

  MxuReadiness check_at(MxuOpKind kind) const;
  void require_issue(MxuOpKind kind);  // and notes the issue cycle
  void account(uint64_t cycles);
  void enter_cycle();  // the events of cycle now_ (and of any cycle since the last call)
  uint64_t next_accounting_event_cycle() const;
  void ensure_computed(size_t index);
  uint64_t fifo_space_cycle() const;

  MxuParams params_;
  Datapath datapath_;
  int latency_ = 0;
  uint64_t now_ = 0;
  MxuCounters counters_;
  std::optional<MxuOpKind> pending_;
  uint64_t pending_from_ = 0;
  uint64_t last_issue_cycle_ = kNever;
  bool compute_values_ = true;
  bool keep_popped_ = true;

  // staging buffer and the two weight banks' bookkeeping
  std::vector<uint16_t> staging_;
  int staging_rows_ = 0;  // rows written by mpush (the next mpush's first row)
  int staging_cols_ = 0;  // columns written by mpush.t
  std::shared_ptr<const WeightTile> active_;
  int active_bank_ = 0;
  std::array<uint64_t, 2> bank_drain_{};  // first cycle no wavefront reads the bank

  uint64_t lhs_port_free_ = 0;
  uint64_t staging_port_free_ = 0;
  uint64_t swap_done_ = 0;
  uint64_t busy_until_ = 0;  // end of push / bulk load activity
  uint64_t next_seq_ = 0;

  std::deque<ResultVreg> results_;  // issued mmuls not yet fully popped, in order
  size_t complete_ = 0;             // leading entries of results_ with all 8 rows arrived
  uint64_t unpopped_ = 0;           // mmuls issued minus pops issued
  std::optional<PopInProgress> pop_;
  std::deque<PoppedVreg> popped_;

  RowObserver row_observer_;
  std::deque<ArrayLaunch> launches_;
  std::deque<WeightLoad> weight_loads_;
};

}  // namespace tpusim::hw::mxu
