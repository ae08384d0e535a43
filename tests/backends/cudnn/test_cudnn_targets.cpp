// The device descriptors the cudnn backend answers for without a GPU
// (cudnn_targets.h): the shipped ones, and descriptor files as a careless or
// hostile user may write them. Nothing here needs cuDNN or a GPU, except the
// check as the backend runs it (skipped where a CUDA device is present: the
// check then asks the device).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "attend/attend.h"
#include "attend/backends/cuda.h"
#include "attend/backends/cudnn.h"
#include "backends/cudnn/cudnn_targets.h"
#include "backends/cudnn/cudnn_test_spec.h"

namespace attend {
namespace {

using cudnn::AssumedTarget;
namespace fs = std::filesystem;

std::string temp_file(const std::string& name, const std::string& text) {
  const std::string path = ::testing::TempDir() + "/" + name;
  std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
  return path;
}

// The error parse_assumed_target throws for `text`, or "no error".
std::string refusal(const std::string& text) {
  try {
    cudnn::parse_assumed_target(text, "ATTEND_CUDNN_TARGET", 91900);
  } catch (const Error& e) {
    EXPECT_EQ(e.field(), "ATTEND_CUDNN_TARGET");
    return e.what();
  }
  return "no error";
}

TEST(CudnnTargets, ShippedDescriptorsHaveCudnnsTwentyThreeKeys) {
  const char* keys[] = {"deviceName",
                        "cudaDeviceId",
                        "deviceVer",
                        "driverVer",
                        "multiProcessorCount",
                        "maxSharedMemoryPerBlock",
                        "maxSharedMemoryPerBlockOptin",
                        "reservedSharedMemoryPerBlock",
                        "regsPerBlock",
                        "maxRegistersPerSM",
                        "maxCtasPerSM",
                        "maxThreadsPerBlock",
                        "maxThreadsPerSM",
                        "warpSize",
                        "maxGridSize",
                        "maxBlockSize",
                        "pciDeviceId",
                        "isTccDriver",
                        "supportCoopLaunch",
                        "totalGlobalMem",
                        "smClockRateKHz",
                        "memClockRateKHz",
                        "l2CacheSize"};
  std::set<int> sms;
  ASSERT_GE(cudnn::shipped_targets().size(), 4u);
  for (const cudnn::DeviceDescriptor& d : cudnn::shipped_targets()) {
    const std::string json = d.json();
    SCOPED_TRACE(json);
    for (const char* key : keys) EXPECT_NE(json.find(std::string("\"") + key + "\":"), std::string::npos) << key;
    const cudnn::ParsedDescriptor parsed = cudnn::parse_descriptor(json, "test", d.key);
    EXPECT_EQ(parsed.device_ver, d.device_ver);
    EXPECT_EQ(parsed.device_name, std::string(d.device_name));
    EXPECT_EQ(parsed.json, json) << "cuDNN gets the shipped text unchanged";
    EXPECT_EQ(std::count(json.begin(), json.end(), ':'), 23);
    sms.insert(d.sm());
  }
  EXPECT_EQ(sms, (std::set<int>{80, 90, 100}));
}

TEST(CudnnTargets, NamesFilesAndComputeCapabilitiesParse) {
  const AssumedTarget h100 = cudnn::parse_assumed_target("H100", "ATTEND_CUDNN_TARGET", 91900);
  EXPECT_EQ(h100.rules.sm, 90);
  EXPECT_EQ(h100.rules.version, 91900);
  EXPECT_FALSE(h100.version_given);
  EXPECT_TRUE(h100.deviceless());
  EXPECT_NE(h100.label.find("H100"), std::string::npos);
  const AssumedTarget b200 = cudnn::parse_assumed_target("b200,9.12.0", "ATTEND_CUDNN_TARGET", 91900);
  EXPECT_EQ(b200.rules.sm, 100);
  EXPECT_EQ(b200.rules.version, 91200);
  EXPECT_TRUE(b200.version_given);
  const AssumedTarget sm = cudnn::parse_assumed_target("sm_80", "ATTEND_CUDNN_TARGET", 91900);
  EXPECT_EQ(sm.rules.sm, 80);
  EXPECT_FALSE(sm.deviceless());

  const std::string path = ::testing::TempDir() + "/attend_gpu_descriptor.json";
  std::ofstream(path) << R"({"deviceName": "Some GPU", "deviceVer": 890, "cudaDeviceId": 0})";
  const AssumedTarget file = cudnn::parse_assumed_target(path, "ATTEND_CUDNN_TARGET", 91900);
  EXPECT_EQ(file.rules.sm, 89);
  EXPECT_NE(file.label.find("Some GPU"), std::string::npos);
  EXPECT_NE(file.json.find("\"deviceVer\":890"), std::string::npos);
}

TEST(CudnnTargets, MalformedTargetsNameTheFieldAndTheValue) {
  const auto message = [](std::string_view text) {
    try {
      cudnn::parse_assumed_target(text, "ATTEND_CUDNN_TARGET", 91900);
    } catch (const Error& e) {
      EXPECT_EQ(e.field(), "ATTEND_CUDNN_TARGET");
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message("h900").find("h900"), std::string::npos);
  EXPECT_NE(message("h900").find("h100"), std::string::npos) << "lists the shipped names";
  EXPECT_NE(message("h100,nine").find("h100,nine"), std::string::npos);
  EXPECT_NE(message("/nonexistent/gpu.json").find("/nonexistent/gpu.json"), std::string::npos);
  const std::string path = ::testing::TempDir() + "/attend_bad_descriptor.json";
  std::ofstream(path) << R"({"deviceName": "No Version"})";
  EXPECT_NE(message(path).find("deviceVer"), std::string::npos);
}

// cuDNN parses the descriptor as JSON; the rules read it the same way: the
// top-level deviceVer, not the first text that looks like one.
TEST(CudnnTargets, TheRulesReadTheTopLevelKeysCudnnReads) {
  const std::string nested = temp_file("attend_nested_version.json",
                                       R"({"meta": {"deviceVer": 800}, "deviceName": "Nested", "deviceVer": 900})");
  EXPECT_EQ(cudnn::parse_assumed_target(nested, "t", 91900).rules.sm, 90);
  const std::string twice =
      temp_file("attend_twice.json", R"({"deviceVer": 800, "deviceName": "Twice", "deviceVer": 900})");
  const std::string why = refusal(twice);
  EXPECT_NE(why.find("\"deviceVer\" twice"), std::string::npos) << why;
  EXPECT_NE(why.find(twice), std::string::npos) << why;
  // A nested key may repeat a top-level one: only the top level is cuDNN's.
  const std::string inner = temp_file(
      "attend_inner_twice.json", R"({"deviceVer": 900, "x": {"deviceVer": 1, "deviceVer": 2}, "deviceName": "I"})");
  EXPECT_EQ(cudnn::parse_assumed_target(inner, "t", 91900).rules.sm, 90);
  for (const char* text : {R"({"deviceVer": "900"})", R"({"deviceVer": 900.5})", R"([{"deviceVer": 900}])",
                           R"({"deviceVer": 900,})", R"({"deviceVer": 900, "deviceName": 7})", ""}) {
    const std::string path = temp_file("attend_malformed.json", text);
    EXPECT_NE(refusal(path).find(path), std::string::npos) << text << ": " << refusal(path);
  }
}

TEST(CudnnTargets, AnEscapedQuoteInDeviceNameAndACommaInThePathSurvive) {
  const fs::path dir = fs::path(::testing::TempDir()) / "attend,targets";
  fs::create_directories(dir);
  const std::string path = (dir / "gpu.json").string();
  std::ofstream(path) << R"({"deviceName": "NVIDIA \"Big\" GPU\n", "deviceVer": 900})";
  const AssumedTarget t = cudnn::parse_assumed_target(path, "t", 91900);
  EXPECT_EQ(t.label, "NVIDIA \"Big\" GPU? descriptor (" + path + ")") << "one line, quote kept";
  EXPECT_FALSE(t.version_given);
  const AssumedTarget old = cudnn::parse_assumed_target(path + ",9.12.0", "t", 91900);
  EXPECT_EQ(old.rules.version, 91200);
  EXPECT_EQ(old.path, path);
  EXPECT_NE(refusal((dir / "missing.json").string() + ",9.12.0").find("No such file"), std::string::npos);
}

// 3 M nested arrays killed the process (SIGSEGV); past a few levels nesting
// is refused before any parser recurses into it, and a file past the size
// cap before it is read.
TEST(CudnnTargets, DeeplyNestedAndHugeDescriptorsAreRefused) {
  const auto nested = [](std::size_t depth) {
    return R"({"deviceVer":900,"x":)" + std::string(depth, '[') + std::string(depth, ']') + "}";
  };
  const std::string deep = temp_file("attend_deep.json", nested(3000000));
  std::string why = refusal(deep);
  EXPECT_NE(why.find(deep), std::string::npos) << why;
  EXPECT_NE(why.find("1048576 bytes"), std::string::npos) << why;
  const std::string under_cap = temp_file("attend_deep_small.json", nested(200000));
  why = refusal(under_cap);
  EXPECT_NE(why.find("nests deeper than 16 levels"), std::string::npos) << why;
  EXPECT_EQ(cudnn::parse_assumed_target(temp_file("attend_shallow.json", nested(14)), "t", 91900).rules.sm, 90);
}

// Each verdict-cache key held the whole descriptor text: a padded file cost
// its size per cached verdict. cuDNN gets the compact JSON; keys hold a digest.
TEST(CudnnTargets, CacheKeysStaySmallWhateverTheFilesSize) {
  const std::string path =
      temp_file("attend_padded.json", R"({"deviceName": "Padded", "deviceVer": 900)" + std::string(900000, ' ') + "}");
  const AssumedTarget t = cudnn::parse_assumed_target(path, "t", 91900);
  EXPECT_EQ(t.json, R"({"deviceName":"Padded","deviceVer":900})");
  EXPECT_LT(t.cache_key().size(), 200u);
  // Within the cap a descriptor may still be large JSON: the key holds a digest.
  const std::string large = temp_file(
      "attend_large.json", R"({"deviceName": "Large", "deviceVer": 900, "pad": ")" + std::string(900000, 'x') + "\"}");
  const AssumedTarget l = cudnn::parse_assumed_target(large, "t", 91900);
  EXPECT_GT(l.json.size(), 900000u);
  EXPECT_LT(l.cache_key().size(), 200u);
  // Different descriptors, different keys.
  const AssumedTarget h100 = cudnn::parse_assumed_target("h100", "t", 91900);
  const AssumedTarget h200 = cudnn::parse_assumed_target("h200", "t", 91900);
  AssumedTarget relabelled = h200;
  relabelled.label = h100.label;
  EXPECT_NE(h100.cache_key(), relabelled.cache_key());
}

