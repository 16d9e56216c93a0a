// Placeholder until the vectorised kernel lands: same results by construction.
#include "isa/numerics/mxu.h"

namespace tpusim::num {

void mxu_matmul(const MatmulArgs& args) { mxu_matmul_reference(args); }
const char* mxu_matmul_isa() { return "portable"; }

}  // namespace tpusim::num
