// comm/nccl_contract_backend.h: NCCL's contract on CPU tensors, over a Gloo communicator.
#include "comm/nccl_contract_backend.h"

#include <atomic>
#include <cstdio>
#include <functional>
#include <mutex>
#include <random>
#include <thread>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include "comm/device_stream.h"
#include "comm/transport_dtypes.h"
#include "compat/c10d_tensor_collectives.h"

namespace fsdpp::detail {
namespace {

std::mutex g_launches_mutex;
std::vector<ContractLaunch> g_launches;
std::atomic<int64_t> g_jitter_us{0};

const c10::Device kCpu(c10::DeviceType::CPU);

// NCCL's kernels wait as long as it takes; a Gloo wait needs a bound.
constexpr std::chrono::milliseconds kNoTimeout = std::chrono::hours(24);

bool is_float8(at::ScalarType t) {
  return t == at::kFloat8_e5m2 || t == at::kFloat8_e4m3fn || t == at::kFloat8_e5m2fnuz || t == at::kFloat8_e4m3fnuz;
}

// ProcessGroupNCCL's checks (getNcclDataType, getNcclReduceOp), with its messages.
void check_dtype(const at::Tensor& t, bool reduces) {
  TORCH_CHECK_WITH(TypeError, nccl_can_move(t.scalar_type()),
                   "Input tensor data type is not supported for NCCL process group: ", t.scalar_type());
  TORCH_CHECK_WITH(TypeError, !(reduces && is_float8(t.scalar_type())),
                   "Float8 dtypes are not currently supported for NCCL reductions");
}

// What a collective not launched on the caller's stream returns (NCCL's own stream: here the
// communicator's queue): wait() orders the waiting stream after the end, as NCCL's Work.
class ContractWork : public c10d::Work {
 public:
  explicit ContractWork(std::shared_ptr<StreamEvent> end) : end_(std::move(end)) {}
  bool isCompleted() override { return end_->query(); }
  bool wait(std::chrono::milliseconds /*timeout*/) override {
    end_->block(current_stream(kCpu));
    return true;
  }

 private:
  std::shared_ptr<StreamEvent> end_;
};

class NcclContractBackend : public c10d::Backend {
 public:
  NcclContractBackend(c10::intrusive_ptr<compat::C10dBackend> gloo, int rank, int size, std::string communicator)
      : Backend(rank, size),
        gloo_(std::move(gloo)),
        communicator_(std::move(communicator)),
        kernels_(new_comm_stream(kCpu)),
        jitter_rng_(static_cast<uint32_t>(7919 * rank + 1)) {}

