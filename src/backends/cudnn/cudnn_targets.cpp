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

#include <algorithm>
#include <cctype>
#include <charconv>
#include <fstream>
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

// The position just after `"key":` (and spaces), or npos.
std::size_t value_at(std::string_view json, std::string_view key) {
  const std::string quoted = "\"" + std::string(key) + "\"";
  std::size_t at = json.find(quoted);
  if (at == std::string_view::npos) return at;
  at = json.find_first_not_of(" \t\r\n", at + quoted.size());
  if (at == std::string_view::npos || json[at] != ':') return std::string_view::npos;
  return json.find_first_not_of(" \t\r\n", at + 1);
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

std::optional<std::int64_t> json_int(std::string_view json, std::string_view key) {
  const std::size_t at = value_at(json, key);
  if (at == std::string_view::npos) return std::nullopt;
  std::int64_t v = 0;
  const auto r = std::from_chars(json.data() + at, json.data() + json.size(), v);
  if (r.ec != std::errc()) return std::nullopt;
  return v;
}

std::optional<std::string> json_string(std::string_view json, std::string_view key) {
  const std::size_t at = value_at(json, key);
  if (at == std::string_view::npos || json[at] != '"') return std::nullopt;
  const std::size_t end = json.find('"', at + 1);
  if (end == std::string_view::npos) return std::nullopt;
  return std::string(json.substr(at + 1, end - at - 1));
}

AssumedTarget parse_assumed_target(std::string_view text, std::string_view field, int default_version) {
  const std::size_t comma = text.find(',');
  const std::string_view head = text.substr(0, comma);
  const std::string name = lower(head);
  AssumedTarget t;
  t.version_given = comma != std::string_view::npos;
  // The release part is parse_rule_target's; only the device part differs.
  const auto rules_for = [&](int sm) {
    const std::string sm_text = "sm_" + std::to_string(sm) + std::string(text.substr(std::min(comma, text.size())));
    try {
      return parse_rule_target(sm_text, field, default_version);
    } catch (const Error&) {
      throw Error(ErrorCode::invalid_argument, std::string(field), std::string(text),
                  "the cuDNN version after the comma is not MAJOR.MINOR[.PATCH]");
    }
  };
  const auto shipped =
      std::find_if(std::begin(kShipped), std::end(kShipped), [&](const DeviceDescriptor& d) { return d.key == name; });
  if (shipped != std::end(kShipped)) {
    t.rules = rules_for(shipped->sm());
    t.label = std::string(shipped->label) + " descriptor";
    t.json = shipped->json();
    return t;
  }
  if (head.find('/') != std::string_view::npos || name.ends_with(".json")) {
    const std::string path(head);
    std::ifstream in(path);
    if (!in)
      throw Error(ErrorCode::invalid_argument, std::string(field), path, "cannot read this device descriptor file");
    std::ostringstream body;
    body << in.rdbuf();
    t.json = body.str();
    const std::optional<std::int64_t> ver = json_int(t.json, "deviceVer");
    if (!ver || *ver < 100 || *ver > 9990)
      throw Error(ErrorCode::invalid_argument, std::string(field), path,
                  "the descriptor has no integer deviceVer (major * 100 + minor * 10, e.g. 900)");
    t.rules = rules_for(static_cast<int>(*ver / 10));
    t.label = json_string(t.json, "deviceName").value_or(path) + " descriptor (" + path + ")";
    return t;
  }
  try {
    t.rules = parse_rule_target(text, field, default_version);
  } catch (const Error&) {
    std::string names;
    for (const DeviceDescriptor& d : kShipped) names += std::string(names.empty() ? "" : ", ") + std::string(d.key);
    throw Error(ErrorCode::invalid_argument, std::string(field), std::string(text),
                "expected a GPU (" + names + "), a descriptor file (path.json) or sm_XY, each optionally ,9.A.B");
  }
  return t;
}

}  // namespace attend::cudnn
