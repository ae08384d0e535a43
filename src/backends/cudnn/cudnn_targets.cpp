// The shipped device descriptors and the target parser (cudnn_targets.h).
//
// Sources. Per compute capability (the same for every GPU of that CC): the
// CUDA C++ Programming Guide 13.0, "Compute Capabilities", table "Technical
// Specifications per Compute Capability" — threads per block 1024, block
// dims 1024 x 1024 x 64, grid 2^31-1 x 65535 x 65535, warp 32, 64K 32-bit
// registers per SM and per block, 32 resident blocks and 2048 resident
// threads per SM on 8.0, 9.0 and 10.0, 48 KB shared memory per block without
// opt-in, opt-in maximum 163 KB (8.0) and 227 KB (9.0, 10.0), and 1 KB of
// shared memory per block reserved for the system. Per product: NVIDIA's
// data sheets and architecture whitepapers — SM count, L2, boost clock,
// memory capacity; the memory clock is cudaDeviceProp's (half the per-pin
// data rate), derived from the sheet's bandwidth and bus width where the sheet
// gives no clock: rate = bandwidth / (bus bits / 8) / 2.
//
// Fields a driver reports about one installation, not the product, are fixed:
// cudaDeviceId 0, pciDeviceId 0 (the slot on its bus), Linux (isTccDriver 0),
// cooperative launch supported (every sm_60+ GPU), and a CUDA 13.0 driver
// (driverVer 13000: the toolkit attend builds with). cuDNN reads the shared
// memory, SM and register figures to choose engines (a smaller opt-in shared
// memory drops the Hopper kernels); clocks and memory sizes feed heuristics'
// ranking, not support. `attend-cudnn-descriptor` on a real GPU prints what
// the driver reports, to replace or add a target.
#include "backends/cudnn/cudnn_targets.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <functional>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "attend/error.h"

