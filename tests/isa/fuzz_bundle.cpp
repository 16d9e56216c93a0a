// libFuzzer entry for the bundle loader (build with -DTPUSIM_FUZZ=ON and clang).
#include "tests/isa/fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  tpusim::isa::fuzz::load_once(data, size);
  return 0;
}
