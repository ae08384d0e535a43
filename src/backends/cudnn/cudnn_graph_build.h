// A GraphDesc (cudnn_graph_desc.h) as a cudnn-frontend SDPA graph: the one
// place both the on-device engine (cudnn_engine.cpp) and the deviceless check
// (cudnn_deviceless.cpp) build graphs, so the graph cuDNN judges without a GPU
// is the graph a device would run. Includes cudnn-frontend: compiled only in
// the backend's frontend translation units.
#pragma once

#include <cudnn_frontend.h>

#include <memory>

#include "backends/cudnn/cudnn_graph_desc.h"

namespace attend::cudnn {

// The sdpa (forward) or sdpa_backward graph of g.pass, not yet validated. The
// compute capability is g.sm (set, so the frontend asks no CUDA runtime).
std::shared_ptr<cudnn_frontend::graph::Graph> make_graph(const GraphDesc& g);

}  // namespace attend::cudnn
