#pragma once
// A same-host transport for fsdpp's own all_gather and reduce_scatter: the members of a group
// that all run on this host (and in one network namespace) exchange bytes through one shared
// memory segment instead of Gloo's loopback TCP, which costs about 1 ms of CPU per MiB on the
// cores that compute needs (bench_step_cpu). Private to fsdpp.
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include <fsdpp/process_group.h>

namespace fsdpp::detail {

struct ProcessGroupImpl;

// Each rank owns two buffers of the segment and fills them in turn, one round after another;
// the others read a round's buffer once its owner posted it. A round's buffer is reused two
// rounds later, after every peer said it has read it.
class ShmTransport {
 public:
  ShmTransport(void* segment, int64_t segment_bytes, int rank, int size, std::vector<int> global_ranks,
               std::chrono::milliseconds timeout);
  ~ShmTransport();
  ShmTransport(const ShmTransport&) = delete;
  ShmTransport& operator=(const ShmTransport&) = delete;

  // Puts `len` bytes from byte `offset` of rank q's input, at `bytes`, where they belong in the output.
  using Place = std::function<void(int q, int64_t offset, const uint8_t* bytes, int64_t len)>;
  // output [size x input bytes], rank-major, as all_gather_into_tensor; or where `place` says.
  void all_gather(const at::Tensor& output, const at::Tensor& input, const Place& place = {});
  // `combine` reduces pieces[q], rank q's values of a range of elements (pieces[rank] this
  // rank's own), into `target`.
  using Combine = std::function<void(const std::vector<at::Tensor>& pieces, const at::Tensor& target)>;
  // input [size x output elements] (chunk q goes to rank q), as reduce_scatter_tensor.
  void reduce_scatter(const at::Tensor& output, const at::Tensor& input, const Combine& combine);
  // As Combine, also told where the range starts in the reduced tensor (Gloo's order of sums,
  // which all_reduce matches, depends on the position).
  using PlacedCombine =
      std::function<void(int64_t first, const std::vector<at::Tensor>& pieces, const at::Tensor& target)>;
  // In place: each rank reduces its share of every round's range, then all gather the shares.
  void all_reduce(const at::Tensor& tensor, const PlacedCombine& combine);

  // Tells the peers that this rank's exchange failed, so that they stop waiting for it.
  void mark_broken();

  struct Control;

 private:
  // One round: `write` fills this rank's buffer, then `read` gets every rank's buffer
  // (buffers[rank] is this rank's own).
  void round(const std::function<void(uint8_t*)>& write, const std::function<void(const std::vector<const uint8_t*>&)>& read);
  void wait_for(int q, const std::function<bool()>& ready, const char* what);
  void require_unbroken() const;
  void ring(int q);
  uint8_t* buffer(int q, uint64_t round) const;

  uint8_t* base_;
  int64_t segment_bytes_;
  int rank_, size_;
  std::vector<int> global_ranks_;
  std::chrono::milliseconds timeout_;
  Control* control_;
  uint8_t* data_;
  int64_t buffer_bytes_;
  uint64_t rounds_ = 0;  // the same on every member: they run the same collectives
};

// The group's transport, made by the first call (collective over the group: every member
// calls it in the same collective, as the comm thread runs them in one order); null when the
// members are not all on this host, FSDPP_SHARED_MEMORY=0 on any of them, or the segment could
// not be made (then Gloo carries the bytes). Comm thread only.
ShmTransport* shm_transport(const ProcessGroupImpl& g);

// Whether `group`'s exchanges run over shared memory (false until its first one decided).
bool uses_shared_memory(const ProcessGroup& group);

}  // namespace fsdpp::detail
