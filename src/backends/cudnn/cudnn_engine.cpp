// The engine layer (cudnn_engine.h): attend's problem as a cudnn-frontend SDPA
// graph, asked, cached and run. Compiled with NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING
// (src/backends/cudnn/CMakeLists.txt): every cuDNN call goes through the handle
// cudnn_library.cpp opened, so nothing here links cuDNN.
#include "backends/cudnn/cudnn_engine.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <exception>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "attend/error.h"
#include "backends/cuda/cuda_device.h"
#include "backends/cuda/cuda_params.h"
#include "backends/cudnn/cudnn_graph_build.h"
#include "backends/cudnn/cudnn_graph_desc.h"
#include "backends/cudnn/cudnn_library.h"
#include "backends/cudnn/cudnn_rules.h"

namespace attend::cudnn {
namespace {

namespace fe = cudnn_frontend;

// Enough for every (spec, pass, strides) a training job and its evaluation
// use; a built plan holds host memory only, evicted least recently used.
constexpr std::size_t kCacheCapacity = 256;

// One handle per (thread, device): cudnnSetStream on a shared handle would
// race. Never destroyed (the library is never closed either).
cudnnHandle_t handle_for(int device) {
  thread_local std::unordered_map<int, cudnnHandle_t> handles;
  auto it = handles.find(device);
  if (it != handles.end()) return it->second;
  cudnnHandle_t handle = nullptr;
  const cudnnStatus_t status = fe::detail::create_handle(&handle);
  if (status != CUDNN_STATUS_SUCCESS)
    throw Error(ErrorCode::bad_state, "cudnn", "cudnnCreate",
                std::string("cudnnCreate failed: ") + fe::detail::get_error_string(status));
  handles.emplace(device, handle);
  return handle;
}

struct Built {
  std::shared_ptr<fe::graph::Graph> graph;
  std::string error;           // non-empty: refused (the graph is then null)
  std::int64_t workspace = 0;  // cuDNN's, bytes
  std::mutex run;              // one enqueue at a time: executing a graph is not documented as reentrant
};

std::shared_ptr<Built> build(const GraphDesc& g) {
  auto b = std::make_shared<Built>();
  // Before any frontend call: its dynamic-loading shim caches each symbol on
  // first use, so a call with no library open would leave it null for good.
  const Library& lib = library();
  if (!lib.ok()) {
    b->error = "cuDNN is not loaded: " + lib.error;
    return b;
  }
  const char* step = "building the graph";
  try {
    const cuda::DeviceScope scope(g.device);
    cudnnHandle_t handle = handle_for(g.device);
    auto graph = make_graph(g);
    const auto fail = [&](const char* what, fe::error_t e) {
      if (e.is_good()) return false;
      step = what;
      b->error = e.get_message();
      return true;
    };
    if (fail("validate", graph->validate()) || fail("build_operation_graph", graph->build_operation_graph(handle)) ||
        fail("create_execution_plans", graph->create_execution_plans({fe::HeurMode_t::A})) ||
        fail("check_support", graph->check_support(handle)) ||
        fail("build_plans", graph->build_plans(handle, fe::BuildPlanPolicy_t::HEURISTICS_CHOICE)) ||
        fail("get_workspace_size", graph->get_workspace_size(b->workspace))) {
      b->error = "cuDNN refused the " + std::string(to_string(g.pass)) + " graph at " + step + ": " + b->error;
      return b;
    }
    b->graph = std::move(graph);
  } catch (const std::exception& e) {
    // The frontend throws for a missing symbol or a CUDA runtime it cannot open.
    b->error = "cuDNN refused the " + std::string(to_string(g.pass)) + " graph while " + step + ": " + e.what();
  }
  return b;
}

// Least-recently-used, bounded, thread-safe. A graph is built outside the
// lock (seconds for a new shape); two threads building one key keep the first.
class GraphCache {
 public:
  std::shared_ptr<Built> get(const GraphDesc& g) {
    const std::string key = g.key();
    {
      const std::lock_guard<std::mutex> lock(mutex_);
      if (auto hit = find(key)) return hit;
    }
    std::shared_ptr<Built> built = build(g);
    const std::lock_guard<std::mutex> lock(mutex_);
    if (auto hit = find(key)) return hit;
    order_.emplace_front(key, built);
    index_[key] = order_.begin();
    if (order_.size() > kCacheCapacity) {
      index_.erase(order_.back().first);
      order_.pop_back();
    }
    return built;
  }
  std::size_t size() {
    const std::lock_guard<std::mutex> lock(mutex_);
    return order_.size();
  }

