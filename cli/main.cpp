// attend — command-line front end of the attend library.
//
// Exit codes: 0 success, 1 usage error, 2 attend::Error (invalid or unsupported
// problem, malformed file), 3 `run --check` out of tolerance.
#include <exception>
#include <iostream>

#include <CLI/CLI.hpp>

#include "attend/error.h"
#include "commands.h"

#ifndef ATTEND_VERSION
#define ATTEND_VERSION "unknown"
#endif

int main(int argc, char** argv) {
  using namespace attend_cli;
  CLI::App app{"attend: scaled-dot-product attention with a pass-aware backend selector.\n"
               "Environment: ATTEND_BACKEND=name, ATTEND_DISABLE=a,b, ATTEND_LOG=info|debug.",
               "attend"};
  app.set_version_flag("--version", std::string("attend ") + ATTEND_VERSION);
  app.require_subcommand(1);

  SelectCommand select_cmd;
  RunCommand run_cmd;
  CLI::App* select_app = add_select_command(app, select_cmd);
  CLI::App* run_app = add_run_command(app, run_cmd);
#ifdef ATTEND_CLI_BENCH
  BenchCommand bench_cmd;
  CLI::App* bench_app = add_bench_command(app, bench_cmd);
#endif

  try {
    app.parse(argc, argv);
    if (select_app->parsed()) return run_select(select_cmd);
    if (run_app->parsed()) return run_run(run_cmd, *run_app);
#ifdef ATTEND_CLI_BENCH
    if (bench_app->parsed()) return run_bench(bench_cmd, *bench_app);
#endif
    return kExitUsage;
  } catch (const CLI::ParseError& e) {
    // --help and --version arrive here too, with exit code 0.
    return app.exit(e) == 0 ? 0 : kExitUsage;
  } catch (const attend::Error& e) {
    std::cerr << "error: " << e.what() << "\n";
    return kExitError;
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return kExitError;
  }
}
