// attend select: which backend would run a problem, and why.
#include <cstdlib>
#include <iostream>
#include <string>

#include <CLI/CLI.hpp>

#include "attend/error.h"
#include "attend/parallel.h"
#include "attend/registry.h"
#include "attend/select.h"
#include "attend/spec.h"
#include "commands.h"
#include "json_output.h"

namespace attend_cli {

CLI::App* add_select_command(CLI::App& app, SelectCommand& cmd) {
  auto* sub = app.add_subcommand("select", "Show which backend runs a problem and why the others cannot");
  add_problem_flags(*sub, cmd.problem);
  sub->add_flag("--json", cmd.json, "print the selection as JSON");
  sub->add_option("--device", cmd.device,
                  "where the tensors would live (cpu, cuda, cuda:N): only backends serving it can run")
      ->capture_default_str();
  sub->add_option("--target", cmd.target,
                  "with --device cuda and no GPU here: the GPU the cudnn backend answers for (a100, h100, h200, b200, "
                  "a descriptor file path.json, or sm_XY for its rules alone; optionally ,9.A.B); a named GPU adds "
                  "cuDNN's own deviceless verdict (ATTEND_CUDNN_TARGET)");
  add_cp_flags(*sub, cmd.cp, false);
  sub->add_flag("--autotune", cmd.autotune,
                "choose by measured time (--select autotune): times every viable plan once per shape bucket "
                "and shows each time");
  return sub;
}

namespace {

// The strategy table (and the chosen strategy's schedule for --cp-rank). A
// forced strategy that cannot run, or none fitting, is an error with the table.
int explain_cp(const SelectCommand& cmd, const Problem& p) {
  const attend::parallel::Config config = cmd.cp.config(cmd.cp.rank);
  if (cmd.json) {
    const attend::parallel::Plan plan = attend::parallel::evaluate(p.spec, p.mode, config, p.policy);
    if (plan.viable()) {
      std::cout << with_fields(plan.to_json(), "\"exit_code\": 0") << "\n";
      return 0;
    }
    try {
      attend::parallel::plan(p.spec, p.mode, config, p.policy);
    } catch (const attend::Error& e) {
      std::cout << with_fields(plan.to_json(),
                               "\"error\": " + error_json(e) + ", \"exit_code\": " + std::to_string(kExitError))
                << "\n";
      std::cerr << "error: " << e.what() << "\n";
    }
    return kExitError;
  }
  std::cout << attend::parallel::plan(p.spec, p.mode, config, p.policy).explain();
  return 0;
}

// --target: the cudnn backend reads ATTEND_CUDNN_TARGET at its first check
// (the CLI links no backend header, and a build without cudnn has none to
// call), so the flag sets it for this process before anything is selected.
void apply_target(const SelectCommand& cmd, const attend::Device& device) {
  if (cmd.target.empty()) return;
  if (device.kind != attend::DeviceKind::cuda)
    throw attend::Error(attend::ErrorCode::invalid_argument, "--target", cmd.target,
                        "a GPU target applies to --device cuda only");
  bool cudnn = false;
  for (const attend::RegisteredBackend& r : attend::Registry::global().backends())
    cudnn = cudnn || r.backend->name() == "cudnn";
  if (!cudnn)
    throw attend::Error(attend::ErrorCode::invalid_argument, "--target", cmd.target,
                        "this build has no cudnn backend (configure with CUDA, cuDNN and cudnn-frontend)");
  setenv("ATTEND_CUDNN_TARGET", cmd.target.c_str(), 1);
}

int select_on(const SelectCommand& cmd, const attend::Device& device) {
  Problem p = make_problem(cmd.problem);
  if (cmd.autotune) p.policy.strategy = attend::Strategy::autotune;
  if (cmd.cp.enabled()) {
    if (!device.is_host()) {
      throw attend::Error(attend::ErrorCode::invalid_argument, "--device", cmd.device,
                          "context-parallel plans (--cp) are chosen for host tensors only");
    }
    return explain_cp(cmd, p);
  }
  if (cmd.json) {
    try {
      std::cout << with_fields(attend::select(p.spec, p.mode, p.policy, device).to_json(), "\"exit_code\": 0") << "\n";
      return 0;
    } catch (const attend::Error& e) {
      if (e.code() != attend::ErrorCode::unsupported) throw;
      // The same verdicts as data, with the error: nothing fits is an answer too.
      const std::string verdicts = attend::evaluate(p.spec, p.mode, p.policy, device).to_json();
      std::cout << with_fields(verdicts,
                               "\"error\": " + error_json(e) + ", \"exit_code\": " + std::to_string(kExitError))
                << "\n";
      std::cerr << "error: " << e.what() << "\n";
      return kExitError;
    }
  }
  // Throws attend::Error(unsupported) with the verdict table when nothing fits;
  // main prints it and exits 2.
  const attend::Selection sel = attend::select(p.spec, p.mode, p.policy, device);
  // explain() already holds the problem, the mode, the table and the choice;
  // the "selected:" line is added only if a future explain() drops it.
  const std::string table = sel.explain();
  std::cout << table;
  if (!table.empty() && table.back() != '\n') std::cout << "\n";
  if (table.find("selected: ") == std::string::npos) std::cout << "selected: " << sel.backend->name() << "\n";
  return 0;
}

}  // namespace

int run_select(const SelectCommand& cmd) {
  const attend::Device device = attend::parse_device(cmd.device, "--device");
  apply_target(cmd, device);
  try {
    return select_on(cmd, device);
  } catch (const attend::Error& e) {
    // The backend parses the target at its first check: name the flag that set it.
    if (cmd.target.empty() || e.field() != "ATTEND_CUDNN_TARGET") throw;
    throw attend::Error(e.code(), "--target", e.value(), e.detail(), e.limit());
  }
}

}  // namespace attend_cli
