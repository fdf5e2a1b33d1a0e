#include <fsdpp/sharded_tensor.h>

#include <algorithm>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <fsdpp/collectives.h>
#include <fsdpp/error.h>

#include "common/shape_string.h"

namespace fsdpp {
using detail::shape_string;

namespace {

std::string describe(const ShardMetadata& m) {
  return "shard at offsets " + shape_string(m.shard_offsets) + " of size " + shape_string(m.shard_sizes) + " on rank " +
         std::to_string(m.placement);
}

ProcessGroup resolve(ProcessGroup group) { return group.defined() ? group : default_group(); }

bool overlap(const ShardMetadata& a, const ShardMetadata& b) {
  if (a.numel() == 0 || b.numel() == 0) return false;
  for (size_t d = 0; d < a.shard_offsets.size(); ++d) {
    const int64_t a0 = a.shard_offsets[d], a1 = a0 + a.shard_sizes[d];
    const int64_t b0 = b.shard_offsets[d], b1 = b0 + b.shard_sizes[d];
    if (a1 <= b0 || b1 <= a0) return false;
  }
  return true;
}

// The region of `t` a shard covers.
at::Tensor region_of(at::Tensor t, const ShardMetadata& m) {
  for (size_t d = 0; d < m.shard_offsets.size(); ++d)
    t = t.narrow(static_cast<int64_t>(d), m.shard_offsets[d], m.shard_sizes[d]);
  return t;
}

// Throws unless the shards sit on ranks of the group, lie inside `size`, do not overlap and cover it.
void check_layout(const std::vector<ShardMetadata>& shards, const std::vector<int64_t>& size, int group_size) {
  int64_t numel = 1;
  for (int64_t s : size) numel *= s;
  int64_t covered = 0;
  for (const auto& m : shards) {
    if (m.placement < 0 || m.placement >= group_size)
      throw Error("ShardedTensor: " + describe(m) + " is placed outside the group of " + std::to_string(group_size) +
                  " ranks");
    if (m.shard_offsets.size() != size.size() || m.shard_sizes.size() != size.size())
      throw Error("ShardedTensor: " + describe(m) + " has another number of dimensions than the global size " +
                  shape_string(size));
    for (size_t d = 0; d < size.size(); ++d)
      if (m.shard_offsets[d] < 0 || m.shard_sizes[d] < 0 || m.shard_offsets[d] + m.shard_sizes[d] > size[d])
        throw Error("ShardedTensor: " + describe(m) + " lies outside the global size " + shape_string(size));
    covered += m.numel();
  }
  for (size_t i = 0; i < shards.size(); ++i)
    for (size_t j = i + 1; j < shards.size(); ++j)
      if (overlap(shards[i], shards[j]))
        throw Error("ShardedTensor: " + describe(shards[i]) + " overlaps " + describe(shards[j]));
  if (covered != numel)
    throw Error("ShardedTensor: the shards cover " + std::to_string(covered) + " of the " + std::to_string(numel) +
                " elements of global size " + shape_string(size) + "; every element needs exactly one shard");
}

// Throws unless the local shard's tensor has the metadata's shape and the dtype.
std::string local_shard_problem(const Shard& s, at::ScalarType dtype) {
  if (!s.tensor.defined()) return "local " + describe(s.metadata) + " has no tensor";
  if (s.tensor.sizes().vec() != s.metadata.shard_sizes)
    return "local " + describe(s.metadata) + " holds a tensor of shape " + shape_string(s.tensor.sizes().vec());
  if (s.tensor.scalar_type() != dtype)
    return "local " + describe(s.metadata) + " is " + std::string(c10::toString(s.tensor.scalar_type())) +
           " but the sharded tensor is " + c10::toString(dtype);
  return {};
}

}  // namespace

int64_t ShardMetadata::numel() const {
  int64_t n = 1;
  for (int64_t s : shard_sizes) n *= s;
  return n;
}

Shard Shard::from_tensor_and_offsets(at::Tensor tensor, std::vector<int64_t> offsets, int rank) {
  if (static_cast<int64_t>(offsets.size()) != tensor.dim())
    throw Error("Shard::from_tensor_and_offsets: " + std::to_string(offsets.size()) + " offsets for a tensor of shape " +
                shape_string(tensor.sizes().vec()));
  Shard s;
  s.metadata.shard_offsets = std::move(offsets);
  s.metadata.shard_sizes = tensor.sizes().vec();
  s.metadata.placement = rank;
  s.tensor = std::move(tensor);
  return s;
}

int64_t ShardedTensor::numel() const {
  int64_t n = 1;
  for (int64_t s : size_) n *= s;
  return n;
}

ShardedTensor ShardedTensor::from_local_shards(std::vector<Shard> local_shards, std::vector<int64_t> global_size,
                                               ProcessGroup group) {
  group = resolve(std::move(group));
  if (!group.is_member()) throw Error("ShardedTensor::from_local_shards: this rank is not a member of group " + group.name());
  const int rank = group.rank(), n = group.size();
  at::ScalarType dtype = local_shards.empty() ? at::ScalarType::Undefined : local_shards.front().tensor.scalar_type();
  std::string problem;
  for (auto& s : local_shards) {
    if (s.metadata.placement != rank && problem.empty())
      problem = "local " + describe(s.metadata) + " is placed on another rank than this one (" + std::to_string(rank) + ")";
    if (problem.empty()) problem = local_shard_problem(s, dtype);
  }
  // Encoding: [problem?, dtype, ndim, size..., nshards, (offsets..., sizes...)...].
  std::vector<int64_t> mine{problem.empty() ? 0 : 1, static_cast<int64_t>(dtype),
                            static_cast<int64_t>(global_size.size())};
  mine.insert(mine.end(), global_size.begin(), global_size.end());
  mine.push_back(static_cast<int64_t>(local_shards.size()));
  for (const auto& s : local_shards) {
    mine.insert(mine.end(), s.metadata.shard_offsets.begin(), s.metadata.shard_offsets.end());
    mine.insert(mine.end(), s.metadata.shard_sizes.begin(), s.metadata.shard_sizes.end());
  }
  at::Tensor len = at::tensor(std::vector<int64_t>{static_cast<int64_t>(mine.size())}, at::kLong);
  at::Tensor lens = at::empty({n}, at::kLong);
  all_gather_into_tensor(lens, len, group);
  const int64_t max_len = lens.max().item<int64_t>();
  mine.resize(static_cast<size_t>(max_len), 0);
  at::Tensor all = at::empty({n * max_len}, at::kLong);
  all_gather_into_tensor(all, at::tensor(mine, at::kLong), group);
  std::vector<int64_t> v(all.data_ptr<int64_t>(), all.data_ptr<int64_t>() + n * max_len);

  if (!problem.empty()) throw Error("ShardedTensor::from_local_shards on rank " + std::to_string(rank) + ": " + problem);
  std::vector<ShardMetadata> metadata;
  at::ScalarType agreed = at::ScalarType::Undefined;
  int agreed_rank = -1;
  for (int r = 0; r < n; ++r) {
    const int64_t* p = v.data() + r * max_len;
    if (p[0]) throw Error("ShardedTensor::from_local_shards: rank " + std::to_string(r) + "'s local shards are invalid (see its error)");
    const auto rdtype = static_cast<at::ScalarType>(p[1]);
    const int64_t ndim = p[2];
    std::vector<int64_t> rsize(p + 3, p + 3 + ndim);
    if (rsize != global_size)
      throw Error("ShardedTensor::from_local_shards: rank " + std::to_string(r) + " gives global size " + shape_string(rsize) +
                  " but rank " + std::to_string(rank) + " gives " + shape_string(global_size));
    const int64_t* q = p + 3 + ndim;
    const int64_t nshards = *q++;
    if (nshards > 0) {
      if (agreed != at::ScalarType::Undefined && rdtype != agreed)
        throw Error("ShardedTensor::from_local_shards: rank " + std::to_string(r) + "'s shards are " + c10::toString(rdtype) +
                    " but rank " + std::to_string(agreed_rank) + "'s are " + c10::toString(agreed));
      agreed = rdtype;
      agreed_rank = r;
    }
    for (int64_t i = 0; i < nshards; ++i) {
      ShardMetadata m;
      m.shard_offsets.assign(q, q + ndim);
      m.shard_sizes.assign(q + ndim, q + 2 * ndim);
      m.placement = r;
      q += 2 * ndim;
      metadata.push_back(std::move(m));
    }
  }
  check_layout(metadata, global_size, n);
  ShardedTensor st;
  st.defined_ = true;
  st.size_ = std::move(global_size);
  st.dtype_ = agreed == at::ScalarType::Undefined ? at::kFloat : agreed;
  st.local_shards_ = std::move(local_shards);
  st.shards_metadata_ = std::move(metadata);
  st.group_ = std::move(group);
  return st;
}

ShardedTensor ShardedTensor::from_local_shards_and_global_metadata(std::vector<Shard> local_shards,
                                                                   std::vector<int64_t> global_size, at::ScalarType dtype,
                                                                   std::vector<ShardMetadata> all_shards,
                                                                   ProcessGroup group) {
  group = resolve(std::move(group));
  const int rank = group.rank();
  size_t next = 0;
  for (const auto& m : all_shards) {
    if (m.placement != rank) continue;
    if (next >= local_shards.size() || !(local_shards[next].metadata == m))
      throw Error("ShardedTensor: the global metadata lists " + describe(m) + " but the local shards do not match it");
    const std::string problem = local_shard_problem(local_shards[next], dtype);
    if (!problem.empty()) throw Error("ShardedTensor on rank " + std::to_string(rank) + ": " + problem);
    ++next;
  }
  if (next != local_shards.size())
    throw Error("ShardedTensor: rank " + std::to_string(rank) + " holds " + std::to_string(local_shards.size()) +
                " local shards but the global metadata places " + std::to_string(next) + " on it");
  check_layout(all_shards, global_size, group.size());
  ShardedTensor st;
  st.defined_ = true;
  st.size_ = std::move(global_size);
  st.dtype_ = dtype;
  st.local_shards_ = std::move(local_shards);
  st.shards_metadata_ = std::move(all_shards);
  st.group_ = std::move(group);
  return st;
}

bool ShardedTensor::has_shards(const std::vector<ShardMetadata>& shards, int group_size) const {
  if (group_.size() != group_size || shards_metadata_.size() != shards.size()) return false;
  for (const auto& m : shards)
    if (std::find(shards_metadata_.begin(), shards_metadata_.end(), m) == shards_metadata_.end()) return false;
  return true;
}

const at::Tensor& ShardedTensor::local_shard(const ShardMetadata& m) const {
  for (const auto& s : local_shards_)
    if (s.metadata == m) return s.tensor;
  throw Error("ShardedTensor: no local " + describe(m) + " on this rank");
}

at::Tensor ShardedTensor::full_tensor() const {
  if (!defined_) throw Error("ShardedTensor::full_tensor: the sharded tensor is empty (default-constructed)");
  at::NoGradGuard no_grad;
  const auto options = at::TensorOptions()
                           .dtype(dtype_)
                           .device(local_shards_.empty() ? at::Device(at::kCPU) : local_shards_.front().tensor.device());
  at::Tensor result = at::empty(size_, options);
  const int n = group_.size();
  std::vector<int64_t> volume(static_cast<size_t>(n), 0);
  for (const auto& m : shards_metadata_) volume[static_cast<size_t>(m.placement)] += m.numel();
  const int64_t max_volume = *std::max_element(volume.begin(), volume.end());
  if (max_volume == 0) return result;
  // Each rank's shards, flattened one after another, padded to the largest rank's volume.
  at::Tensor mine = at::zeros({max_volume}, options);
  int64_t offset = 0;
  for (const auto& s : local_shards_) {
    mine.narrow(0, offset, s.metadata.numel()).copy_(s.tensor.reshape({-1}));
    offset += s.metadata.numel();
  }
  at::Tensor gathered = mine;
  if (n > 1) {
    gathered = at::empty({n * max_volume}, options);
    all_gather_into_tensor(gathered, mine, group_);
  }
  std::vector<int64_t> cursor(static_cast<size_t>(n), 0);
  for (const auto& m : shards_metadata_) {
    int64_t& c = cursor[static_cast<size_t>(m.placement)];
    region_of(result, m).copy_(gathered.narrow(0, m.placement * max_volume + c, m.numel()).view(m.shard_sizes));
    c += m.numel();
  }
  return result;
}

ShardedTensor ShardedTensor::cpu() const {
  ShardedTensor out = *this;
  for (auto& s : out.local_shards_) s.tensor = s.tensor.to(at::kCPU, /*non_blocking=*/false, /*copy=*/true);
  return out;
}

}  // namespace fsdpp
