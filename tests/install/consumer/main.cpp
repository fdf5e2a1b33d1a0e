// A user's program built against an installed fsdpp. Under a launcher (RANK etc. set) it joins
// that world; otherwise a world of one through a file store. Every rank all-reduces a tensor and
// saves its shard of a distributed checkpoint into DIR, which the installed fsdpp-ckpt then reads.
#include <cstdio>
#include <cstdlib>
#include <string>

#include <ATen/ATen.h>
#include <fsdpp/fsdpp.h>

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: consumer CHECKPOINT_DIR [FILE_STORE]\n");
    return 2;
  }
  auto options = fsdpp::InitProcessGroupOptions();
  if (argc > 2) options.init_method(std::string("file://") + argv[2]).rank(0).world_size(1);
  auto world = fsdpp::init_process_group(options);
  at::Tensor t = at::ones({4});
  fsdpp::all_reduce(t, fsdpp::ReduceOp::SUM, world);
  const double expected = 4.0 * world.size();
  // Rank r holds rows [2r, 2r + 2) of a (2 * world size) x 3 tensor.
  fsdpp::checkpoint::save({{"rows", fsdpp::checkpoint::Entry::sharded(at::full({2, 3}, double(world.rank())),
                                                                      {2 * world.rank(), 0}, {2 * world.size(), 3})},
                           {"step", 7}},
                          argv[1], fsdpp::checkpoint::SaveOptions().process_group(world));
  std::printf("consumer ok: rank %d of %d, sum %.0f\n", world.rank(), world.size(), t.sum().item<double>());
  return t.sum().item<double>() == expected ? 0 : 1;
}
