// SentencePiece in a build without it (FSDPP_WITH_SENTENCEPIECE off, the default beside a libtorch
// linked to the system's libprotobuf: Debian's libsentencepiece carries its own copy of protobuf's
// symbols, and the two copies in one process crash at load). A tokenizer.model is refused.
#include "../sentencepiece_model.h"

#include <fsdpp/error.h>

namespace fsdpp::tokenizer_detail {

std::unique_ptr<TokenizerImpl> load_sentencepiece(const std::string& file, const TokenizerConfig&) {
  throw Error("tokenizer: " + file + " is a SentencePiece model, and this fsdpp was built without SentencePiece "
              "(FSDPP_WITH_SENTENCEPIECE=OFF: beside a libtorch linked to the system's libprotobuf, as Debian's, "
              "libsentencepiece's own protobuf symbols clash with it); use a tokenizer.json");
}

}  // namespace fsdpp::tokenizer_detail
