// Fusion groups as the lowering applies them: a root (matmul, conv2d or an
// elementwise op) and the chain of members the fuse-elementwise pass put in its
// group, each consuming the previous one's result. The root's kernel runs the
// members' recipes on its output tiles in registers and stores only the chain's
// end, so the intermediate results never go through HBM (docs/codegen.md).
#include "compiler/lower/emitter.h"

#include <set>

namespace tpusim::compiler::lowering {

namespace {

bool unary(const Node& m) { return m.inputs.size() == 1; }

bool pow_lowered(const Node& m) {
  if (m.op != OpKind::kPow) return true;
  const float p = m.attr_float("exponent");
  return p == 0.5f || p == 1.0f || p == 2.0f || p == 3.0f;
}

}  // namespace

// Whether `f` can be computed inside the kernel of the elementwise chain rooted at
// node index ri: an elementwise op of the root's shape, read by one member alone and
// no graph output, whose operands exist before the root runs and are not integers.
bool Emitter::is_feeder(const Node& f, size_t ri, const std::map<std::string, size_t>& defined_at,
                        const std::map<std::string, int>& uses, const Node& root) const {
  if (!is_elementwise(f.op) || f.type.dtype == DType::kI64 || f.type.shape != root.type.shape || !pow_lowered(f) ||
      fused_.count(f.id) || chains_.count(f.id) || uses.at(f.output) != 1)
    return false;
  for (const std::string& in : f.inputs) {
    auto it = defined_at.find(in);
    if ((it != defined_at.end() && it->second >= ri) || t_.at(in).type.dtype == DType::kI64) return false;
  }
  return true;
}

// Whether lower_elementwise's block buffers (two sets: one operand's 8x128 tiles of a
// block each, the result, the stored results) still take at most half of VMEM with
// the feeder's operands in place of one: a chain of members with an operand each
// takes one buffer a member, one with feeders up to two.
bool Emitter::feeder_fits(const Node& root, const Node& f) const {
  // The root's operands, the result, one more stored result than the chain has yet.
  int64_t buffers = static_cast<int64_t>(root.inputs.size()) + 2 + side_stored_.count(root.output);
  auto chain = chains_.find(root.id);
  if (chain != chains_.end())
    for (const Node* m : chain->second) {
      auto fd = feeds_.find(m->id);
      buffers += fd != feeds_.end() ? static_cast<int64_t>(fd->second->inputs.size()) : m->inputs.size() == 2;
      buffers += side_stored_.count(m->output);
    }
  buffers += static_cast<int64_t>(f.inputs.size());
  const int64_t tiles = (num_elements(root.type.shape) + kTileElems - 1) / kTileElems;
  const int64_t buf = std::min(kElementwiseBlockTiles, tiles) * kTileElems * 4;
  return 2 * buffers * buf <= static_cast<int64_t>(opt_.target.vmem_bytes / 2);
}

// Re-checks every mark (the graph may come from IR text with hand-written groups):
// a member joins only if it consumes the current end of the chain, that end has no
// other use and is no graph output (in an elementwise chain it may have: the kernel
// then stores it too, side_stored_), the member's shape is the root's (matmul,
// elementwise) or its other operand is a single element (conv2d, whose tiles are
// NHWC while the tensors are NCHW; a pointwise conv's are NCHW, so an operand of its
// shape too; a shifted conv that stores NCHW bands takes one such operand, of its
// dtype, after which only unary members), and that operand exists before the root
// runs.
// A node of an elementwise chain's group that does not read the chain's end is a
// feeder (passes.h): it joins when the member that reads it does, if it is an
// elementwise op of the root's shape, read by that member alone, whose operands
// exist before the root runs and its block buffers fit (feeder_fits); else it runs on
// its own where it stands, and the member reads its result if it stands before the
// root.
// A maxpool_grad takes one member, relu_grad_of_pool's.
// The first member that fails ends the chain; it and later ones run on their own.
void Emitter::plan_fusion() {
  chains_.clear();
  fused_.clear();
  feeds_.clear();
  side_stored_.clear();
  regions_.clear();
  region_of_.clear();
  region_exports_.clear();
  kinds_.clear();
  if (!opt_.fuse) return;
  // Row regions first: their nodes are one kernel's, a chain of the region's first
  // node (chains_, fused_), so the liveness and the op names treat them as a group.
  plan_row_regions();
  for (const auto& [rid, nodes] : regions_)
    for (size_t i = 1; i < nodes.size(); ++i) {
      chains_[rid].push_back(nodes[i]);
      fused_[nodes[i]->id] = rid;
    }
  std::map<std::string, int> uses;
  for (const Node& n : g_.nodes)
    for (const std::string& s : n.inputs) ++uses[s];
  for (const std::string& o : g_.outputs) uses[o] += 2;
  std::map<std::string, size_t> defined_at;  // tensor -> index of its node (inputs/consts: none)
  for (size_t k = 0; k < g_.nodes.size(); ++k) defined_at[g_.nodes[k].output] = k;
  std::map<int, size_t> index_of;
  for (size_t k = 0; k < g_.nodes.size(); ++k) index_of[g_.nodes[k].id] = k;
  std::set<int> cut;  // roots whose chain has ended
  std::set<int> on_bands;  // shifted convs whose chain has reached its members on NCHW bands
  std::map<int, std::string> end;
  for (size_t k = 0; k < g_.nodes.size(); ++k) {
    const Node& m = g_.nodes[k];
    if (m.fusion_group < 0 || !index_of.count(m.fusion_group) || cut.count(m.fusion_group)) continue;
    const size_t ri = index_of.at(m.fusion_group);
    const Node& root = g_.nodes[ri];
    if (region_of_.count(m.id) || region_of_.count(root.id)) {  // a row region's: the chain ends
      cut.insert(root.id);
      continue;
    }
    // A maxpool_grad's one member: the relu_grad of its result by its x.
    if (root.op == OpKind::kMaxPoolGrad) {
      if (!end.count(root.id) && ri < k && uses[root.output] == 1 && relu_grad_of_pool(root, m)) {
        chains_[root.id].push_back(&m);
        fused_[m.id] = root.id;
        end[root.id] = m.output;
      } else {
        cut.insert(root.id);
      }
      continue;
    }
    const bool root_ok = root.op == OpKind::kMatmul || root.op == OpKind::kConv2d ||
                         (is_elementwise(root.op) && root.fusion_group < 0);
    const std::string& run = end.count(root.id) ? end[root.id] : root.output;
    // A feeder: checked with the member that reads it.
    if (is_elementwise(root.op) && m.id != root.id && std::find(m.inputs.begin(), m.inputs.end(), run) == m.inputs.end())
      continue;
    if (fused_.count(root.id) || !root_ok || ri >= k) {
      cut.insert(root.id);
      continue;
    }
    if (!end.count(root.id)) end[root.id] = root.output;
    // An elementwise chain goes on past a result other nodes read too, storing it
    // (side_stored_); a matmul's or conv's epilogue ends there.
    const bool side = uses[run] != 1;
    bool ok = is_elementwise(m.op) && m.type.dtype != DType::kI64 && (!side || is_elementwise(root.op)) &&
              (m.inputs[0] == run || (m.inputs.size() == 2 && m.inputs[1] == run)) &&
              !(m.inputs.size() == 2 && m.inputs[0] == m.inputs[1]);
    const Node* feed = nullptr;
    if (ok && !unary(m)) {
      const std::string& other = m.inputs[0] == run ? m.inputs[1] : m.inputs[0];
      auto it = defined_at.find(other);
      if (it != defined_at.end() && g_.nodes[it->second].fusion_group == root.id && is_elementwise(root.op)) {
        feed = &g_.nodes[it->second];
        // Refused, a feeder before the root runs on its own and is read as it stands.
        if (!is_feeder(*feed, ri, defined_at, uses, root) || !feeder_fits(root, *feed)) {
          ok = it->second < ri;
          feed = nullptr;
        }
      } else {
        ok = it == defined_at.end() || it->second < ri;
      }
      const Shape& os = t_.at(other).type.shape;
      // A pointwise conv's tiles are NCHW (lower_pointwise): an operand of its shape too;
      // a shifted conv's NCHW bands take one, its own dtype, and only unary members after.
      if (root.op == OpKind::kConv2d) {
        const bool nchw_tiles = conv_tiles_nchw(root, t_.at(root.inputs[1]).type.shape);
        const bool bands = !nchw_tiles && os == root.type.shape && !on_bands.count(root.id) &&
                           t_.at(other).type.dtype == root.type.dtype && m.type.dtype == root.type.dtype &&
                           stores_nchw_bands(root);
        ok = ok && !on_bands.count(root.id) &&
             (num_elements(os) == 1 || (nchw_tiles && os == root.type.shape) || bands);
        if (ok && bands) on_bands.insert(root.id);
      }
      if (t_.at(other).type.dtype == DType::kI64) ok = false;
    }
    if (ok) ok = m.type.shape == root.type.shape;
    if (ok && on_bands.count(root.id)) ok = m.type.dtype == root.type.dtype;
    if (ok) ok = pow_lowered(m);
    if (!ok) {
      cut.insert(root.id);
      continue;
    }
    chains_[root.id].push_back(&m);
    fused_[m.id] = root.id;
    if (feed) {
      feeds_[m.id] = feed;
      fused_[feed->id] = root.id;
    }
    if (side) side_stored_.insert(run);
    end[root.id] = m.output;
  }
}

const std::vector<const Node*>& Emitter::chain_of(const Node& n) const {
  static const std::vector<const Node*> kNone;
  auto it = chains_.find(n.id);
  return it == chains_.end() ? kNone : it->second;
}

}  // namespace tpusim::compiler::lowering
