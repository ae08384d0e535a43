// Internal glue between policy.cpp, select.cpp and backend.cpp.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
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
// isa_cap of a snapshot (its cached value, or isa_cap's error).
int isa_cap(const PolicySnapshot& snapshot);

// What keeps a variant from running under a policy, one rule for the selector
// and for a backend's default target, each wording it its own way:
//   unavailable  this process cannot run it (Variant::unavailable);
//   alone        policy.isa names another, on-request variant of its backend,
//                which then runs alone;
//   on_request   an on-request variant that nothing asked for (policy.isa, or
//                a force naming it: `forced`);
//   above_cap    above policy.isa's ISA level.
enum class VariantBar { none, unavailable, alone, on_request, above_cap };
// Whether policy.isa names an on-request variant among `all` (a backend's).
bool isa_names_variant(const Policy& policy, std::span<const Variant> all);
VariantBar variant_bar(const Variant& v, const Policy& policy, bool named, int cap, bool forced);

}  // namespace attend::detail