namespace attend::cudnn {
namespace {

constexpr int kKiB = 1024;
constexpr std::int64_t kGiB = 1024LL * 1024 * 1024;
constexpr std::array<int, 3> kMaxGrid = {2147483647, 65535, 65535};
constexpr std::array<int, 3> kMaxBlock = {1024, 1024, 64};

// Every field of one row is cited in the file's header or on the row.
const DeviceDescriptor kShipped[] = {
    // A100 SXM4 80GB: 108 SMs and 40 MB L2 (NVIDIA A100 Tensor Core GPU
    // Architecture whitepaper), 1410 MHz boost, 80 GB HBM2e at 2039 GB/s on a
    // 5120-bit bus (A100 data sheet): 2039e9 / 640 / 2 = 1593 MHz.
    {"a100",
     "A100 SXM4 80GB",
     "NVIDIA A100-SXM4-80GB",
     800,
     13000,
     108,
     48 * kKiB,
     163 * kKiB,
     1 * kKiB,
     65536,
     65536,
     32,
     1024,
     2048,
     32,
     kMaxGrid,
     kMaxBlock,
     0,
     0,
     1,
     80 * kGiB,
     1410000,
     1593000,
     40 * kKiB* kKiB},
    // H100 SXM5 80GB: 132 SMs, 50 MB L2 (NVIDIA H100 Tensor Core GPU
    // Architecture whitepaper), 1980 MHz max boost, 80 GB HBM3 at 3.35 TB/s on
    // 5120 bits (H100 data sheet): 3.35e12 / 640 / 2 = 2617 MHz (drivers report 2619).
    {"h100",    "H100 SXM", "NVIDIA H100 80GB HBM3",
     900,       13000,      132,
     48 * kKiB, 227 * kKiB, 1 * kKiB,
     65536,     65536,      32,
     1024,      2048,       32,
     kMaxGrid,  kMaxBlock,  0,
     0,         1,          80 * kGiB,
     1980000,   2619000,    50 * kKiB* kKiB},
    // H200 SXM 141GB: the H100's GH100 (132 SMs, 50 MB L2, 1980 MHz), 141 GB
    // HBM3e at 4.8 TB/s on 6144 bits (H200 data sheet): 4.8e12 / 768 / 2 = 3125 MHz.
    {"h200",     "H200",   "NVIDIA H200",  900,   13000, 132,  48 * kKiB,
     227 * kKiB, 1 * kKiB, 65536,          65536, 32,    1024, 2048,
     32,         kMaxGrid, kMaxBlock,      0,     0,     1,    141 * kGiB,
     1980000,    3125000,  50 * kKiB* kKiB},
    // B200 (HGX B200): 148 SMs (two dies of 74), 180 GB HBM3e at 8 TB/s on
    // 8192 bits (HGX B200 data sheet): 8e12 / 1024 / 2 = 3906 MHz; 1965 MHz
    // boost and 126 MB L2 as published for the product (the sheet gives
    // neither; both only rank engines).
    {"b200",     "B200",   "NVIDIA B200",   1000,  13000, 148,  48 * kKiB,
     227 * kKiB, 1 * kKiB, 65536,           65536, 32,    1024, 2048,
     32,         kMaxGrid, kMaxBlock,       0,     0,     1,    180 * kGiB,
     1965000,    3906000,  126 * kKiB* kKiB},
};

std::string triple(const std::array<int, 3>& v) {
  return "[" + std::to_string(v[0]) + "," + std::to_string(v[1]) + "," + std::to_string(v[2]) + "]";
}

std::string lower(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(), [](unsigned char c) { return std::tolower(c); });
  return out;
}

Error bad_target(std::string_view field, std::string_view value, std::string why, std::string limit = {}) {
  return Error(ErrorCode::invalid_argument, std::string(field), std::string(value), std::move(why), std::move(limit));
}

FileStamp stamp_of(const struct stat& st) {
  const auto ns = [](const timespec& t) { return static_cast<std::int64_t>(t.tv_sec) * 1000000000 + t.tv_nsec; };
  return {static_cast<std::uint64_t>(st.st_dev), static_cast<std::uint64_t>(st.st_ino),
          static_cast<std::int64_t>(st.st_size), ns(st.st_mtim), ns(st.st_ctim)};
}

class FdCloser {
 public:
  explicit FdCloser(int fd) : fd_(fd) {}
  ~FdCloser() {
    if (fd_ >= 0) ::close(fd_);
  }
  FdCloser(const FdCloser&) = delete;
  FdCloser& operator=(const FdCloser&) = delete;

 private:
  int fd_;
};

// The file's bytes, at most kMaxDescriptorBytes. Opened without blocking: a
// FIFO with no writer would hold a blocking open forever; it is then refused
// like every file that is not regular (/dev/zero never ends).
std::string read_descriptor_file(const std::string& path, std::string_view field, FileStamp* stamp) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0)
    throw bad_target(field, path, "cannot open this device descriptor file: " + std::string(std::strerror(errno)));
  const FdCloser closer(fd);
  struct stat st {};
  if (::fstat(fd, &st) != 0)
    throw bad_target(field, path, "cannot stat this device descriptor file: " + std::string(std::strerror(errno)));
  if (!S_ISREG(st.st_mode))
    throw bad_target(field, path,
                     "is not a regular file (a device descriptor is a JSON file, as attend-cudnn-descriptor prints)");
  const auto too_large = [&](std::int64_t bytes) {
    return bad_target(field, path,
                      "the file has " + std::to_string(bytes) + " bytes; a device descriptor has about 700",
                      std::to_string(kMaxDescriptorBytes) + " bytes");
  };
  if (st.st_size > static_cast<std::int64_t>(kMaxDescriptorBytes)) throw too_large(st.st_size);
  *stamp = stamp_of(st);
  // One byte more than the cap: a file that grew since fstat is still caught.
  std::string body(kMaxDescriptorBytes + 1, '\0');
  std::size_t got = 0;
  while (got < body.size()) {
    const ssize_t n = ::read(fd, body.data() + got, body.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0)
      throw bad_target(field, path, "cannot read this device descriptor file: " + std::string(std::strerror(errno)));
    if (n == 0) break;
    got += static_cast<std::size_t>(n);
  }
  if (got > kMaxDescriptorBytes) throw too_large(static_cast<std::int64_t>(got));
  body.resize(got);
  return body;
}

