#include <fsdpp/device_mesh.h>

#include <algorithm>
#include <numeric>

#include <fsdpp/error.h>

namespace fsdpp {
namespace detail {

struct DeviceMeshImpl {
  std::vector<int64_t> shape;
  std::vector<std::string> names;
  std::vector<int> ranks;        // global ranks, row-major in shape
  std::vector<int> coordinate;   // this rank's index along each dimension
  std::vector<ProcessGroup> groups;  // this rank's group along each dimension
};

}  // namespace detail

namespace {

std::string join(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : ", ") + n;
  return "(" + out + ")";
}

std::vector<int64_t> strides_of(const std::vector<int64_t>& shape) {
  std::vector<int64_t> strides(shape.size(), 1);
  for (int d = static_cast<int>(shape.size()) - 2; d >= 0; --d) strides[d] = strides[d + 1] * shape[d + 1];
  return strides;
}

// Global ranks of the slice through `coordinate` along dimension `dim`.
std::vector<int> line_through(const detail::DeviceMeshImpl& m, std::vector<int> coordinate, size_t dim) {
  auto strides = strides_of(m.shape);
  std::vector<int> line;
  for (int64_t i = 0; i < m.shape[dim]; ++i) {
    coordinate[dim] = static_cast<int>(i);
    int64_t index = 0;
    for (size_t d = 0; d < m.shape.size(); ++d) index += coordinate[d] * strides[d];
    line.push_back(m.ranks[index]);
  }
  return line;
}

}  // namespace

DeviceMesh init_device_mesh(const ProcessGroup& group, const std::vector<int64_t>& mesh_shape,
                            const std::vector<std::string>& mesh_dim_names) {
  if (!group.defined()) throw Error("init_device_mesh: the process group is empty");
  if (mesh_shape.empty() || mesh_shape.size() > 3)
    throw Error("init_device_mesh: a mesh has 1 to 3 dimensions, got " + std::to_string(mesh_shape.size()));
  int64_t product = 1;
  for (int64_t s : mesh_shape) {
    if (s < 1) throw Error("init_device_mesh: mesh dimension of size " + std::to_string(s));
    product *= s;
  }
  if (product != group.size())
    throw Error("init_device_mesh: a mesh of " + std::to_string(product) + " ranks does not match group " +
                group.name() + " of size " + std::to_string(group.size()));
  if (!group.is_member()) throw Error("init_device_mesh: this rank is not a member of group " + group.name());
  auto m = std::make_shared<detail::DeviceMeshImpl>();
  m->shape = mesh_shape;
  m->names = mesh_dim_names;
  if (m->names.empty())
    for (size_t d = 0; d < mesh_shape.size(); ++d) m->names.push_back("dim" + std::to_string(d));
  if (m->names.size() != mesh_shape.size())
    throw Error("init_device_mesh: " + std::to_string(m->names.size()) + " dimension names " + join(m->names) +
                " for a mesh of " + std::to_string(mesh_shape.size()) + " dimensions");
  for (size_t d = 0; d < m->names.size(); ++d)
    if (std::count(m->names.begin(), m->names.end(), m->names[d]) > 1)
      throw Error("init_device_mesh: dimension name '" + m->names[d] + "' appears twice in " + join(m->names));
  m->ranks = group.ranks();
  int index = group.rank();
  auto strides = strides_of(mesh_shape);
  for (size_t d = 0; d < mesh_shape.size(); ++d) m->coordinate.push_back(static_cast<int>(index / strides[d] % mesh_shape[d]));

  if (mesh_shape.size() == 1) {
    m->groups.push_back(group);
  } else {
    // Every member creates every line's group, in the same order, as new_group requires.
    for (size_t d = 0; d < mesh_shape.size(); ++d) {
      ProcessGroup mine;
      for (int64_t flat = 0; flat < product; ++flat) {
        std::vector<int> c(mesh_shape.size());
        for (size_t e = 0; e < mesh_shape.size(); ++e) c[e] = static_cast<int>(flat / strides[e] % mesh_shape[e]);
        if (c[d] != 0) continue;  // one line per combination of the other coordinates
        ProcessGroup line = group.new_group(line_through(*m, c, d));
        if (line.is_member()) mine = line;
      }
      m->groups.push_back(mine);
    }
  }
  return DeviceMesh(std::move(m));
}

