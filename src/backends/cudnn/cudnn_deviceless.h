// cuDNN's verdict without a GPU: the pass's graph (the one a device would
// run, cudnn_graph_build.h) taken through validate, build_operation_graph,
// create_execution_plans (heuristics A) and check_support for a device
// descriptor (cudnn_targets.h) instead of a device. What it is: cuDNN saying
// it has an engine and a plan for this graph on that GPU. What it is not: a
// plan built (build_plans compiles kernels and loads them into a device) or
// a kernel run, so workspace sizes, run-time failures and numbers stay
// unmeasured until a device runs the same graph.
#pragma once

#include <cstddef>
#include <string>

#include "attend/backend.h"
#include "backends/cudnn/cudnn_graph_desc.h"
#include "backends/cudnn/cudnn_targets.h"

namespace attend::cudnn {

// cuDNN needs a libcuda it can dlopen even to check a descriptor: the
// driver's libcuda.so.1 where there is one, else the CUDA toolkit's stub
// ($ATTEND_CUDNN_LIBCUDA names one; else <toolkit>/lib64/stubs/libcuda.so of
// the toolkit attend was built with, $CUDA_HOME or /usr/local/cuda), loaded
// only when a deviceless check is first asked for. "" when one is loaded,
// else what was tried (the [library] reason). Once per process.
const std::string& deviceless_libcuda_error();
// Which libcuda the deviceless checks use ("" before the first or on failure).
const std::string& deviceless_libcuda_name();

// "" when cuDNN (the loaded library, release `version`) accepts the graph of
// `pass` of `spec` for `target`'s descriptor, else the refusal naming the
// layer, target, step and cuDNN's message. Cached per (target, graph key).
std::string deviceless_check(const AttentionSpec& spec, Pass pass, const AssumedTarget& target, int version);
// The same for the call's tensors `views` (their strides and bias broadcast)
// instead of the layout's packed ones: a graph a device would build on first use.
std::string deviceless_check(const AttentionSpec& spec, Pass pass, const AssumedTarget& target, int version,
                             const Views& views);

// Verdicts currently cached (tests).
std::size_t deviceless_cache_size();

// The prefix of every deviceless verdict: "cuDNN 9.19.0 for H100 SXM descriptor, deviceless".
std::string deviceless_label(const AssumedTarget& target, int version);

}  // namespace attend::cudnn
