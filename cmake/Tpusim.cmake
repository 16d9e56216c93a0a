# Everything project-wide in one place: dependencies, warning and sanitizer flags,
# and the SystemC pitfalls of Debian 12 (see docs/build.md):
#  * libsystemc-dev 2.3.4 is C++17-only: SC_CPLUSPLUS is pinned to 201703L.
#  * no CMake package: found through pkg-config.
#  * libsystemc.so defines main(): a test linked with gtest_main may silently run
#    zero tests, so SystemC tests link GTest::gtest plus our sc_main runner, which
#    calls RUN_ALL_TESTS().
#  * one elaboration per process: gtest_discover_tests runs every test in its own
#    process.

find_package(PkgConfig REQUIRED)
pkg_check_modules(SYSTEMC REQUIRED IMPORTED_TARGET systemc)
find_package(Eigen3 3.4 REQUIRED NO_MODULE)
find_package(fmt REQUIRED)
find_package(GTest REQUIRED)
find_package(nlohmann_json REQUIRED)
find_package(CLI11 REQUIRED)
find_package(yaml-cpp REQUIRED)
find_package(Threads REQUIRED)
if(TPUSIM_BUILD_BENCH)
  find_package(benchmark REQUIRED)
endif()
include(GoogleTest)

# Flags every target of ours gets.
add_library(tpusim_flags INTERFACE)
target_compile_options(tpusim_flags INTERFACE -Wall -Wextra)
if(TPUSIM_WERROR)
  target_compile_options(tpusim_flags INTERFACE -Werror)
endif()
if(TPUSIM_SANITIZE)
  target_compile_options(tpusim_flags INTERFACE -fsanitize=address,undefined
                         -fno-sanitize-recover=undefined -fno-omit-frame-pointer)
  target_link_options(tpusim_flags INTERFACE -fsanitize=address,undefined)
endif()

# Numerics code: no contraction of a*b+c into an FMA, which rounds once where the
# contract (shared/spec/numerics.md) rounds twice.
add_library(tpusim_numerics_flags INTERFACE)
target_compile_options(tpusim_numerics_flags INTERFACE -ffp-contract=off)

# SystemC with the C++17 API pin.
add_library(tpusim_systemc INTERFACE)
target_link_libraries(tpusim_systemc INTERFACE PkgConfig::SYSTEMC Threads::Threads)
target_compile_definitions(tpusim_systemc INTERFACE SC_CPLUSPLUS=201703L)

# tpusim_add_gtest(NAME SOURCES <src...> LIBS <lib...> [SYSTEMC] [TIMEOUT <s>]
#                  [LABELS <label...>])
# A gtest executable whose tests ctest runs one per process. With SYSTEMC it links
# SystemC and our sc_main-based runner instead of gtest_main.
function(tpusim_add_gtest name)
  cmake_parse_arguments(T "SYSTEMC" "TIMEOUT" "SOURCES;LIBS;LABELS" ${ARGN})
  add_executable(${name} ${T_SOURCES})
  target_link_libraries(${name} PRIVATE tpusim_flags ${T_LIBS})
  if(T_SYSTEMC)
    target_link_libraries(${name} PRIVATE tpusim_sc_gtest_main tpusim_systemc GTest::gtest)
  else()
    target_link_libraries(${name} PRIVATE GTest::gtest GTest::gtest_main)
  endif()
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 300)
  endif()
  # ASan + UBSan run these ~5-10x slower: a Release limit would fail a correct
  # test there. (DpLower.PooledSlicesOnV2Slice4x4, 49 s in Release, did not finish
  # in 3000 s sanitized; it skips itself under ASan.)
  if(TPUSIM_SANITIZE)
    math(EXPR T_TIMEOUT "${T_TIMEOUT} * 10")
  endif()
  set(props TIMEOUT ${T_TIMEOUT} ENVIRONMENT SYSTEMC_DISABLE_COPYRIGHT_MESSAGE=1)
  if(T_LABELS)
    list(APPEND props LABELS "${T_LABELS}")
  endif()
  gtest_discover_tests(${name} DISCOVERY_TIMEOUT 60 PROPERTIES ${props})
endfunction()
