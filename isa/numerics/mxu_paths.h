// The code paths of the fast MXU kernel (mxu_fast.cpp), exposed so tests can hold
// every path bit-identical to mxu_matmul_reference and benchmarks can time each
// one, whatever path the dispatcher would pick on the host CPU.
#pragma once

#include "isa/numerics/mxu.h"

namespace tpusim::num {

enum class MxuPath { kPortable, kAvx2, kAvx512 };

inline constexpr MxuPath kAllMxuPaths[] = {MxuPath::kPortable, MxuPath::kAvx2, MxuPath::kAvx512};

// "portable", "avx2", "avx512".
const char* mxu_path_name(MxuPath path);

// Whether this build has the path and the host CPU (and OS) can run it.
bool mxu_path_supported(MxuPath path);

// The path mxu_matmul dispatches to on this CPU (the widest supported one).
MxuPath mxu_selected_path();

// mxu_matmul forced onto one path. Throws std::invalid_argument if the path is not
// supported here, or if the arguments are malformed (see mxu_validate_args).
void mxu_matmul_with(MxuPath path, const MatmulArgs& args);

// MxuPackedWeights::pack for one path (mxu_matmul_packed then runs that path).
// Throws std::invalid_argument if the path is not supported here.
void mxu_pack_weights_with(MxuPath path, MxuPackedWeights& out, const uint16_t* w, size_t ldw, int k, int n,
                           int rows);

// Throws std::invalid_argument naming the problem when args cannot describe a
// matmul (negative sizes, rows < 1, null pointers with nonzero sizes, leading
// dimensions shorter than a row).
void mxu_validate_args(const MatmulArgs& args);

}  // namespace tpusim::num
