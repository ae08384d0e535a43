// Internal: the cached selection, shared between select(), plans and the
// contexts forward() hands out (backward must run on exactly this choice).
#pragma once

#include <memory>

#include "attend/select.h"

namespace attend::detail {

// One (backend, variant) the selector considered, in its order.
struct Candidate {
  std::shared_ptr<const Backend> backend;
  int variant = -1;
  bool eligible = false;  // not disabled, not excluded by force or ISA policy, available
};

// The selection for (spec, mode, device) under `policy` (nullptr: the
// process-wide policy). Throws attend::Error(unsupported) with the verdict
// table when nothing fits. May return the selection made for an earlier spec
// of the same cache bucket, after re-checking that it holds for this one.
// spec_validated: the caller ran validate(spec) already (PlanAccess's entry).
std::shared_ptr<const Selection> select_shared(const AttentionSpec& spec, Mode mode, const Policy* policy,
                                               Device device, bool spec_validated = false);

}  // namespace attend::detail
