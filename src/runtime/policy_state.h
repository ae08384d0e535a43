// Internal glue between policy.cpp, select.cpp and backend.cpp.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "attend/select.h"

namespace attend::detail {

// The process-wide policy as an immutable snapshot: taking one copies a
// shared_ptr (no allocation), so the per-call path never copies a Policy.
struct PolicySnapshot {
  Policy policy;
  std::string key;       // policy_key(policy)
  std::uint64_t id = 0;  // differs for every set_policy
  int isa_cap = 4;       // policy.isa's level (4: no cap)
};
std::shared_ptr<const PolicySnapshot> policy_snapshot();

// A string that differs whenever two policies could select differently.
std::string policy_key(const Policy& policy);
// The ISA level a policy caps CPU variants at (4 = avx512amx: no cap); throws
// attend::Error naming policy.isa_source for an unknown family or one this CPU lacks.
int isa_cap(const Policy& policy);
// isa_cap of the process-wide policy.
int policy_isa_cap();
// The on-request kernel family policy.isa names (cpu::kAmxEmulated), or empty.
// A backend with a variant of that name runs it alone; no other selection
// takes an on-request variant (Variant::on_request).
std::string requested_family(const Policy& policy);
std::string policy_requested_family();

}  // namespace attend::detail