 private:
  using Entry = std::pair<std::string, std::shared_ptr<Built>>;
  std::shared_ptr<Built> find(const std::string& key) {
    auto it = index_.find(key);
    if (it == index_.end()) return nullptr;
    order_.splice(order_.begin(), order_, it->second);
    return it->second->second;
  }
  std::mutex mutex_;
  std::list<Entry> order_;
  std::unordered_map<std::string, std::list<Entry>::iterator> index_;
};

GraphCache& cache() {
  static GraphCache* c = new GraphCache;  // leaked: plans may be used from other statics' destructors
  return *c;
}

// The extras (desc.h), filled on the host and copied behind cuDNN's
// workspace, in stream order. Pageable source: the copy has left `host` when
// cudaMemcpyAsync returns.
void upload_extras(const AttentionSpec& s, const GraphDesc& g, const Extras& e, const Inputs& index, std::byte* device,
                   cudaStream_t stream) {
  if (e.bytes == 0) return;
  const std::vector<std::int32_t> host = fill_extras(s, g, e, index);
  cuda::check(cudaMemcpyAsync(device, host.data(), e.bytes, cudaMemcpyHostToDevice, stream),
              "cudaMemcpyAsync(cudnn lengths)");
}

// The call's tensors in the graph's roles (forward's; backward adds its own).
Views call_views(const Inputs& in, const TensorView& out, const TensorView& lse) {
  Views v;
  v.t[rQ] = in.q;
  v.t[rK] = in.k;
  v.t[rV] = in.v;
  v.t[rO] = out;
  v.t[rStats] = lse;
  v.bias = in.bias;
  v.block_table = in.block_table;
  v.sinks = in.sinks;
  return v;
}

// Variant pack of the role tensors (uid = role + 1) a pass reads and writes.
std::unordered_map<std::int64_t, void*> role_pointers(const Views& v, Pass pass) {
  std::unordered_map<std::int64_t, void*> pack;
  const int last = pass == Pass::forward ? rStats : rDV;
  for (int r = 0; r <= last; ++r) pack[r + 1] = v.t[r].data;
  return pack;
}

// Runs `g` (the call's graph) with the pointers in `pack`, cuDNN's workspace
// and the extras in the caller's workspace, or in stream-ordered memory when
// the call's strides needed a larger one than the check sized.
void execute(const AttentionSpec& s, const GraphDesc& g, const Inputs& in, const Workspace& ws,
             std::unordered_map<std::int64_t, void*>& pack, cudaStream_t stream) {
  const std::shared_ptr<Built> built = cache().get(g);
  if (!built->graph)
    throw Error(ErrorCode::unsupported, "strides", "cudnn",
                "the tensors' strides differ from the packed layout the check asked about, and " + built->error);
  const Extras e = extras_for(g);
  const std::size_t cudnn_bytes = aligned(static_cast<std::size_t>(built->workspace));
  const std::size_t need = cudnn_bytes + e.bytes;
  void* base = ws.data;
  const bool own = need > ws.bytes;
  if (own) cuda::check(cudaMallocAsync(&base, need, stream), "cudaMallocAsync(cudnn workspace)");
  try {
    // Validates what the kernels will follow, as the runtime does on the host.
    cuda::HostIndex index;
    if (g.varlen || g.paged || g.sink == SoftmaxType::learnable) cuda::read_index_tensors(s, in, stream, index);
    auto* extras = static_cast<std::byte*>(base) + cudnn_bytes;
    upload_extras(s, g, e, index.in, extras, stream);
    if (g.varlen || g.paged) {
      pack[kSeqQ] = extras + e.seq_q;
      pack[kSeqKv] = extras + e.seq_kv;
    }
    if (g.varlen) {
      const int last = g.pass == Pass::forward ? rStats : rDV;
      for (int r = 0; r <= last; ++r) pack[kRagged + r] = extras + e.ragged[r];
    }
    if (g.sink == SoftmaxType::learnable) pack[kSink] = in.sinks.data;
    if (g.sink == SoftmaxType::off_by_one) pack[kSink] = extras + e.sink;  // zeros: the sink logit 0
    if (g.has_bias) pack[kBias] = in.bias.data;
    if (g.paged) pack[kPageK] = pack[kPageV] = in.block_table.data;
    cudnnHandle_t handle = handle_for(g.device);
    const cudnnStatus_t status = fe::detail::set_stream(handle, stream);
    if (status != CUDNN_STATUS_SUCCESS)
      throw Error(ErrorCode::bad_state, "cudnn", "cudnnSetStream", fe::detail::get_error_string(status));
    const std::lock_guard<std::mutex> lock(built->run);
    fe::error_t r = built->graph->execute(handle, pack, base);
    if (r.is_bad())
      throw Error(ErrorCode::bad_state, "cudnn", std::string(to_string(g.pass)),
                  "cuDNN failed to run the graph: " + r.get_message());
  } catch (...) {
    if (own) (void)cudaFreeAsync(base, stream);
    throw;
  }
  if (own) cuda::check(cudaFreeAsync(base, stream), "cudaFreeAsync(cudnn workspace)");
}

}  // namespace

std::string engine_check(const AttentionSpec& spec, Pass pass, int device, int sm) {
  return cache().get(describe(spec, pass, device, sm, packed_views(spec)))->error;
}

std::size_t engine_workspace(const AttentionSpec& spec, Pass pass, int device, int sm) {
  const GraphDesc g = describe(spec, pass, device, sm, packed_views(spec));
  const std::shared_ptr<Built> built = cache().get(g);
  if (!built->graph) return 0;
  return aligned(static_cast<std::size_t>(built->workspace)) + extras_for(g).bytes;
}

void engine_forward(const ForwardArgs& a, int sm) {
  const int device = a.target.device.index;
  const cuda::DeviceScope scope(device);
  const Views v = call_views(a.in, a.out, a.lse);
  const GraphDesc g = describe(a.spec, Pass::forward, device, sm, v);
  std::unordered_map<std::int64_t, void*> pack = role_pointers(v, Pass::forward);
  execute(a.spec, g, a.in, a.workspace, pack, static_cast<cudaStream_t>(a.stream.handle));
}

void engine_backward(const BackwardArgs& a, int sm) {
  const int device = a.target.device.index;
  const cuda::DeviceScope scope(device);
  Views v = call_views(a.in, a.out, a.lse);
  v.t[rDO] = a.dout;
  v.t[rDQ] = a.dq;
  v.t[rDK] = a.dk;
  v.t[rDV] = a.dv;
  v.dsinks = a.dsinks;
  const GraphDesc g = describe(a.spec, Pass::backward, device, sm, v);
  std::unordered_map<std::int64_t, void*> pack = role_pointers(v, Pass::backward);
  if (a.spec.softmax_type == SoftmaxType::learnable) pack[kDSink] = a.dsinks.data;
  execute(a.spec, g, a.in, a.workspace, pack, static_cast<cudaStream_t>(a.stream.handle));
}

std::size_t engine_cache_size() { return cache().size(); }

}  // namespace attend::cudnn
