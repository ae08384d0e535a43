// attend — command-line front end of the attend library.
//
// Exit codes, the same for every subcommand: 0 success, 1 usage error,
// 2 attend::Error (invalid or unsupported problem, malformed file), 3 `run
// --check` out of tolerance. With `select --json` or `run --json`, failures
// are also one JSON object on stdout.
#include <exception>
#include <iostream>
#include <string>
#include <string_view>

#include <CLI/CLI.hpp>

#include "attend/error.h"
#include "commands.h"
#include "json_output.h"

#ifndef ATTEND_VERSION
#define ATTEND_VERSION "unknown"
#endif

namespace {

using namespace attend_cli;

constexpr const char* kFooter =
    "Exit codes (every subcommand): 0 success, 1 usage error, 2 attend error (invalid or unsupported\n"
    "problem, unreadable file), 3 run --check out of tolerance.\n"
    "Environment:\n"
    "  ATTEND_BACKEND=name[:variant] force this backend or variant (--backend overrides it)\n"
    "  ATTEND_DISABLE=a,b           never use these backends (--disable adds to it)\n"
    "  ATTEND_LOG=info|debug        print each new selection's table to stderr (debug: cache hits too)\n"
    "  ATTEND_SELECT=priority|autotune\n"
    "                               how to choose among viable plans (--select overrides it)\n"
    "  ATTEND_TUNE_CACHE=path|off   autotune cache file (default $XDG_CACHE_HOME/attend/autotune.json\n"
    "                               or ~/.cache/attend/autotune.json; --tune-cache overrides it)\n"
    "  ATTEND_ISA=avx512amx|avx512bf16|avx512|avx2|scalar\n"
    "                               cap flash's and decode's kernel family (--isa overrides it)\n"
    "  ATTEND_NUM_THREADS=n         cap flash's and decode's threads (else OMP_NUM_THREADS)\n"
    "  ATTEND_REFERENCE_MAX_BYTES=n score-memory budget of the reference backend (default 8 GiB)\n"
    "  ATTEND_CUDNN_TARGET=sm_XY[,9.A.B]\n"
    "                               GPU and cuDNN release cudnn's rules assume without a GPU\n"
    "                               (default sm_90 and the cuDNN headers' release)\n"
    "  ATTEND_CUDNN_LIBRARY=path    the cuDNN library cudnn opens (default libcudnn.so.9)";

// select/run with --json report every outcome, errors included, as JSON on stdout.
bool json_requested(int argc, char** argv) {
  if (argc < 2 || (std::string_view(argv[1]) != "select" && std::string_view(argv[1]) != "run")) return false;
  for (int i = 2; i < argc; ++i) {
    if (std::string_view(argv[i]) == "--json") return true;
  }
  return false;
}

int fail_json(const std::string& error, int code) {
  std::cout << JsonObject().raw("error", error).integer("exit_code", code).text() << "\n";
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string version = std::string("attend ") + ATTEND_VERSION;
  CLI::App app{"attend: scaled-dot-product attention with a pass-aware backend selector.", "attend"};
  app.set_version_flag("--version", version);
  app.require_subcommand(1);
  app.footer(kFooter);

  SelectCommand select_cmd;
  RunCommand run_cmd;
  CLI::App* select_app = add_select_command(app, select_cmd);
  CLI::App* run_app = add_run_command(app, run_cmd);
  TuneCommand tune_cmd;
  CLI::App* tune_app = add_tune_command(app, tune_cmd);
#ifdef ATTEND_CLI_BENCH
  BenchCommand bench_cmd;
  CLI::App* bench_app = add_bench_command(app, bench_cmd);
#endif
  for (CLI::App* sub : app.get_subcommands({})) {
    sub->set_version_flag("--version", version);
    sub->footer(kFooter);
  }

  // CLI11 would report a mistyped subcommand as an unexpected argument.
  if (argc >= 2 && argv[1][0] != '-') {
    try {
      (void)app.get_subcommand(argv[1]);
    } catch (const CLI::OptionNotFound&) {
      std::string names;
      for (const CLI::App* sub : app.get_subcommands({})) names += (names.empty() ? "" : ", ") + sub->get_name();
      std::cerr << "error: unknown subcommand '" << argv[1] << "' (subcommands: " << names << "; see attend --help)\n";
      return kExitUsage;
    }
  }

  const bool json = json_requested(argc, argv);
  try {
    app.parse(argc, argv);
    if (select_app->parsed()) return run_select(select_cmd);
    if (run_app->parsed()) return run_run(run_cmd, *run_app);
    if (tune_app->parsed()) return run_tune(tune_cmd, *tune_app);
#ifdef ATTEND_CLI_BENCH
    if (bench_app->parsed()) return run_bench(bench_cmd, *bench_app);
#endif
    return kExitUsage;
  } catch (const CLI::ParseError& e) {
    // --help and --version arrive here too, with exit code 0.
    const int code = app.exit(e) == 0 ? 0 : kExitUsage;
    return json && code != 0 ? fail_json(usage_error_json(e.what()), code) : code;
  } catch (const attend::Error& e) {
    std::cerr << "error: " << e.what() << "\n";
    return json ? fail_json(error_json(e), kExitError) : kExitError;
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return json ? fail_json(JsonObject().str("code", "internal").str("message", e.what()).text(), kExitError)
                : kExitError;
  }
}
