#pragma once
// An N-D arrangement of ranks with a process group per dimension (PyTorch's DeviceMesh).
#include <memory>
#include <string>
#include <vector>

#include <fsdpp/process_group.h>

namespace fsdpp {

namespace detail {
struct DeviceMeshImpl;
}

class DeviceMesh {
 public:
  DeviceMesh() = default;

  int ndim() const;
  // Number of ranks along a dimension, or in the whole mesh.
  int size(int dim) const;
  int size() const;
  const std::vector<int64_t>& shape() const;
  const std::vector<std::string>& mesh_dim_names() const;
  // Global ranks, row-major in shape().
  const std::vector<int>& ranks() const;

  // This rank's index along each dimension, and along one.
  const std::vector<int>& get_coordinate() const;
  int get_local_rank(int dim) const;
  int get_local_rank(const std::string& dim) const;

  // The group of the ranks that share this rank's coordinates on every other dimension.
  ProcessGroup get_group(int dim) const;
  ProcessGroup get_group(const std::string& dim) const;
  // Only for a 1-D mesh.
  ProcessGroup get_group() const;

  // The sub-mesh along the named dimensions (this rank's slice), e.g. mesh["shard"].
  DeviceMesh operator[](const std::string& dim) const;
  DeviceMesh operator[](const std::vector<std::string>& dims) const;

  bool defined() const { return impl_ != nullptr; }
  explicit DeviceMesh(std::shared_ptr<const detail::DeviceMeshImpl> impl) : impl_(std::move(impl)) {}

 private:
  int dim_index(const std::string& name) const;
  const detail::DeviceMeshImpl& impl() const;
  std::shared_ptr<const detail::DeviceMeshImpl> impl_;
};

// Arranges the members of `group` (in group-rank order) into `mesh_shape`; every member must
// call it with the same arguments. Names default to "dim0", "dim1", ...
DeviceMesh init_device_mesh(const ProcessGroup& group, const std::vector<int64_t>& mesh_shape,
                            const std::vector<std::string>& mesh_dim_names = {});

}  // namespace fsdpp
