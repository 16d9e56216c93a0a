// Test runner for binaries that link SystemC. libsystemc.so owns main() and calls
// sc_main(), so gtest's own main would never run: we start gtest from here.
#include <gtest/gtest.h>
#include <systemc>

int sc_main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