// /dev/zero was read until bad_alloc; a FIFO with no writer blocked forever.
TEST(CudnnTargets, OnlyRegularFilesAreRead) {
  std::string why = refusal("/dev/zero");
  EXPECT_NE(why.find("/dev/zero: is not a regular file"), std::string::npos) << why;
  EXPECT_NE(refusal(::testing::TempDir() + "/").find("not a regular file"), std::string::npos);
  const std::string fifo = ::testing::TempDir() + "/attend_target_fifo.json";
  ::unlink(fifo.c_str());
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  // Were the open to block, a writer comes after 5 s: the test then fails on
  // the time instead of hanging.
  std::atomic<bool> done{false};
  std::thread writer([&] {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (!done && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    while (!done) {
      const int fd = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK);
      if (fd >= 0) ::close(fd);
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  });
  const auto start = std::chrono::steady_clock::now();
  why = refusal(fifo);
  done = true;
  writer.join();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(2));
  EXPECT_NE(why.find("is not a regular file"), std::string::npos) << why;
  ::unlink(fifo.c_str());
}

// A descriptor file edited on disk is read again at the next check, not only
// when the target's text changes.
TEST(CudnnTargets, AnEditedDescriptorFileIsReadAgain) {
  if (cuda_device_count() > 0) GTEST_SKIP() << "a CUDA device is present: the check asks it instead";
  const auto backend = make_cudnn_backend();
  const AttentionSpec s = testing::cudnn_spec(128, 128, 256, 8);
  const std::string path = temp_file("attend_edited.json", R"({"deviceName": "Before", "deviceVer": 800})");
  set_cudnn_target(path, "--target");
  const auto judged = [&] {
    const Support sup = backend->check(s, Pass::forward, Target{Device::cuda(0)});
    return sup.elsewhere ? sup.elsewhere->device + " | " + sup.elsewhere->decided_by : "no target verdict";
  };
  EXPECT_NE(judged().find("Before descriptor"), std::string::npos) << judged();
  temp_file("attend_edited.json", R"({"deviceName": "After", "deviceVer": 1000})");
  EXPECT_NE(judged().find("After descriptor"), std::string::npos) << judged();
  ::unlink(path.c_str());
  try {
    judged();
    ADD_FAILURE() << "a removed descriptor file still answered";
  } catch (const Error& e) {
    EXPECT_EQ(e.field(), "--target");
    EXPECT_EQ(e.value(), path);
  }
  set_cudnn_target("sm_90");
}

}  // namespace
}  // namespace attend
