#include "runtime/tune_cache.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "cpu/isa.h"
#include "cpu/threads.h"

#ifndef ATTEND_VERSION
#define ATTEND_VERSION "unknown"
#endif

namespace attend::detail {

namespace {

using nlohmann::json;
namespace fs = std::filesystem;

constexpr const char* kFormat = "attend-autotune";
constexpr int kFormatVersion = 1;

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      const auto colon = line.find(':');
      if (colon != std::string::npos) {
        const auto b = line.find_first_not_of(' ', colon + 1);
        return b == std::string::npos ? "" : line.substr(b);
      }
    }
  }
  return "unknown";
}

json record_json(const TuneRecord& r) {
  json seconds = json::object();
  for (const auto& [plan, t] : r.seconds) seconds[plan] = t;
  return {{"winner", r.winner}, {"problem", r.problem}, {"seconds", seconds}};
}

std::optional<TuneRecord> record_from(const json& j) {
  if (!j.is_object() || !j.contains("winner") || !j["winner"].is_string()) return std::nullopt;
  TuneRecord r;
  r.winner = j["winner"].get<std::string>();
  if (j.contains("problem") && j["problem"].is_string()) r.problem = j["problem"].get<std::string>();
  if (j.contains("seconds") && j["seconds"].is_object()) {
    for (const auto& [plan, t] : j["seconds"].items()) {
      if (t.is_number()) r.seconds.emplace_back(plan, t.get<double>());
    }
  }
  return r;
}

// The whole file, or why it cannot be used (empty json and a message).
json read_file(const std::string& path, std::string* problem) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) {  // opens, then fails every read with a stream exception
    *problem = "is a directory";
    return json::object();
  }
  std::ifstream in(path);
  if (!in) return json::object();  // absent: nothing tuned yet
  json j = json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    *problem = "is not valid JSON";
    return json::object();
  }
  const auto field_is = [&](const char* name, const json& want) { return j.contains(name) && j[name] == want; };
  if (!j.is_object() || !field_is("format", kFormat) || !field_is("format_version", kFormatVersion) ||
      !j.contains("machines") || !j["machines"].is_object()) {
    *problem = std::string("is not an attend autotune file (format ") + kFormat + " version " +
               std::to_string(kFormatVersion) + ")";
    return json::object();
  }
  return j;
}

struct Memory {
  std::mutex mutex;
  // (path, machine) -> bucket -> record; a loaded (path, machine) has an entry even when empty.
  std::map<std::pair<std::string, std::string>, std::map<std::string, TuneRecord>> sections;
  std::map<std::string, bool> warned;      // path -> a problem with it was reported
  std::map<std::string, bool> lock_stuck;  // path -> its lock was held past kLockWait
};

Memory& memory() {
  static Memory m;
  return m;
}

void warn_once(Memory& m, const std::string& path, const std::string& what) {
  if (m.warned[path]) return;
  m.warned[path] = true;
  std::cerr << "[attend] warning: autotune cache " << path << " " << what << "\n";
}

std::map<std::string, TuneRecord>& load(Memory& m, const std::string& path, const std::string& machine) {
  const auto key = std::make_pair(path, machine);
  if (auto it = m.sections.find(key); it != m.sections.end()) return it->second;
  auto& section = m.sections[key];
  if (path.empty()) return section;
  std::string problem;
  const json j = read_file(path, &problem);
  if (!problem.empty()) {
    warn_once(m, path, problem + ": ignored, it will be rewritten");
    return section;
  }
  if (!j.contains("machines")) return section;  // no file yet
  const json& machines = j["machines"];
  if (!machines.contains(machine) || !machines[machine].is_object()) return section;
  const json& mine = machines[machine];
  if (!mine.contains("buckets") || !mine["buckets"].is_object()) return section;
  for (const auto& [bucket, r] : mine["buckets"].items()) {
    if (auto rec = record_from(r)) section[bucket] = std::move(*rec);
  }
  return section;
}

// A writer holds the lock for one read-merge-write of a small file
// (milliseconds). Waiting longer means a stopped writer (Ctrl-Z mid-save) or a
// lock on a network file system that will not come back: tuning then keeps
// its results in memory rather than hanging the selection.
constexpr std::chrono::milliseconds kLockWait{3000};

