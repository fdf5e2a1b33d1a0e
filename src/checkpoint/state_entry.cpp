// Entry: what a checkpoint's state holds under one key.
#include <fsdpp/checkpoint.h>
#include <fsdpp/error.h>

namespace fsdpp::checkpoint {

Entry::Entry(at::Tensor tensor) : kind_(Kind::kTensor), tensor_(std::move(tensor)) {
  if (!tensor_.defined()) throw Error("checkpoint::Entry: undefined tensor");
  global_shape_ = tensor_.sizes().vec();
}
Entry::Entry(int64_t value) : kind_(Kind::kInt), int_(value) {}
Entry::Entry(double value) : kind_(Kind::kDouble), double_(value) {}
Entry::Entry(std::string value) : kind_(Kind::kString), string_(std::move(value)) {}

Entry Entry::sharded(std::vector<int64_t> global_shape, std::vector<LocalShard> shards) {
  Entry e;
  e.kind_ = Kind::kSharded;
  for (const auto& s : shards) {
    if (!s.tensor.defined()) throw Error("checkpoint::Entry::sharded: undefined shard tensor");
    if (s.offsets.size() != global_shape.size() || static_cast<size_t>(s.tensor.dim()) != global_shape.size())
      throw Error("checkpoint::Entry::sharded: a shard of sizes " + c10::str(s.tensor.sizes()) + " at offsets " +
                  c10::str(at::IntArrayRef(s.offsets)) + " does not match the global shape " +
                  c10::str(at::IntArrayRef(global_shape)));
    for (size_t d = 0; d < global_shape.size(); ++d)
      if (s.offsets[d] < 0 || s.offsets[d] + s.tensor.size(static_cast<int64_t>(d)) > global_shape[d])
        throw Error("checkpoint::Entry::sharded: a shard of sizes " + c10::str(s.tensor.sizes()) + " at offsets " +
                    c10::str(at::IntArrayRef(s.offsets)) + " lies outside the global shape " +
                    c10::str(at::IntArrayRef(global_shape)));
  }
  e.global_shape_ = std::move(global_shape);
  e.shards_ = std::move(shards);
  return e;
}

Entry Entry::sharded(at::Tensor local, std::vector<int64_t> offsets, std::vector<int64_t> global_shape) {
  return sharded(std::move(global_shape), {LocalShard{std::move(local), std::move(offsets)}});
}

Entry Entry::bytes(std::string value) {
  Entry e(std::move(value));
  e.kind_ = Kind::kBytes;
  return e;
}

namespace {
[[noreturn]] void wrong_kind(const char* wanted, Entry::Kind kind) {
  throw Error(std::string("checkpoint::Entry: asked for ") + wanted + " of a " + to_string(kind) + " entry");
}
}  // namespace

const at::Tensor& Entry::tensor() const {
  if (kind_ != Kind::kTensor) wrong_kind("the tensor", kind_);
  return tensor_;
}
const std::vector<LocalShard>& Entry::shards() const {
  if (kind_ != Kind::kSharded) wrong_kind("the shards", kind_);
  return shards_;
}
const std::vector<int64_t>& Entry::global_shape() const {
  if (!is_tensor()) wrong_kind("the global shape", kind_);
  return global_shape_;
}
int64_t Entry::to_int() const {
  if (kind_ != Kind::kInt) wrong_kind("an int", kind_);
  return int_;
}
double Entry::to_double() const {
  if (kind_ != Kind::kDouble) wrong_kind("a double", kind_);
  return double_;
}
const std::string& Entry::to_string() const {
  if (kind_ != Kind::kString && kind_ != Kind::kBytes) wrong_kind("a string", kind_);
  return string_;
}

const char* to_string(Entry::Kind kind) {
  switch (kind) {
    case Entry::Kind::kTensor: return "tensor";
    case Entry::Kind::kSharded: return "sharded tensor";
    case Entry::Kind::kInt: return "int64";
    case Entry::Kind::kDouble: return "double";
    case Entry::Kind::kString: return "string";
    case Entry::Kind::kBytes: return "bytes";
  }
  return "?";
}

}  // namespace fsdpp::checkpoint
