// GPUs the cudnn backend can be asked about without one: cuDNN's
// device-properties descriptor (CUDNN_BACKEND_DEVICEPROP_DESCRIPTOR, cuDNN
// 9.8+) stands in for the device, so the engine layer's check (validate,
// build_operation_graph, create_execution_plans, check_support) runs on a
// machine with no GPU. The descriptor is a flat JSON object of 23 keys
// (cuDNN's own serialization, CUDNN_ATTR_DEVICEPROP_JSON_REPRESENTATION);
// the shipped ones are written from public properties (cudnn_targets.cpp
// cites each value), and `attend-cudnn-descriptor` captures a real GPU's.
// Pure: no cuDNN, no GPU.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "backends/cudnn/cudnn_rules.h"

namespace attend::cudnn {

// The descriptor's fields, named as cuDNN's JSON names them.
struct DeviceDescriptor {
  std::string_view key;          // the name ATTEND_CUDNN_TARGET / --target take: "h100"
  std::string_view label;        // what reasons call it: "H100 SXM"
  std::string_view device_name;  // deviceName: cudaDeviceProp::name
  int device_ver = 0;            // deviceVer: major * 100 + minor * 10 (900 for sm_90)
  int driver_ver = 0;            // driverVer: cudaDriverGetVersion's encoding (13000 = CUDA 13.0)
  int multi_processor_count = 0;
  int max_shared_memory_per_block = 0;        // bytes, without opt-in
  int max_shared_memory_per_block_optin = 0;  // bytes, cudaFuncSetAttribute's ceiling
  int reserved_shared_memory_per_block = 0;   // bytes the system keeps per block
  int regs_per_block = 0, max_registers_per_sm = 0;
  int max_ctas_per_sm = 0, max_threads_per_block = 0, max_threads_per_sm = 0, warp_size = 0;
  std::array<int, 3> max_grid_size{}, max_block_size{};
  int pci_device_id = 0;  // cudaDeviceProp::pciDeviceID: the slot on its bus, not the product id
  int is_tcc_driver = 0, support_coop_launch = 0;
  std::int64_t total_global_mem = 0;  // bytes
  int sm_clock_rate_khz = 0, mem_clock_rate_khz = 0;
  int l2_cache_size = 0;  // bytes

  int sm() const { return device_ver / 10; }  // 900 -> 90
  std::string json() const;                   // cuDNN's 23 keys, in its order
};

// A100 SXM4 80GB (sm_80), H100 SXM (sm_90), H200 (sm_90), B200 (sm_100).
std::span<const DeviceDescriptor> shipped_targets();

// A file as stat(2) saw it: a descriptor file edited, replaced or removed
// after it was read has another stamp (or none).
struct FileStamp {
  std::uint64_t dev = 0, ino = 0;
  std::int64_t size = 0, mtime_ns = 0, ctime_ns = 0;
  bool operator==(const FileStamp&) const = default;
};
std::optional<FileStamp> file_stamp(const std::string& path);

// What the cudnn backend assumes where the process has no GPU: the rules'
// target and, for a named descriptor, what cuDNN is asked about.
struct AssumedTarget {
  RuleTarget rules;
  bool given = false;          // named by the user (else the default: sm_90 and the headers' release)
  bool version_given = false;  // the text named a cuDNN release (else: the headers', or the loaded library's)
  std::string label;           // "H100 SXM", or the file's deviceName; "" for sm_XY alone (rules only)
  std::string json;            // the descriptor as cuDNN gets it (compact); "" for sm_XY alone
  std::string path;            // the descriptor file it was read from; "" for a shipped name
  FileStamp stamp;             // that file when it was read
  // The caches' key: the label and a digest of the descriptor, a few dozen
  // bytes however large the file was.
  std::string cache_key() const;
  bool deviceless() const { return !json.empty(); }
  // The file was edited, replaced or removed since it was read: parse again.
  bool stale() const { return !path.empty() && file_stamp(path) != stamp; }
};

// A device descriptor file is a JSON object of about 700 bytes: one far
// larger is refused before it is read, one nested deeper than a few levels
// while it is parsed, before cuDNN's parser sees it (JSON parsers recurse per
// level: 3 M nested arrays killed the process with SIGSEGV, and 200 k kill
// nlohmann-json's DOM).
inline constexpr std::size_t kMaxDescriptorBytes = 1 << 20;
inline constexpr int kMaxDescriptorDepth = 16;

// A descriptor's JSON text checked and read: a JSON object, nesting at most
// kMaxDescriptorDepth, no top-level key twice, an integer top-level deviceVer
// and, if present, a string deviceName. `json` is the object re-serialized
// compactly, in its order: what cuDNN is given, so that it reads exactly what
// was checked. Throws attend::Error naming `field` and `name` (the file).
struct ParsedDescriptor {
  std::string json;
  int device_ver = 0;
  std::optional<std::string> device_name;
};
ParsedDescriptor parse_descriptor(std::string_view text, std::string_view field, std::string_view name);

// Parses ATTEND_CUDNN_TARGET / --target: "sm_90[,9.19.0]" (rules only, as
// parse_rule_target), a shipped name "h100[,9.19.0]" (case-insensitive), or a
// path to a descriptor JSON file (anything with a '/' or ending in .json;
// a path may hold commas: a release follows the last one) whose deviceVer
// gives the compute capability. The file must be a regular file of at most
// kMaxDescriptorBytes. Throws attend::Error naming `field` and the text (or
// the file and what is wrong with it).
AssumedTarget parse_assumed_target(std::string_view text, std::string_view field, int default_version);

}  // namespace attend::cudnn
