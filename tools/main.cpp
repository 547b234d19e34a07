// moeserve: one binary, one subcommand per job. Errors end the command with one line on
// stderr and a non-zero exit status.
#include <cstdio>
#include <exception>

#include "commands.h"

int main(int argc, char** argv) {
  CLI::App app{"moeserve: a serving engine for Mixture-of-Experts language models"};
  app.require_subcommand(1);
  ms::cli::add_model_commands(app);
  ms::cli::add_text_commands(app);
  ms::cli::add_make_random_model(app);
  ms::cli::add_bench_one_batch(app);
  ms::cli::add_serve(app);
  ms::cli::add_make_demo_model(app);
  ms::cli::add_bench_serving(app);
  ms::cli::add_bench_offline(app);
  ms::cli::add_eval_gsm8k(app);
  ms::cli::add_bench_speculative(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
