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

// What the cudnn backend assumes where the process has no GPU: the rules'
// target and, for a named descriptor, what cuDNN is asked about.
struct AssumedTarget {
  RuleTarget rules;
  bool version_given = false;  // the text named a cuDNN release (else: the headers', or the loaded library's)
  std::string label;           // "H100 SXM", or the file's deviceName; "" for sm_XY alone (rules only)
  std::string json;            // the descriptor; "" for sm_XY alone
  std::string cache_key() const { return label + "|" + json; }
  bool deviceless() const { return !json.empty(); }
};

// Parses ATTEND_CUDNN_TARGET / --target: "sm_90[,9.19.0]" (rules only, as
// parse_rule_target), a shipped name "h100[,9.19.0]" (case-insensitive), or a
// path to a descriptor JSON file (anything with a '/' or ending in .json) whose
// deviceVer gives the compute capability. Throws attend::Error naming `field`
// and the text (or the file and the missing key).
AssumedTarget parse_assumed_target(std::string_view text, std::string_view field, int default_version);

// The JSON text's integer `key` (cuDNN's flat object), or nullopt.
std::optional<std::int64_t> json_int(std::string_view json, std::string_view key);
// The JSON text's string `key` (no escapes inside), or nullopt.
std::optional<std::string> json_string(std::string_view json, std::string_view key);

}  // namespace attend::cudnn
