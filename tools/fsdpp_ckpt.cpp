// fsdpp-ckpt: look into, check and consolidate fsdpp distributed checkpoints.
#include <iostream>
#include <string>

#include <CLI/CLI.hpp>

#include <fsdpp/checkpoint.h>
#include <fsdpp/error.h>

int main(int argc, char** argv) {
  CLI::App app{"fsdpp-ckpt: inspect, verify and consolidate fsdpp distributed checkpoints.", "fsdpp-ckpt"};
  app.require_subcommand(1);
  std::string dir, out;
  auto* inspect = app.add_subcommand("inspect", "Entries, shapes, dtypes, chunk layout and sizes");
  inspect->add_option("dir", dir, "Checkpoint directory")->required();
  auto* verify = app.add_subcommand("verify", "Check every file and chunk checksum; exit 1 naming what is bad");
  verify->add_option("dir", dir, "Checkpoint directory")->required();
  auto* consolidate = app.add_subcommand("consolidate", "Write one standard safetensors file with whole tensors");
  consolidate->add_option("dir", dir, "Checkpoint directory")->required();
  consolidate->add_option("output", out, "The .safetensors file to write")->required();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  try {
    if (inspect->parsed()) {
      std::cout << fsdpp::checkpoint::inspect(dir);
    } else if (verify->parsed()) {
      const auto problems = fsdpp::checkpoint::verify(dir);
      for (const auto& p : problems) std::cerr << "fsdpp-ckpt: " << p << "\n";
      if (!problems.empty()) return 1;
      std::cout << dir << ": ok\n";
    } else if (consolidate->parsed()) {
      fsdpp::checkpoint::consolidate(dir, out);
      std::cout << "wrote " << out << "\n";
    }
  } catch (const std::exception& e) {
    std::cerr << "fsdpp-ckpt: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