// Holds an exclusive flock on <path>.lock for its lifetime, if it gets it
// within `wait`; why not otherwise.
class FileLock {
 public:
  FileLock(const std::string& path, std::chrono::milliseconds wait)
      : fd_(::open((path + ".lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644)) {
    if (fd_ < 0) {
      problem_ = "cannot be locked (" + path + ".lock cannot be opened)";
      return;
    }
    const auto deadline = std::chrono::steady_clock::now() + wait;
    std::chrono::milliseconds nap{5};
    while (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
      if (errno == EINTR) continue;
      const bool busy = errno == EWOULDBLOCK;
      if (busy && std::chrono::steady_clock::now() < deadline) {
        std::this_thread::sleep_for(nap);
        nap = std::min(nap * 2, std::chrono::milliseconds{100});
        continue;
      }
      problem_ = busy ? "cannot be locked (" + path + ".lock is held by another process; gave up after " +
                            std::to_string(wait.count()) + " ms)"
                      : "cannot be locked (" + path + ".lock)";
      timed_out_ = busy;
      ::close(fd_);
      fd_ = -1;
      return;
    }
  }
  ~FileLock() {
    if (fd_ >= 0) ::close(fd_);  // closing releases the lock
  }
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;
  bool held() const { return fd_ >= 0; }
  bool timed_out() const { return timed_out_; }
  const std::string& problem() const { return problem_; }

 private:
  int fd_;
  bool timed_out_ = false;
  std::string problem_;
};

// `stuck`: the lock was held past kLockWait before; later stores of the
// process try it once without waiting, so a lock that never comes back costs
// one wait, not one per tuned bucket.
std::string write_merged(const std::string& path, const std::string& machine, const std::string& bucket,
                         const TuneRecord& record, bool& stuck) {
  std::error_code ec;
  const fs::path p(path);
  if (p.has_parent_path()) fs::create_directories(p.parent_path(), ec);
  const FileLock lock(path, stuck ? std::chrono::milliseconds{0} : kLockWait);
  if (lock.timed_out()) stuck = true;
  if (!lock.held()) return lock.problem();
  stuck = false;
  std::string problem;
  json j = read_file(path, &problem);  // merge with what other processes wrote meanwhile
  if (!problem.empty()) j = json::object();
  j["format"] = kFormat;
  j["format_version"] = kFormatVersion;
  if (!j.contains("machines")) j["machines"] = json::object();
  json& section = j["machines"][machine];
  if (!section.is_object()) section = json::object();
  const MachineKey m = current_machine();
  section["cpu"] = m.cpu;
  section["isa"] = m.isa;
  section["threads"] = m.threads;
  section["attend_version"] = m.version;
  if (!section.contains("buckets") || !section["buckets"].is_object()) section["buckets"] = json::object();
  section["buckets"][bucket] = record_json(record);
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << j.dump(1) << "\n";
    out.flush();
    if (!out) {
      fs::remove(tmp, ec);
      return "cannot be written (" + tmp + ")";
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    fs::remove(tmp, ec);
    return "cannot be replaced (rename " + tmp + ")";
  }
  return "";
}

}  // namespace

std::string MachineKey::text() const {
  return "cpu=" + cpu + ";isa=" + isa + ";threads=" + std::to_string(threads) + ";attend=" + version;
}

MachineKey current_machine() {
  static const std::string model = cpu_model();
  static const std::string isas = [] {
    std::string s;
    for (int i = static_cast<int>(cpu::Isa::avx512amx); i >= 0; --i) {
      const auto isa = static_cast<cpu::Isa>(i);
      if (cpu::supports(isa)) s += (s.empty() ? "" : ",") + std::string(cpu::to_string(isa));
    }
    return s;
  }();
  return {model, isas, ATTEND_VERSION, thread_budget()};
}

std::string resolve_tune_cache_path(const std::string& configured) {
  if (configured == "off") return "";
  if (!configured.empty()) return configured;
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg && *xdg) return std::string(xdg) + "/attend/autotune.json";
  if (const char* home = std::getenv("HOME"); home && *home) return std::string(home) + "/.cache/attend/autotune.json";
  return "";  // nowhere to keep it: memory only
}

std::optional<TuneRecord> find_tune_record(const std::string& path, const std::string& machine,
                                           const std::string& bucket) {
  Memory& m = memory();
  std::lock_guard lock(m.mutex);
  const auto& section = load(m, path, machine);
  if (auto it = section.find(bucket); it != section.end()) return it->second;
  return std::nullopt;
}

std::string store_tune_record(const std::string& path, const std::string& machine, const std::string& bucket,
                              const TuneRecord& record) {
  Memory& m = memory();
  std::lock_guard lock(m.mutex);
  load(m, path, machine)[bucket] = record;
  if (path.empty()) return "";
  const std::string problem = write_merged(path, machine, bucket, record, m.lock_stuck[path]);
  if (!problem.empty()) warn_once(m, path, problem + ": tuning results are kept in memory only");
  return problem;
}

void clear_tune_memory() {
  Memory& m = memory();
  std::lock_guard lock(m.mutex);
  m.sections.clear();
  m.warned.clear();
  m.lock_stuck.clear();
}

}  // namespace attend::detail
