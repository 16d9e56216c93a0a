// tpusim_randprog: writes one random program of the bit-exact harness, so a
// failing seed can be reproduced, read and bisected by hand:
//   tpusim_randprog --seed 1234 --out /tmp/p && tpusim asm /tmp/p/prog.s -o /tmp/p/prog.tpu
// prints the `--input NAME=FILE` arguments for `tpusim ref` / `tpusim run`.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <filesystem>

#include "isa/io/npy.h"
#include "tests/random/program_gen.h"

int main(int argc, char** argv) {
  CLI::App app{"Write a random valid tpusim program and its inputs"};
  uint64_t seed = 0;
  std::string out = ".";
  tpusim::randprog::GenOptions opt;
  app.add_option("--seed", seed, "Program seed")->required();
  app.add_option("--out", out, "Directory for prog.s and the input .npy files");
  app.add_option("--cores", opt.max_cores, "Most cores the program may use")->check(CLI::Range(1, 2));
  app.add_option("--mxus", opt.mxus, "MXUs per core of the target")->check(CLI::Range(1, 16));
  app.add_flag("--two-chips", opt.two_chips, "Let a two-core program put its second core on chip 1");
  app.add_option("--ops", opt.max_ops, "Most compute instructions per core")->check(CLI::Range(1, 100000));
  CLI11_PARSE(app, argc, argv);
  opt.min_ops = std::min(opt.min_ops, opt.max_ops);
  try {
    std::filesystem::create_directories(out);
    const auto p = tpusim::randprog::generate(seed, opt);
    tpusim::io::write_file_atomic(out + "/prog.s", p.assembly);
    for (const auto& [name, arr] : p.inputs) {
      tpusim::io::write_npy(out + "/" + name + ".npy", arr);
      std::printf("--input %s=%s/%s.npy ", name.c_str(), out.c_str(), name.c_str());
    }
    std::printf("\n");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tpusim_randprog: error: %s\n", e.what());
    return 2;
  }
  return 0;
}
