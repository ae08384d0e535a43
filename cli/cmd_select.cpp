// attend select: which backend would run a problem, and why.
#include <iostream>
#include <string>

#include <CLI/CLI.hpp>

#include "attend/select.h"
#include "attend/spec.h"
#include "commands.h"
#include "json_output.h"

namespace attend_cli {

CLI::App* add_select_command(CLI::App& app, SelectCommand& cmd) {
  auto* sub = app.add_subcommand("select", "Show which backend runs a problem and why the others cannot");
  add_problem_flags(*sub, cmd.problem);
  sub->add_flag("--json", cmd.json, "print the selection as JSON");
  sub->add_flag("--autotune", cmd.autotune,
                "choose by measured time (--select autotune): times every viable plan once per shape bucket "
                "and shows each time");
  return sub;
}

int run_select(const SelectCommand& cmd) {
  Problem p = make_problem(cmd.problem);
  if (cmd.autotune) p.policy.strategy = attend::Strategy::autotune;
  if (cmd.json) {
    try {
      std::cout << with_fields(attend::select(p.spec, p.mode, p.policy).to_json(), "\"exit_code\": 0") << "\n";
      return 0;
    } catch (const attend::Error& e) {
      if (e.code() != attend::ErrorCode::unsupported) throw;
      // The same verdicts as data, with the error: nothing fits is an answer too.
      const std::string verdicts = attend::evaluate(p.spec, p.mode, p.policy).to_json();
      std::cout << with_fields(verdicts,
                               "\"error\": " + error_json(e) + ", \"exit_code\": " + std::to_string(kExitError))
                << "\n";
      std::cerr << "error: " << e.what() << "\n";
      return kExitError;
    }
  }
  // Throws attend::Error(unsupported) with the verdict table when nothing fits;
  // main prints it and exits 2.
  const attend::Selection sel = attend::select(p.spec, p.mode, p.policy);
  // explain() already holds the problem, the mode, the table and the choice;
  // the "selected:" line is added only if a future explain() drops it.
  const std::string table = sel.explain();
  std::cout << table;
  if (!table.empty() && table.back() != '\n') std::cout << "\n";
  if (table.find("selected: ") == std::string::npos) std::cout << "selected: " << sel.backend->name() << "\n";
  return 0;
}

}  // namespace attend_cli