// What reasons quote of a deviceName: printable and one line.
std::string printable(std::string_view s) {
  constexpr std::size_t kMax = 120;
  std::string out;
  for (const char c : s.substr(0, kMax)) out += (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) ? '?' : c;
  if (s.size() > kMax) out += "...";
  return out;
}

// A cuDNN release after a comma: digits and dots ("9.19.0", "91900").
bool is_release(std::string_view s) {
  return !s.empty() && s.find_first_not_of("0123456789.") == std::string_view::npos;
}

bool names_a_file(std::string_view device) {
  return device.find('/') != std::string_view::npos || lower(device).ends_with(".json");
}

// 64-bit FNV-1a: with the length and std::hash beside it, a digest no two
// descriptors share in practice, in a fixed few bytes.
std::uint64_t fnv1a(std::string_view s) {
  std::uint64_t h = 1469598103934665603ULL;
  for (const char c : s) {
    h ^= static_cast<unsigned char>(c);
    h *= 1099511628211ULL;
  }
  return h;
}

}  // namespace

std::string DeviceDescriptor::json() const {
  std::ostringstream o;
  o << "{\"deviceName\":\"" << device_name << "\",\"cudaDeviceId\":0,\"deviceVer\":" << device_ver
    << ",\"driverVer\":" << driver_ver << ",\"multiProcessorCount\":" << multi_processor_count
    << ",\"maxSharedMemoryPerBlock\":" << max_shared_memory_per_block
    << ",\"maxSharedMemoryPerBlockOptin\":" << max_shared_memory_per_block_optin
    << ",\"reservedSharedMemoryPerBlock\":" << reserved_shared_memory_per_block
    << ",\"regsPerBlock\":" << regs_per_block << ",\"maxRegistersPerSM\":" << max_registers_per_sm
    << ",\"maxCtasPerSM\":" << max_ctas_per_sm << ",\"maxThreadsPerBlock\":" << max_threads_per_block
    << ",\"maxThreadsPerSM\":" << max_threads_per_sm << ",\"warpSize\":" << warp_size
    << ",\"maxGridSize\":" << triple(max_grid_size) << ",\"maxBlockSize\":" << triple(max_block_size)
    << ",\"pciDeviceId\":" << pci_device_id << ",\"isTccDriver\":" << is_tcc_driver
    << ",\"supportCoopLaunch\":" << support_coop_launch << ",\"totalGlobalMem\":" << total_global_mem
    << ",\"smClockRateKHz\":" << sm_clock_rate_khz << ",\"memClockRateKHz\":" << mem_clock_rate_khz
    << ",\"l2CacheSize\":" << l2_cache_size << "}";
  return o.str();
}

std::span<const DeviceDescriptor> shipped_targets() { return kShipped; }

std::optional<FileStamp> file_stamp(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return std::nullopt;
  return stamp_of(st);
}

std::string AssumedTarget::cache_key() const {
  if (json.empty()) return label;
  char digest[64];
  std::snprintf(digest, sizeof digest, "|%zu:%016llx:%016zx", json.size(), static_cast<unsigned long long>(fnv1a(json)),
                std::hash<std::string_view>{}(json));
  return label + digest;
}