  const std::string getBackendName() const override { return "nccl-contract"; }

  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts) override {
    const at::Tensor t = kernel_argument(single(tensors, "allreduce"));
    check_dtype(t, /*reduces=*/true);
    return launch("allreduce", opts, [this, t, op = opts.reduceOp] { reduce_in_place(t, op); });
  }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors, const c10d::BroadcastOptions& opts) override {
    const at::Tensor t = kernel_argument(single(tensors, "broadcast"));
    check_dtype(t, /*reduces=*/false);
    return launch("broadcast", opts, [this, t, root = opts.rootRank] {
      std::vector<at::Tensor> wire{as_wire(t)};
      c10d::BroadcastOptions o;
      o.rootRank = root;
      o.timeout = kNoTimeout;
      gloo_->broadcast(wire, o)->wait(kNoTimeout);
    });
  }

  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override {
    check_dtype(input, /*reduces=*/false);
    return launch("all_gather_single", opts, [this, output = kernel_argument(output), input = kernel_argument(input)] {
      std::vector<std::vector<at::Tensor>> outputs(1);
      const at::Tensor chunks = as_wire(output).view({getSize(), -1});
      for (int r = 0; r < getSize(); ++r) outputs[0].push_back(chunks[r]);
      std::vector<at::Tensor> inputs{as_wire(input)};
      c10d::AllgatherOptions o;
      o.timeout = kNoTimeout;
      gloo_->allgather(outputs, inputs, o)->wait(kNoTimeout);
    });
  }

  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                      const c10d::ReduceScatterOptions& opts) override {
    check_dtype(input, /*reduces=*/true);
    return launch("reduce_scatter_single", opts,
                  [this, output = kernel_argument(output), input = kernel_argument(input), op = opts.reduceOp] {
      const at::Tensor whole = input.reshape({-1}).clone();
      reduce_in_place(whole, op);
      output.reshape({-1}).copy_(whole.narrow(0, getRank() * output.numel(), output.numel()));
    });
  }

  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_splits, std::vector<int64_t>& input_splits,
                                               const c10d::AllToAllOptions& opts) override {
    check_dtype(input, /*reduces=*/false);
    return launch("alltoall_base", opts, [this, output = kernel_argument(output), input = kernel_argument(input),
                                          output_splits, input_splits] {
      at::Tensor out = as_wire(output), in = as_wire(input);
      std::vector<int64_t> o_splits = output_splits, i_splits = input_splits;
      c10d::AllToAllOptions o;
      o.timeout = kNoTimeout;
      gloo_->alltoall_base(out, in, o_splits, i_splits, o)->wait(kNoTimeout);
    });
  }

 private:
  static at::Tensor single(const std::vector<at::Tensor>& tensors, const char* collective) {
    TORCH_CHECK(tensors.size() == 1, "nccl-contract ", collective, " takes one tensor, got ", tensors.size());
    return tensors.front();
  }

  // NCCL reduces half precision itself, rounding once; Gloo does not reduce bfloat16, so the
  // double reduces both in float32. NCCL's AVG is Gloo's SUM divided (before that rounding).
  void reduce_in_place(const at::Tensor& t, const c10d::ReduceOp& op) {
    const bool half = t.scalar_type() == at::kBFloat16 || t.scalar_type() == at::kHalf;
    const bool average = op == c10d::ReduceOp::AVG;
    at::Tensor on_wire = half ? t.to(at::kFloat) : t;
    std::vector<at::Tensor> tensors{on_wire};
    c10d::AllreduceOptions o;
    o.reduceOp = average ? c10d::ReduceOp(c10d::ReduceOp::SUM) : op;
    o.timeout = kNoTimeout;
    gloo_->allreduce(tensors, o)->wait(kNoTimeout);
    if (average) on_wire.div_(getSize());
    if (half) t.copy_(on_wire);
  }

  template <typename Options>
  c10::intrusive_ptr<c10d::Work> launch(const char* collective, const Options& opts, std::function<void()> exchange) {
    const int64_t jitter = g_jitter_us.load();
    if (jitter > 0)
      std::this_thread::sleep_for(
          std::chrono::microseconds(std::uniform_int_distribution<int64_t>(0, jitter)(jitter_rng_)));
    {
      std::lock_guard<std::mutex> lock(g_launches_mutex);
      g_launches.push_back({communicator_, collective, seq_++});
    }
    // The exchange starts once what the caller's stream queued before the launch has run.
    const c10::Stream caller = current_stream(kCpu);
    auto inputs_ready = std::make_shared<StreamEvent>(c10::DeviceType::CPU);
    inputs_ready->record(caller);
    auto end = std::make_shared<StreamEvent>(c10::DeviceType::CPU);
    {
      StreamGuard on_kernels(kernels_);
      run_on_current_stream(kCpu, [inputs_ready, exchange = std::move(exchange), what = describe(collective)] {
        inputs_ready->synchronize();
        try {
          exchange();
        } catch (const std::exception& e) {
          // Its outputs stay unwritten: what reads them next fails its test, as NCCL's watchdog
          // would fail the job (a peer that exited closes the Gloo connections of one still
          // waiting, which must not kill it).
          std::fprintf(stderr, "nccl-contract: %s failed: %s\n", what.c_str(), e.what());
        }
      });
      end->record(kernels_);
    }
    if (!compat::asks_current_stream(opts)) return c10::make_intrusive<ContractWork>(end);
    end->block(caller);
    return {};
  }

  std::string describe(const char* collective) const {
    return std::string(collective) + " #" + std::to_string(seq_ - 1) + " of communicator " + communicator_ +
           " (rank " + std::to_string(getRank()) + ")";
  }

  c10::intrusive_ptr<compat::C10dBackend> gloo_;
  std::string communicator_;
  c10::Stream kernels_;  // the communicator's kernels, in launch order
  std::mt19937 jitter_rng_;
  int64_t seq_ = 0;
};

}  // namespace

c10::intrusive_ptr<compat::C10dBackend> make_nccl_contract_backend(const c10::intrusive_ptr<c10d::Store>& store,
                                                                   int rank, int size, std::string communicator,
                                                                   const compat::GlooDevice& device) {
  auto gloo = compat::make_gloo_backend(store, rank, size, kNoTimeout, device);
  return c10::make_intrusive<NcclContractBackend>(std::move(gloo), rank, size, std::move(communicator));
}

std::vector<ContractLaunch> nccl_contract_launches() {
  std::lock_guard<std::mutex> lock(g_launches_mutex);
  return g_launches;
}

void clear_nccl_contract_launches() {
  std::lock_guard<std::mutex> lock(g_launches_mutex);
  g_launches.clear();
}

void set_nccl_contract_launch_jitter(std::chrono::microseconds jitter) { g_jitter_us = jitter.count(); }

}  // namespace fsdpp::detail
