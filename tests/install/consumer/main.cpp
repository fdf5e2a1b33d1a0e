// Joins a world of one through a file store and reduces a tensor.
#include <cstdio>

#include <ATen/ATen.h>
#include <fsdpp/fsdpp.h>

int main(int argc, char** argv) {
  if (argc < 2) return 2;
  auto world = fsdpp::init_process_group(
      fsdpp::InitProcessGroupOptions().init_method(std::string("file://") + argv[1]).rank(0).world_size(1));
  at::Tensor t = at::ones({4});
  fsdpp::all_reduce(t, fsdpp::ReduceOp::AVG, world);
  std::printf("consumer ok: %d rank(s), sum %.0f\n", world.size(), t.sum().item<double>());
  return t.sum().item<double>() == 4.0 ? 0 : 1;
}