const detail::DeviceMeshImpl& DeviceMesh::impl() const {
  if (!impl_) throw Error("use of an empty DeviceMesh");
  return *impl_;
}

int DeviceMesh::ndim() const { return static_cast<int>(impl().shape.size()); }
int DeviceMesh::size() const { return static_cast<int>(impl().ranks.size()); }
const std::vector<int64_t>& DeviceMesh::shape() const { return impl().shape; }
const std::vector<std::string>& DeviceMesh::mesh_dim_names() const { return impl().names; }
const std::vector<int>& DeviceMesh::ranks() const { return impl().ranks; }
const std::vector<int>& DeviceMesh::get_coordinate() const { return impl().coordinate; }

int DeviceMesh::size(int dim) const {
  if (dim < 0 || dim >= ndim()) throw Error("DeviceMesh: dimension " + std::to_string(dim) + " of a " + std::to_string(ndim()) + "-D mesh");
  return static_cast<int>(impl().shape[dim]);
}

int DeviceMesh::dim_index(const std::string& name) const {
  const auto& names = impl().names;
  auto it = std::find(names.begin(), names.end(), name);
  if (it == names.end()) throw Error("DeviceMesh: no dimension named '" + name + "' in " + join(names));
  return static_cast<int>(it - names.begin());
}

int DeviceMesh::get_local_rank(int dim) const {
  size(dim);  // validates dim
  return impl().coordinate[dim];
}
int DeviceMesh::get_local_rank(const std::string& dim) const { return get_local_rank(dim_index(dim)); }
ProcessGroup DeviceMesh::get_group(int dim) const { size(dim); return impl().groups[dim]; }
ProcessGroup DeviceMesh::get_group(const std::string& dim) const { return get_group(dim_index(dim)); }

ProcessGroup DeviceMesh::get_group() const {
  if (ndim() != 1) throw Error("DeviceMesh::get_group() without a dimension needs a 1-D mesh, this one is " + join(impl().names));
  return impl().groups[0];
}

DeviceMesh DeviceMesh::operator[](const std::string& dim) const { return (*this)[std::vector<std::string>{dim}]; }

DeviceMesh DeviceMesh::operator[](const std::vector<std::string>& dims) const {
  const auto& m = impl();
  std::vector<int> keep;
  for (const auto& name : dims) keep.push_back(dim_index(name));
  for (size_t i = 1; i < keep.size(); ++i)
    if (keep[i] <= keep[i - 1]) throw Error("DeviceMesh: sub-mesh dimensions " + join(dims) + " must be distinct and in the mesh's order " + join(m.names));
  // The sub-mesh holds the ranks that share this rank's coordinates on the dropped dimensions;
  // its per-dimension groups are the full mesh's.
  auto sub = std::make_shared<detail::DeviceMeshImpl>();
  auto strides = strides_of(m.shape);
  for (int d : keep) {
    sub->shape.push_back(m.shape[d]);
    sub->names.push_back(m.names[d]);
    sub->coordinate.push_back(m.coordinate[d]);
    sub->groups.push_back(m.groups[d]);
  }
  int64_t sub_size = 1;
  for (int64_t s : sub->shape) sub_size *= s;
  auto sub_strides = strides_of(sub->shape);
  for (int64_t flat = 0; flat < sub_size; ++flat) {
    std::vector<int> c = m.coordinate;
    for (size_t k = 0; k < keep.size(); ++k) c[keep[k]] = static_cast<int>(flat / sub_strides[k] % sub->shape[k]);
    int64_t index = 0;
    for (size_t d = 0; d < m.shape.size(); ++d) index += c[d] * strides[d];
    sub->ranks.push_back(m.ranks[index]);
  }
  return DeviceMesh(std::move(sub));
}

}  // namespace fsdpp