ParsedDescriptor parse_descriptor(std::string_view text, std::string_view field, std::string_view name) {
  using Json = nlohmann::ordered_json;
  struct TooDeep {};
  struct Duplicate {
    std::string key;
  };
  std::set<std::string> keys;
  // Depth as the parser counts it: 0 for the top object's own start, 1 for
  // its keys and for an array or object inside it.
  const Json::parser_callback_t check = [&](int depth, Json::parse_event_t event, Json& parsed) {
    if ((event == Json::parse_event_t::object_start || event == Json::parse_event_t::array_start) &&
        depth >= kMaxDescriptorDepth)
      throw TooDeep{};
    if (event == Json::parse_event_t::key && depth == 1 && !keys.insert(parsed.get<std::string>()).second)
      throw Duplicate{parsed.get<std::string>()};
    return true;
  };
  Json j;
  try {
    j = Json::parse(text, check);
  } catch (const TooDeep&) {
    throw bad_target(field, name,
                     "the descriptor nests deeper than " + std::to_string(kMaxDescriptorDepth) +
                         " levels (cuDNN's is one object holding flat arrays)");
  } catch (const Duplicate& d) {
    throw bad_target(
        field, name,
        "the descriptor has the key \"" + printable(d.key) + "\" twice (JSON readers disagree on which one counts)");
  } catch (const Json::exception& e) {
    throw bad_target(field, name, "the descriptor is not valid JSON: " + std::string(e.what()));
  }
  if (!j.is_object()) throw bad_target(field, name, "the descriptor is not a JSON object");
  ParsedDescriptor d;
  const auto ver = j.find("deviceVer");
  if (ver == j.end() || !ver->is_number_integer() || ver->get<std::int64_t>() < 100 || ver->get<std::int64_t>() > 9990)
    throw bad_target(field, name, "the descriptor has no integer deviceVer (major * 100 + minor * 10, e.g. 900)");
  d.device_ver = ver->get<int>();
  if (const auto dn = j.find("deviceName"); dn != j.end()) {
    if (!dn->is_string()) throw bad_target(field, name, "the descriptor's deviceName is not a string");
    d.device_name = dn->get<std::string>();
  }
  d.json = j.dump();
  return d;
}

AssumedTarget parse_assumed_target(std::string_view text, std::string_view field, int default_version) {
  AssumedTarget t;
  t.given = true;
  // A descriptor path may hold commas: the text names the file where it can,
  // else a release follows the last comma. A name's release follows its first.
  const std::size_t last = text.rfind(',');
  std::string_view device = text;
  std::optional<std::string_view> release;
  if (last != std::string_view::npos && is_release(text.substr(last + 1)) && names_a_file(text.substr(0, last)) &&
      !file_stamp(std::string(text))) {
    device = text.substr(0, last);
    release = text.substr(last + 1);
  } else if (const std::size_t comma = text.find(','); comma != std::string_view::npos && !names_a_file(text)) {
    device = text.substr(0, comma);
    release = text.substr(comma + 1);
  }
  t.version_given = release.has_value();
  // The release part is parse_rule_target's; only the device part differs.
  const auto rules_for = [&](int sm) {
    const std::string sm_text = "sm_" + std::to_string(sm) + (release ? "," + std::string(*release) : "");
    try {
      return parse_rule_target(sm_text, field, default_version);
    } catch (const Error&) {
      throw bad_target(field, text, "the cuDNN version after the comma is not MAJOR.MINOR[.PATCH]");
    }
  };
  const std::string name = lower(device);
  const auto shipped =
      std::find_if(std::begin(kShipped), std::end(kShipped), [&](const DeviceDescriptor& d) { return d.key == name; });
  if (shipped != std::end(kShipped)) {
    t.rules = rules_for(shipped->sm());
    t.label = std::string(shipped->label) + " descriptor";
    t.json = shipped->json();
    return t;
  }
  if (names_a_file(device)) {
    t.path = std::string(device);
    const ParsedDescriptor d = parse_descriptor(read_descriptor_file(t.path, field, &t.stamp), field, t.path);
    t.json = d.json;
    t.rules = rules_for(d.device_ver / 10);
    t.label = printable(d.device_name.value_or(t.path)) + " descriptor (" + printable(t.path) + ")";
    return t;
  }
  try {
    t.rules = parse_rule_target(text, field, default_version);
  } catch (const Error&) {
    std::string names;
    for (const DeviceDescriptor& d : kShipped) names += std::string(names.empty() ? "" : ", ") + std::string(d.key);
    throw bad_target(field, text,
                     "expected a GPU (" + names + "), a descriptor file (path.json) or sm_XY, each optionally ,9.A.B");
  }
  return t;
}
}  // namespace attend::cudnn
