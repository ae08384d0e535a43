// cudnn-frontend's dynamic-loading mode (NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING)
// resolves every cuDNN entry point with dlsym on cudnn_frontend::cudnn_dlhandle,
// which the application owns and sets: it is defined here, next to the dlopen.
#include "backends/cudnn/cudnn_library.h"

#include <dlfcn.h>

#include <cstdlib>

namespace cudnn_frontend {
// Declared by cudnn_frontend_shim.h (extern void* cudnn_dlhandle) in dynamic-loading builds.
void* cudnn_dlhandle = nullptr;
}  // namespace cudnn_frontend

namespace attend::cudnn {
namespace {

// The SONAME of cuDNN 9's front library (it loads its engine libraries itself).
constexpr const char* kDefaultLibrary = "libcudnn.so.9";
constexpr int kMinVersion = 90000;

Library open_library() {
  Library lib;
  const char* env = std::getenv("ATTEND_CUDNN_LIBRARY");
  lib.name = env && *env ? env : kDefaultLibrary;
  dlerror();
  // RTLD_LOCAL: cuDNN's symbols stay out of the global namespace; the frontend
  // reaches them through the handle only.
  void* handle = dlopen(lib.name.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    const char* why = dlerror();
    lib.error =
        "dlopen(" + lib.name + ") failed: " + (why ? why : "no message") +
        " (install cuDNN 9, e.g. the nvidia-cudnn-cu13 wheel, on the library path, or set ATTEND_CUDNN_LIBRARY)";
    return lib;
  }
  using GetVersion = std::size_t (*)();
  auto get_version = reinterpret_cast<GetVersion>(dlsym(handle, "cudnnGetVersion"));
  if (!get_version) {
    const char* why = dlerror();
    lib.error = lib.name + " has no cudnnGetVersion: " + (why ? why : "no message");
    return lib;
  }
  lib.version = static_cast<int>(get_version());
  if (lib.version < kMinVersion) {
    lib.error = lib.name + " is cuDNN " + std::to_string(lib.version / 1000) + "." +
                std::to_string(lib.version / 100 % 10) + ": the backend needs cuDNN 9";
    return lib;
  }
  cudnn_frontend::cudnn_dlhandle = handle;
  return lib;
}

}  // namespace

const Library& library() {
  static const Library lib = open_library();
  return lib;
}

}  // namespace attend::cudnn
