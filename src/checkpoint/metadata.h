#pragma once
// The metadata file: JSON in, JSON out (docs/checkpoint-format.md).
#include <string>

#include <fsdpp/checkpoint.h>

namespace fsdpp::checkpoint::detail {

std::string metadata_to_json(const Metadata& m);
// `where` names the file in errors.
Metadata metadata_from_json(const std::string& text, const std::string& where);
// Explains why `dir` holds no complete checkpoint (missing, not a directory, incomplete save),
// or returns "" if dir/metadata.json exists.
std::string why_not_a_checkpoint(const std::string& dir);

}  // namespace fsdpp::checkpoint::detail
