// Internal: autotune's results, in memory and in the persistent JSON file.
//
// The file holds one section per machine key (CPU model, ISA families this
// process may run, thread budget, attend version); a process reads only its
// own section, so a different build, thread count or CPU re-tunes instead of
// trusting foreign times. Writes take an exclusive lock (<path>.lock, flock),
// re-read the file, merge, write a temporary file and rename it over the old
// one: concurrent tuners never lose each other's entries and readers never see
// a half-written file. A lock held for more than 3 s (a stopped writer, a
// network file system) is given up: the result stays in memory, with a
// warning. A corrupt or foreign file is reported once on stderr, ignored and
// rewritten.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace attend::detail {

struct TuneRecord {
  std::string winner;                                   // "backend:variant"
  std::string problem;                                  // describe(spec) of the problem that was timed
  std::vector<std::pair<std::string, double>> seconds;  // "backend:variant" -> median seconds
};

struct MachineKey {
  std::string cpu, isa, version;
  int threads = 0;
  std::string text() const;  // "cpu=...;isa=...;threads=N;attend=V"
};
MachineKey current_machine();

// The file a policy's tune_cache names: "" for "off"; the default location
// for an empty value.
std::string resolve_tune_cache_path(const std::string& configured);

// Thread-safe. `path` "" keeps results in memory only.
std::optional<TuneRecord> find_tune_record(const std::string& path, const std::string& machine,
                                           const std::string& bucket);
// Records in memory and, when `path` is set, in the file. Returns "" or a
// warning (the file could not be written; the result still holds in memory).
std::string store_tune_record(const std::string& path, const std::string& machine, const std::string& bucket,
                              const TuneRecord& record);
// Forgets what was read or tuned; the next lookup re-reads the file.
void clear_tune_memory();

}  // namespace attend::detail
