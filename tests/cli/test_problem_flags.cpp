// The CLI's problem flags come from attend::spec_fields(): every field either
// has its flag or is derived from other flags on purpose.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "attend/error.h"
#include "attend/spec_fields.h"
#include "problem_flags.h"

namespace attend_cli {
namespace {

bool derived(std::string_view name) {
  const auto d = derived_spec_fields();
  return std::find(d.begin(), d.end(), name) != d.end();
}

// A value other than the default that validate() accepts on its own, and the
// flags some fields need next to theirs.
std::vector<std::string> args_setting(const attend::SpecField& f, std::string& value) {
  static const std::map<std::string, std::vector<std::string>, std::less<>> extra = {
      {"heads_q", {"--heads", "4"}},
      {"heads_kv", {"--heads", "4"}},
      {"dq_dtype", {"--dtype", "bf16"}},
      {"out_dtype", {"--dtype", "bf16"}},
      {"bias_requires_grad", {"--bias", "head"}},
      {"kv_scale", {"--kv-dtype", "i8"}}};
  static const std::map<std::string, std::string, std::less<>> special = {{"heads_q", "8"},
                                                                          {"heads_kv", "2"},
                                                                          {"dtype", "f64"},
                                                                          {"dq_dtype", "f32"},
                                                                          {"out_dtype", "f32"},
                                                                          {"layout", "bhsd"},
                                                                          {"softmax_type", "off_by_one"},
                                                                          {"kv_dtype", "i8"},
                                                                          {"kv_scale", "per_token"}};
  const attend::AttentionSpec defaults;
  if (const auto it = special.find(f.name); it != special.end()) {
    value = it->second;
  } else if (attend::field_kind(f) == attend::FieldKind::boolean) {
    value = attend::get_field(defaults, f) == "true" ? "false" : "true";
  } else if (attend::field_kind(f) == attend::FieldKind::real) {
    value = "0.25";
  } else {
    value = "3";
  }
  std::vector<std::string> args;
  if (const auto it = extra.find(f.name); it != extra.end()) args = it->second;
  args.push_back(flag_name(f.name) + "=" + value);
  return args;
}

TEST(ProblemFlags, EveryTableFieldHasAFlagOrIsDerivedOnPurpose) {
  CLI::App app;
  ProblemFlags flags;
  add_problem_flags(app, flags);
  for (const attend::SpecField& f : attend::spec_fields()) {
    const CLI::Option* opt = nullptr;
    try {
      opt = app.get_option(flag_name(f.name));
    } catch (const CLI::OptionNotFound&) {
    }
    if (derived(f.name)) {
      EXPECT_EQ(opt, nullptr) << f.name << " is derived, yet has a flag";
      continue;
    }
    ASSERT_NE(opt, nullptr) << "spec field " << f.name << " has no flag " << flag_name(f.name)
                            << ": it gets one from the table unless derived_spec_fields() lists it";
    EXPECT_EQ(opt->get_description(), f.help) << f.name;
  }
  for (const std::string_view name : derived_spec_fields()) EXPECT_NE(attend::find_spec_field(name), nullptr) << name;
}

TEST(ProblemFlags, EveryFieldFlagSetsItsField) {
  ProblemParser parser;
  for (const attend::SpecField& f : attend::spec_fields()) {
    if (derived(f.name)) continue;
    std::string value;
    const std::vector<std::string> args = args_setting(f, value);
    const Problem p = parser.parse(args);
    EXPECT_EQ(attend::get_field(p.spec, f), value) << f.name;
  }
}

TEST(ProblemFlags, OldSpellingsAndConvenienceFlagsStillSetTheirFields) {
  ProblemParser parser;
  const Problem p = parser.parse({"--dropout", "0.5", "--seed", "9", "--bias", "head", "--bias-grad", "--no-lse",
                                  "--window", "4,2", "--seqlen", "32", "--seqlen-kv", "40"});
  EXPECT_EQ(p.spec.dropout_p, 0.5);
  EXPECT_EQ(p.spec.dropout_seed, 9u);
  EXPECT_TRUE(p.spec.has_bias && p.spec.bias_requires_grad);
  EXPECT_FALSE(p.spec.need_lse);
  EXPECT_EQ(p.spec.window_left, 4);
  EXPECT_EQ(p.spec.window_right, 2);
  EXPECT_EQ(p.spec.seqlen_q, 32);
  EXPECT_EQ(p.spec.seqlen_kv, 40);
}

TEST(ProblemFlags, MalformedFieldTextIsAUsageErrorNamingFlagAndField) {
  ProblemParser parser;
  try {
    parser.parse({"--q-offset", "two"});
    FAIL() << "accepted --q-offset two";
  } catch (const CLI::ValidationError& e) {
    EXPECT_NE(std::string(e.what()).find("--q-offset"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("q_offset=two"), std::string::npos) << e.what();
  }
  EXPECT_THROW(parser.parse({"--window", "1,2", "--window-left", "3"}), CLI::ParseError);
}

TEST(ProblemFlags, PolicyFlagsOverrideTheEnvironmentAndNameThemselves) {
  ProblemParser parser;
  const Problem p = parser.parse({"--backend", "flash:scalar", "--disable", "decode", "--isa", "scalar"});
  EXPECT_EQ(p.policy.force, "flash:scalar");
  EXPECT_EQ(p.policy.force_source, "--backend");
  EXPECT_EQ(p.policy.disabled_source, "--disable");
  EXPECT_EQ(p.policy.isa, "scalar");
  EXPECT_EQ(p.policy.isa_source, "--isa");
  try {
    parser.parse({"--isa", "avx9"});
    FAIL() << "accepted --isa avx9";
  } catch (const attend::Error& e) {
    EXPECT_EQ(e.field(), "--isa");
  }
}

}  // namespace
}  // namespace attend_cli
