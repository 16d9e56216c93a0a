// tpusim-train-graph: writes the training step of a model as graph IR text.
//   tpusim-train-graph MODEL -o OUT.ir [--train sgd:lr=X[,momentum=Y]] [--loss xent|xent-index|mse]
//                      [--replicas N]
// The result compiles (`tpusim compile OUT.ir`) and evaluates (`tpusim ref OUT.ir`)
// like any graph. Exit 2 with one line on stderr for a bad model or option.
#include <cstdio>
#include <string>

#include "compiler/compiler.h"
#include "compiler/train/train.h"
#include "isa/io/npy.h"

using namespace tpusim::compiler;

int main(int argc, char** argv) {
  try {
    std::string model, out, train = "sgd:lr=0.01", loss = "xent";
    int replicas = 1;
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      auto next = [&]() -> std::string {
        if (i + 1 >= argc) throw CompileError(a + " needs a value");
        return argv[++i];
      };
      if (a == "-o" || a == "--output") out = next();
      else if (a == "--train") train = next();
      else if (a == "--loss") loss = next();
      else if (a == "--replicas") {
        const std::string v = next();
        try {
          replicas = std::stoi(v);
        } catch (const std::exception&) {
          throw CompileError("--replicas '" + v + "' is not a number");
        }
      } else if (a == "-h" || a == "--help") {
        std::printf("usage: tpusim-train-graph MODEL -o OUT.ir [--train sgd:lr=X[,momentum=Y]] "
                    "[--loss xent|xent-index|mse] [--replicas N]\n");
        return 0;
      } else if (!a.empty() && a[0] == '-') throw CompileError("unknown option '" + a + "'");
      else if (model.empty()) model = a;
      else throw CompileError("more than one model given ('" + model + "', '" + a + "')");
    }
    if (model.empty() || out.empty()) throw CompileError("usage: tpusim-train-graph MODEL -o OUT.ir [--train ...] [--loss ...]");
    TrainOptions o;
    parse_train_spec(train, loss, &o);
    o.replicas = replicas;
    const Graph g = build_training_graph(load_model(model), o);
    tpusim::io::write_file_atomic(out, print_graph(g));  // whole or not at all
    std::printf("%s: training step, %zu nodes, %zu outputs -> %s\n", model.c_str(), g.nodes.size(), g.outputs.size(),
                out.c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }
}
