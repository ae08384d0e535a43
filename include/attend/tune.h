// Autotuned selection: measure the viable plans of a problem once per tuning
// bucket, keep the fastest, persist it.
//
// Under Policy::strategy == Strategy::autotune (ATTEND_SELECT=autotune), the
// first selection of a problem whose bucket has no result times every viable
// (backend, variant) plan on scratch tensors of that problem's shape (one
// warm-up run, then repetitions; training times forward + backward together)
// and selects the one with the smallest median. The bucket is the problem
// with Sq, Sk and B*H rounded up to powers of two, the GQA group size, head
// dims, dtypes, layout, mask and every other selecting field exact, the mode
// and the device; the result file is keyed by CPU model, ISA families, thread
// budget and attend version. Results of a tuned plan are those of the chosen
// backend run directly: tuning never touches the caller's tensors.
//
//   attend::Policy p = attend::Policy::from_env();
//   p.strategy = attend::Strategy::autotune;
//   p.tune_cache = "/tmp/attend-tune.json";   // or "off", or "" for the default
//   attend::set_policy(p);                     // later selections tune on first use
#pragma once

#include <string>

#include "attend/select.h"

namespace attend {

// Times every viable plan of (spec, mode) now, even when its bucket was tuned
// before, and records the result (memory and policy.tune_cache) whatever
// policy.strategy says. Returns the selection with every measured time
// (Verdict::seconds) and the fastest plan chosen. Throws like select() when
// nothing fits; attend::Error(unsupported) for tensors off the host.
Selection tune(const AttentionSpec& spec, Mode mode, const Policy& policy, Device device = {});

// The tuning bucket of (spec, mode, device), as it appears in the cache file.
std::string tune_bucket(const AttentionSpec& spec, Mode mode, Device device = {});

// The file policy.tune_cache resolves to ("" for "off" or when neither
// XDG_CACHE_HOME nor HOME is set).
std::string tune_cache_file(const Policy& policy);

// Forgets tuning results held in memory (and cached selections); the next
// autotune selection reads the cache file again.
void forget_tuning();

}  // namespace attend
