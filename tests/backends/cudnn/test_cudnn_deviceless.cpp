// cuDNN's own verdict without a GPU (cudnn_deviceless.h) for every shipped
// descriptor: the rule-vs-engine sweep, the seed cases, every graph the
// backend builds, and the check as the selector shows it (the descriptors
// themselves: test_cudnn_targets.cpp). These need a loadable cuDNN 9.8+ and a
// libcuda (the driver or the toolkit's stub) and skip, saying which is
// missing, otherwise.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "attend/attend.h"
#include "attend/backends/cuda.h"
#include "attend/backends/cudnn.h"
#include "backends/cudnn/cudnn_deviceless.h"
#include "backends/cudnn/cudnn_library.h"
#include "backends/cudnn/cudnn_rules.h"
#include "backends/cudnn/cudnn_sweep_cases.h"
#include "backends/cudnn/cudnn_targets.h"
#include "backends/cudnn/cudnn_test_spec.h"

namespace attend {
namespace {

using cudnn::AssumedTarget;

AssumedTarget target(std::string_view name) {
  return cudnn::parse_assumed_target(name, "test", cudnn::library().ok() ? cudnn::library().version : 91900);
}

// Why the engine cannot be asked here, or "".
std::string engine_missing() {
  if (!cudnn::library().ok()) return cudnn::library().error;
  if (cudnn::library().version < 90800)
    return "cuDNN " + cudnn::version_string(cudnn::library().version) + " has no device descriptors (9.8+)";
  if (!cudnn::deviceless_libcuda_error().empty()) return cudnn::deviceless_libcuda_error();
  return "";
}

#define SKIP_WITHOUT_ENGINE()                      \
  do {                                             \
    const std::string missing = engine_missing();  \
    if (!missing.empty()) GTEST_SKIP() << missing; \
  } while (0)

std::string engine(const AttentionSpec& s, Pass pass, const AssumedTarget& t) {
  return cudnn::deviceless_check(s, pass, t, cudnn::library().version);
}

Support rules(const AttentionSpec& s, Pass pass, const AssumedTarget& t) {
  Support sup;
  cudnn::RuleTarget rt = t.rules;
  rt.version = cudnn::library().version;
  cudnn::check_rules(s, pass, rt, sup);
  return sup;
}

// --- cuDNN's verdicts ----------------------------------------------------------

// The seed cases as cuDNN 9.19 answered them (B=2 H=16 S=1024 bf16
// causal): 192/128 trains on Hopper and Blackwell, not on Ampere; 64/512 runs
// forward everywhere and trains nowhere. Asked of the engine and of the rules.
TEST(CudnnDeviceless, SeedCasesGetCudnnsVerdictForEachTarget) {
  SKIP_WITHOUT_ENGINE();
  if (cudnn::library().version / 100 != 919) GTEST_SKIP() << "the expected verdicts were seen on cuDNN 9.19";
  struct Seed {
    const char* target;
    std::int64_t dqk, dv;
    bool forward, backward;
  };
  const Seed seeds[] = {
      {"a100", 192, 128, true, false}, {"a100", 64, 512, true, false}, {"h100", 192, 128, true, true},
      {"h100", 64, 512, true, false},  {"h200", 192, 128, true, true}, {"h200", 64, 512, true, false},
      {"b200", 192, 128, true, true},  {"b200", 64, 512, true, false},
  };
  for (const Seed& seed : seeds) {
    AttentionSpec s = testing::cudnn_spec(seed.dqk, seed.dv, 1024, 16);
    s.causal = true;
    const AssumedTarget t = target(seed.target);
    for (Pass pass : {Pass::forward, Pass::backward}) {
      const bool expected = pass == Pass::forward ? seed.forward : seed.backward;
      SCOPED_TRACE(std::string(seed.target) + " " + std::to_string(seed.dqk) + "/" + std::to_string(seed.dv) + " " +
                   std::string(to_string(pass)));
      const std::string e = engine(s, pass, t);
      EXPECT_EQ(e.empty(), expected) << e;
      EXPECT_EQ(rules(s, pass, t).ok(), expected) << rules(s, pass, t).to_string();
    }
  }
}

// The descriptor is what cuDNN decides by, as on the GPU: the same H100 with
// the opt-in shared memory of a smaller part (99 KB instead of 227 KB) loses
// the engines of the 256/256 backward, while the forward keeps one.
TEST(CudnnDeviceless, TheDescriptorsValuesDecideAsTheGpusWould) {
  SKIP_WITHOUT_ENGINE();
  const AssumedTarget h100 = target("h100");
  cudnn::DeviceDescriptor small = cudnn::shipped_targets()[1];
  ASSERT_EQ(small.key, "h100");
  small.max_shared_memory_per_block_optin = 99 * 1024;
  AssumedTarget t = h100;
  t.label = "H100 with 99 KB of shared memory descriptor";
  t.json = small.json();
  AttentionSpec s = testing::cudnn_spec(256, 256, 1024, 16);
  s.causal = true;
  EXPECT_EQ(engine(s, Pass::backward, h100), "");
  const std::string refused = engine(s, Pass::backward, t);
  EXPECT_NE(refused.find("H100 with 99 KB of shared memory descriptor, deviceless: refused the backward graph"),
            std::string::npos)
      << refused;
  EXPECT_EQ(engine(s, Pass::forward, t), "");
}

struct Tally {
  int cases = 0, graphs = 0, agree = 0, loose = 0, strict = 0, accepted = 0;
  // Rules too strict, grouped by head dims and pass: count, one reason, the cases.
  std::map<std::string, std::pair<int, std::string>> too_strict;
};

// Every case of the grid, both passes (paged: forward only, as attend
// validates), engine asked whatever the rules say. Fails on any case the rules
// accept and cuDNN refuses; lists the cases cuDNN accepts and the rules do not.
TEST(CudnnDeviceless, RulesNeverAcceptWhatCudnnRefuses) {
  SKIP_WITHOUT_ENGINE();
  const std::vector<testing::SweepCase> cases = testing::cudnn_sweep_cases({DType::bf16, DType::f16}, true);
  const int version = cudnn::library().version;
  std::printf("deviceless rule-vs-engine sweep, cuDNN %s, libcuda: %s\n", cudnn::version_string(version).c_str(),
              cudnn::deviceless_libcuda_name().c_str());
  std::vector<std::string> summary;
  for (const cudnn::DeviceDescriptor& d : cudnn::shipped_targets()) {
    const AssumedTarget t = target(d.key);
    const auto start = std::chrono::steady_clock::now();
    Tally tally;
    for (const testing::SweepCase& c : cases) {
      ++tally.cases;
      for (Pass pass : {Pass::forward, Pass::backward}) {
        if (pass == Pass::backward && c.spec.paged()) continue;
        ++tally.graphs;
        const Support r = rules(c.spec, pass, t);
        const std::string e = engine(c.spec, pass, t);
        const bool yes = r.ok(), accepted = e.empty();
        tally.agree += yes == accepted;
        tally.accepted += accepted;
        if (yes && !accepted) {
          ++tally.loose;
          ADD_FAILURE() << t.label << ": " << c.name << " " << to_string(pass)
                        << ": the rules accept, cuDNN refuses: " << e;
        }
        if (!yes && accepted) {
          ++tally.strict;
          const std::string dims =
              c.name.substr(c.name.find(' ') + 1, c.name.find(' ', c.name.find(' ') + 1) - c.name.find(' ') - 1);
          auto& [count, example] = tally.too_strict[dims + " " + std::string(to_string(pass))];
          if (count++ == 0) example = c.name + " (rules: " + r.reasons.front().message + ")";
        }
      }
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    char line[320];
    std::snprintf(line, sizeof line,
                  "%-26s %4d cases, %4d graphs: %4d agree, rules-yes/engine-no = %d, rules too strict = %d (%.1f s)",
                  t.label.c_str(), tally.cases, tally.graphs, tally.agree, tally.loose, tally.strict, seconds);
    summary.push_back(line);
    std::printf("%s\n", line);
    for (const auto& [group, seen] : tally.too_strict)
      std::printf("  rule too strict: %s, %d cases, e.g. %s\n", group.c_str(), seen.first, seen.second.c_str());
    std::fflush(stdout);
    // Not vacuous: cuDNN accepted most graphs and refused some (every target
    // refuses 64/512 backward, every target accepts 128/128 forward).
    EXPECT_GT(tally.accepted, tally.graphs / 2) << t.label;
    EXPECT_LT(tally.accepted, tally.graphs) << t.label;
  }
  std::printf("deviceless sweep summary (cuDNN %s):\n", cudnn::version_string(version).c_str());
  for (const std::string& s : summary) std::printf("  %s\n", s.c_str());
  // CTest shows a passing test's output to nobody: the figure also goes to a
  // file in the test's directory (build/tests), for the CI log to print.
  std::ofstream report("cudnn_deviceless_sweep.txt");
  report << "deviceless rule-vs-engine sweep, cuDNN " << cudnn::version_string(version) << ", "
         << cudnn::deviceless_libcuda_name() << "\n";
  for (const std::string& s : summary) report << "  " << s << "\n";
}

// Each kind of graph the backend builds, on the tensors a call may pass (every
// layout's strides, thd's ragged offsets, paged block tables, both sinks,
// full and broadcast bias), passes cuDNN's check for each target whose rules
// accept it.
TEST(CudnnDeviceless, EveryGraphTheRulesAcceptPassesCudnnsCheck) {
  SKIP_WITHOUT_ENGINE();
  int accepted = 0;
  for (const cudnn::DeviceDescriptor& d : cudnn::shipped_targets()) {
    const AssumedTarget t = target(d.key);
    for (Layout layout : {Layout::bshd, Layout::bhsd, Layout::sbhd, Layout::thd}) {
      for (const char* feature : {"plain", "causal", "bias", "bias_broadcast", "sinks", "off_by_one", "gqa", "paged"}) {
        AttentionSpec s = testing::cudnn_spec(128, 128, 256, 8);
        const std::string f = feature;
        s.layout = layout;
        if (layout == Layout::thd) s.total_q = s.total_kv = s.batch * s.seqlen_q;
        s.causal = f == "causal" || f == "sinks" || layout == Layout::thd;
        s.has_bias = f == "bias" || f == "bias_broadcast";
        if (f == "sinks") s.softmax_type = SoftmaxType::learnable;
        if (f == "off_by_one") s.softmax_type = SoftmaxType::off_by_one;
        if (f == "gqa") s.heads_kv = 2;
        if (f == "paged") {
          if (layout == Layout::thd) continue;  // attend pages dense queries only
          s.seqlen_q = 1;
          s.kv_page_size = 64;
        }
        cudnn::Views views = cudnn::packed_views(s);
        const std::int64_t broadcast[] = {1, s.heads_q, s.seqlen_q, s.seqlen_kv};
        if (f == "bias_broadcast") views.bias = TensorView::contiguous(nullptr, s.dtype, broadcast);
        for (Pass pass : {Pass::forward, Pass::backward}) {
          if (pass == Pass::backward && s.paged()) continue;
          if (!rules(s, pass, t).ok()) continue;
          SCOPED_TRACE(t.label + " " + std::string(to_string(layout)) + " " + f + " " + std::string(to_string(pass)));
          const std::string e = cudnn::deviceless_check(s, pass, t, cudnn::library().version, views);
          EXPECT_EQ(e, "");
          accepted += e.empty();
        }
      }
    }
  }
  EXPECT_GT(accepted, 40);
}

// The check as `attend select --device cuda --target ...` shows it: without
// a GPU the passes are declined for the device ([device]), and each carries
// its verdict for the target (Support::elsewhere): ok or not, the layer that
// decided, naming the descriptor.
TEST(CudnnDeviceless, TheCheckCarriesCudnnsVerdictNamingLayerAndTarget) {
  SKIP_WITHOUT_ENGINE();
  if (cuda_device_count() > 0) GTEST_SKIP() << "a CUDA device is present: the check asks it instead";
  const auto backend = make_cudnn_backend();
  AttentionSpec s = testing::cudnn_spec(192, 128, 1024, 16);
  s.causal = true;
  set_cudnn_target("b200", "--target");
  const Support bwd = backend->check(s, Pass::backward, Target{Device::cuda(0)});
  EXPECT_TRUE(bwd.failed(ReasonCode::device)) << bwd.to_string();
  ASSERT_TRUE(bwd.elsewhere) << bwd.to_string();
  EXPECT_TRUE(bwd.elsewhere->ok);
  EXPECT_EQ(bwd.elsewhere->device, "B200 descriptor");
  EXPECT_NE(bwd.elsewhere->decided_by.find("for B200 descriptor, deviceless"), std::string::npos);
  EXPECT_NE(bwd.elsewhere->verdict.find("accepted the backward graph"), std::string::npos);
  // 64/512: the rules now serve the forward (cuDNN's verdict), not the backward.
  AttentionSpec mla = testing::cudnn_spec(64, 512, 1024, 16);
  set_cudnn_target("h100", "--target");
  const Support fwd = backend->check(mla, Pass::forward, Target{Device::cuda(0)});
  ASSERT_TRUE(fwd.elsewhere) << fwd.to_string();
  EXPECT_TRUE(fwd.elsewhere->ok);
  EXPECT_NE(fwd.elsewhere->decided_by.find("H100 SXM descriptor, deviceless"), std::string::npos);
  // A refusal names the rule that refused it, as the layer and as the reason.
  const Support mla_bwd = backend->check(mla, Pass::backward, Target{Device::cuda(0)});
  EXPECT_TRUE(mla_bwd.failed(ReasonCode::head_dim_v)) << mla_bwd.to_string();
  ASSERT_TRUE(mla_bwd.elsewhere);
  EXPECT_FALSE(mla_bwd.elsewhere->ok);
  EXPECT_NE(mla_bwd.elsewhere->decided_by.find("cuDNN's rules for sm_90"), std::string::npos);
  EXPECT_NE(mla_bwd.elsewhere->verdict.find("head_dim_v=512"), std::string::npos) << mla_bwd.elsewhere->verdict;
  // A release other than the loaded one: the rules for it, cuDNN's check skipped (it can only answer for itself).
  set_cudnn_target("h100,9.12.0", "--target");
  const Support old = backend->check(s, Pass::forward, Target{Device::cuda(0)});
  ASSERT_TRUE(old.elsewhere);
  EXPECT_NE(old.elsewhere->verdict.find("cuDNN's own check not asked: the target names cuDNN 9.12.0"),
            std::string::npos)
      << old.elsewhere->verdict;
  EXPECT_NE(old.elsewhere->decided_by.find("cuDNN's rules for sm_90 and cuDNN 9.12.0"), std::string::npos);
  set_cudnn_target("sm_90");
}

// The table answers "would this run on that GPU": the pass columns are the
// target's verdicts, a line above says so, and each verdict names its layer.
TEST(CudnnDeviceless, TheTableAnswersForTheTarget) {
  SKIP_WITHOUT_ENGINE();
  if (cuda_device_count() > 0) GTEST_SKIP() << "a CUDA device is present: the check asks it instead";
  set_cudnn_target("a100", "--target");
  const AttentionSpec s = testing::cudnn_spec(192, 128, 512, 8);
  const std::string table = evaluate(s, Mode::training, Policy{}, Device::cuda(0)).explain();
  SCOPED_TRACE(table);
  EXPECT_NE(
      table.find("\ntarget:  cudnn's forward/backward columns are verdicts for A100 SXM4 80GB descriptor, not for "
                 "cuda:0, which this process does not have: nothing runs here\n"),
      std::string::npos);
  // Column widths follow the longest variant name: match the cells, not the padding.
  EXPECT_TRUE(std::regex_search(
      table, std::regex("\ncudnn +default +250 +ok +NO +rejected here; would not run on the target\n")));
  EXPECT_NE(table.find("- forward for A100 SXM4 80GB descriptor: ok, by cuDNN "), std::string::npos);
  EXPECT_NE(table.find("- backward for A100 SXM4 80GB descriptor: NO, by cuDNN's rules for sm_80 and cuDNN "
                       "9."),
            std::string::npos);
  EXPECT_NE(table.find("- backward: head_dim_qk=192 (head dims 192/128) exceeds cuDNN's backward limit 128"),
            std::string::npos);
  const std::string json = evaluate(s, Mode::training, Policy{}, Device::cuda(0)).to_json();
  EXPECT_NE(json.find("\"target\": {\"device\": \"A100 SXM4 80GB descriptor\", \"supported\": false, "
                      "\"decided_by\": \"cuDNN's rules for sm_80"),
            std::string::npos)
      << json;
  set_cudnn_target("sm_90");
}

// ATTEND_CUDNN_LIBCUDA names a missing library (the CTest run
// test_cudnn_deviceless_missing_libcuda sets it) on a machine without a
// driver: the deviceless check is a [library] reason naming what was tried.
TEST(CudnnDevicelessLibcuda, WithoutALibcudaTheCheckIsALibraryReason) {
  const char* name = std::getenv("ATTEND_CUDNN_LIBCUDA");
  if (!name || std::string(name).find("missing") == std::string::npos)
    GTEST_SKIP() << "run with ATTEND_CUDNN_LIBCUDA=<a missing library>";
  if (!cudnn::library().ok()) GTEST_SKIP() << cudnn::library().error;
  if (cudnn::deviceless_libcuda_error().empty())
    GTEST_SKIP() << "a libcuda loaded anyway: " << cudnn::deviceless_libcuda_name();
  set_cudnn_target("h100");
  const Support sup =
      make_cudnn_backend()->check(testing::cudnn_spec(128, 128, 256, 8), Pass::forward, Target{Device::cuda(0)});
  EXPECT_TRUE(sup.failed(ReasonCode::library)) << sup.to_string();
  EXPECT_NE(sup.to_string().find(name), std::string::npos) << sup.to_string();
  EXPECT_NE(sup.to_string().find("deviceless"), std::string::npos) << sup.to_string();
}

}  // namespace
}  // namespace attend
