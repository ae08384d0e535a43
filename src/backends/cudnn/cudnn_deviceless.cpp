// The deviceless check (cudnn_deviceless.h). cuDNN 9.8+ takes a device
// descriptor in place of a device; the frontend then builds the operation
// graph without a handle and asks cuDNN's heuristics and check_support as it
// would on the GPU. Nothing here touches a device: no handle, no CUDA
// runtime call, no build_plans (which would compile kernels and fail to load
// them).
#include "backends/cudnn/cudnn_deviceless.h"

#include <dlfcn.h>

#include <cstdlib>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "backends/cudnn/cudnn_graph_build.h"
#include "backends/cudnn/cudnn_graph_desc.h"
#include "backends/cudnn/cudnn_library.h"

#ifndef ATTEND_CUDA_STUB_LIBCUDA
#define ATTEND_CUDA_STUB_LIBCUDA ""
#endif

namespace attend::cudnn {
namespace {

namespace fe = cudnn_frontend;

// Verdicts are short strings: far more fit than built graphs, and a sweep
// asks a few thousand. Beyond this the cache starts over.
constexpr std::size_t kCacheCapacity = 8192;

struct Libcuda {
  std::string name, error;
};

Libcuda open_libcuda() {
  Libcuda r;
  // The driver first: with one installed the stub must not shadow it.
  if (dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL)) {
    r.name = "libcuda.so.1 (the driver)";
    return r;
  }
  std::string tried = "libcuda.so.1: " + std::string(dlerror());
  std::vector<std::string> stubs;
  const char* env = std::getenv("ATTEND_CUDNN_LIBCUDA");
  if (env && *env) {
    stubs.push_back(env);  // named: the only one tried
  } else {
    if (*ATTEND_CUDA_STUB_LIBCUDA) stubs.push_back(ATTEND_CUDA_STUB_LIBCUDA);
    for (const char* var : {"CUDA_HOME", "CUDA_PATH"}) {
      const char* home = std::getenv(var);
      if (home && *home) stubs.push_back(std::string(home) + "/lib64/stubs/libcuda.so");
    }
    stubs.push_back("/usr/local/cuda/lib64/stubs/libcuda.so");
  }
  for (const std::string& path : stubs) {
    // The stub's SONAME is libcuda.so.1, so cuDNN's own dlopen of that name
    // finds it already loaded. It answers every driver call with "stub
    // library" (CUDA error 34), which is all cuDNN needs up to check_support.
    if (dlopen(path.c_str(), RTLD_NOW | RTLD_GLOBAL)) {
      r.name = path + " (the CUDA toolkit's driver stub)";
      return r;
    }
    tried += "; " + path + ": " + dlerror();
  }
  r.error =
      "cuDNN's deviceless check needs a loadable libcuda (the driver, or the CUDA toolkit's lib64/stubs/libcuda.so; "
      "ATTEND_CUDNN_LIBCUDA names one): " +
      tried;
  return r;
}

const Libcuda& libcuda() {
  static const Libcuda l = open_libcuda();
  return l;
}

// One descriptor per target, deserialized once (cuDNN validates the JSON).
std::shared_ptr<const fe::DeviceProperties> descriptor(const AssumedTarget& t, std::string* error) {
  static std::mutex mutex;
  static std::map<std::string, std::pair<std::shared_ptr<const fe::DeviceProperties>, std::string>> made;
  const std::lock_guard<std::mutex> lock(mutex);
  auto it = made.find(t.cache_key());
  if (it == made.end()) {
    auto props = std::make_shared<fe::DeviceProperties>();
    std::string why;
    try {
      fe::error_t e = props->deserialize(std::vector<std::uint8_t>(t.json.begin(), t.json.end()));
      if (e.is_bad()) why = e.get_message();
    } catch (const std::exception& ex) {
      why = ex.what();
    }
    if (!why.empty()) props = nullptr;
    it = made.emplace(t.cache_key(), std::make_pair(std::move(props), why)).first;
  }
  *error = it->second.second;
  return it->second.first;
}

std::string ask(const GraphDesc& g, const AssumedTarget& t, int version) {
  const std::string head = deviceless_label(t, version) + ": ";
  std::string why;
  const auto props = descriptor(t, &why);
  if (!props) return head + "cuDNN refused the device descriptor: " + why;
  const char* step = "building the graph";
  try {
    auto graph = make_graph(g);
    graph->set_device_properties(props);
    std::string message;
    const auto fail = [&](const char* what, fe::error_t e) {
      if (e.is_good()) return false;
      step = what;
      message = e.get_message();
      return true;
    };
    if (fail("validate", graph->validate()) || fail("build_operation_graph", graph->build_operation_graph()) ||
        fail("create_execution_plans", graph->create_execution_plans({fe::HeurMode_t::A})) ||
        fail("check_support", graph->check_support()))
      return head + "refused the " + std::string(to_string(g.pass)) + " graph at " + step + ": " + message;
  } catch (const std::exception& e) {
    return head + "refused the " + std::string(to_string(g.pass)) + " graph while " + step + ": " + e.what();
  }
  return "";
}

class VerdictCache {
 public:
  std::string get(const std::string& key, const auto& compute) {
    {
      const std::lock_guard<std::mutex> lock(mutex_);
      if (auto it = map_.find(key); it != map_.end()) return it->second;
    }
    std::string verdict = compute();  // outside the lock: ~0.1 s of heuristics per graph
    const std::lock_guard<std::mutex> lock(mutex_);
    if (map_.size() >= kCacheCapacity) map_.clear();
    return map_.emplace(key, std::move(verdict)).first->second;
  }
  std::size_t size() {
    const std::lock_guard<std::mutex> lock(mutex_);
    return map_.size();
  }

 private:
  std::mutex mutex_;
  std::unordered_map<std::string, std::string> map_;
};

VerdictCache& cache() {
  static VerdictCache* c = new VerdictCache;  // leaked, like the engine's graph cache
  return *c;
}

}  // namespace

const std::string& deviceless_libcuda_error() { return libcuda().error; }
const std::string& deviceless_libcuda_name() { return libcuda().name; }

std::string deviceless_label(const AssumedTarget& t, int version) {
  return "cuDNN " + version_string(version) + " for " + t.label + ", deviceless";
}

std::string deviceless_check(const AttentionSpec& spec, Pass pass, const AssumedTarget& t, int version) {
  return deviceless_check(spec, pass, t, version, packed_views(spec));
}

std::string deviceless_check(const AttentionSpec& spec, Pass pass, const AssumedTarget& t, int version,
                             const Views& views) {
  const Library& lib = library();  // before any frontend call (its shim caches symbols on first use)
  if (!lib.ok()) return deviceless_label(t, version) + ": cuDNN is not loaded: " + lib.error;
  if (!libcuda().error.empty()) return deviceless_label(t, version) + ": " + libcuda().error;
  // device -1: no device; the key then differs from every on-device graph's.
  const GraphDesc g = describe(spec, pass, -1, t.rules.sm, views);
  return cache().get(t.cache_key() + "|" + g.key(), [&] { return ask(g, t, version); });
}

std::size_t deviceless_cache_size() { return cache().size(); }

}  // namespace attend::cudnn
