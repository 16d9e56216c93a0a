// libFuzzer entry for the assembler (build with -DTPUSIM_FUZZ=ON and clang).
#include "tests/isa/fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  tpusim::isa::fuzz::assemble_once(data, size);
  return 0;
}
