#include "hw/system/system.h"

#include "isa/exec/tensors.h"

namespace tpusim::hw {

struct System::Impl {
  const config::Params& preset;
  const isa::Bundle& bundle;
  exec::Machine machine;
};

System::System(const config::Params& preset, const isa::Bundle& bundle)
    : impl_(new Impl{preset, bundle, exec::Machine(bundle.target)}) {
  exec::load_constants(impl_->machine, bundle);
}

System::~System() = default;

RunResult System::run(const RunOptions& /*options*/) {
  RunResult r;
  r.faulted = true;
  r.fault = "the chip model is not built yet";
  return r;
}

exec::Machine& System::machine() { return impl_->machine; }
const exec::Machine& System::machine() const { return impl_->machine; }

}  // namespace tpusim::hw
