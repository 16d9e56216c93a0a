// Training graphs (docs/training.md): from a forward graph, one training step as a
// graph of ordinary IR ops: the forward pass, a loss (softmax cross-entropy or
// MSE), the backward pass by reverse-mode differentiation, and an SGD or momentum
// update. Its outputs are the loss and the updated parameters, so the step runs
// through the same reference, lowering and simulator as any other graph.
#pragma once

#include <string>

#include "compiler/ir/graph.h"

namespace tpusim::compiler {

struct TrainOptions {
  enum class Loss { kSoftmaxXent, kMse };
  enum class Labels { kOneHot, kIndex };
  Loss loss = Loss::kSoftmaxXent;
  // xent labels: one-hot f32[B, classes], or class indices as f32[B] values.
  Labels labels = Labels::kOneHot;
  float lr = 0.01f;
  float momentum = 0.0f;  // 0: plain SGD (no velocity buffers)
  // Data-parallel replicas of the step: gradients pass through all_reduce and are
  // divided by this before the update (1: no all_reduce).
  int replicas = 1;
};

// "sgd:lr=0.01" or "sgd:lr=0.01,momentum=0.9" into `o`; loss "xent", "xent-index"
// (class-index labels) or "mse". Throws CompileError naming the bad part.
void parse_train_spec(const std::string& optimizer, const std::string& loss, TrainOptions* o);

// The training step of `forward` (one output: logits, or a softmax over the last
// axis whose logits are used, for xent; the prediction for mse). Parameters are
// the forward graph's float constants that the loss depends on; they stay
// constants (the step starts from the model's values) and every one gets an output
// "<name>.new" (and "<name>.velocity.new" with momentum, whose input velocity is a
// zero constant "<name>.velocity"). The first output is "loss" (the mean over the
// batch; over all replicas' batches when replicas > 1). New input: "labels".
// Throws CompileError naming the node for an op with no gradient recipe.
Graph build_training_graph(const Graph& forward, const TrainOptions& options);

}  // namespace tpusim::compiler
