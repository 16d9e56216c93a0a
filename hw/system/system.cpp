#include "hw/system/system.h"

namespace tpusim::hw {

struct System::Impl {
  const config::Params& preset;
  const isa::Bundle& bundle;
  Inputs inputs;
};

System::System(const config::Params& preset, const isa::Bundle& bundle, const Inputs& inputs)
    : impl_(new Impl{preset, bundle, inputs}) {}

System::~System() = default;

RunResult System::run(const RunOptions& /*options*/) {
  RunResult r;
  r.faulted = true;
  r.fault = "the chip model is not built yet";
  return r;
}

io::NpyArray System::read_output(const std::string& name) const {
  throw SystemError("output '" + name + "': the chip model is not built yet");
}

std::vector<uint8_t> System::read_bytes(isa::Space, uint32_t, uint32_t, uint64_t, uint64_t) const {
  throw SystemError("the chip model is not built yet");
}

}  // namespace tpusim::hw
