// cuDNN, opened at run time. libattend links no cuDNN: the first check of a
// problem on a cuda device opens libcudnn.so.9 (or $ATTEND_CUDNN_LIBRARY),
// once per process, so a build with the cudnn backend loads and runs where
// cuDNN is absent and the backend declines with the loader's message.
#pragma once

#include <string>

namespace attend::cudnn {

struct Library {
  std::string name;   // what dlopen was given
  std::string error;  // non-empty: not usable (dlopen/dlsym's message, or a version too old)
  int version = 0;    // cudnnGetVersion(), e.g. 91900
  bool ok() const { return error.empty(); }
};

// Opened on first use, thread-safe; never closed (cuDNN's handles and plans
// may outlive any scope). Sets cudnn-frontend's dynamic-loading handle.
const Library& library();

}  // namespace attend::cudnn
