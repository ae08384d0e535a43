// The cudnn backend's engine layer: on a device, a pass is supported only when
// cuDNN accepts the graph that pass needs. The SDPA forward graph (and for
// backward the sdpa_backward graph) is built with cudnn-frontend's graph API
// and taken through validate, build_operation_graph, create_execution_plans,
// check_support and build_plans; the first refusal's message is the reason.
// Built graphs (and refusals) are cached per graph key, bounded and
// thread-safe, and the same cached graph runs the pass. GPU only: nothing here
// runs without a device (the rule layer, cudnn_rules.h, answers there).
#pragma once

#include <cstddef>
#include <string>

#include "attend/backend.h"

namespace attend::cudnn {

// "" when cuDNN builds a plan for `pass` of `spec` on cuda:`device` (compute
// capability `sm`), else cuDNN's message, naming the step that refused. The
// graph uses the layout's packed strides (the tensors a Plan allocates).
std::string engine_check(const AttentionSpec& spec, Pass pass, int device, int sm);

// Device scratch bytes of that graph: cuDNN's workspace plus the sequence
// lengths and ragged offsets the backend uploads. 0 when the graph was refused.
std::size_t engine_workspace(const AttentionSpec& spec, Pass pass, int device, int sm);

// Run a pass on args.stream with the graph for the call's actual strides
// (built and cached when they differ from the packed ones). Throws
// attend::Error(unsupported) with cuDNN's message when that graph is refused.
void engine_forward(const ForwardArgs& args, int sm);
void engine_backward(const BackwardArgs& args, int sm);

// Graphs currently cached (for tests and the device check's report).
std::size_t engine_cache_size();

}  // namespace attend::cudnn
