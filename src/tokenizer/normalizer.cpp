#include "normalizer.h"

#include <fsdpp/error.h>
#include <unicode/unorm2.h>
#include <unicode/ustring.h>

#include <vector>

namespace fsdpp::tokenizer_detail {

Normalizer Normalizer::from_json(const JsonAt& at) {
  Normalizer n;
  if (at.value.is_null()) return n;
  const std::string type = at.child("type").string();
  if (type == "NFC") {
    n.nfc_ = true;
  } else if (type == "Sequence") {
    const JsonAt list = at.child("normalizers");
    for (size_t i = 0; i < list.value.size(); ++i) n.nfc_ |= from_json(list.at(i)).nfc_;
  } else {
    at.child("type").fail("normalizer type '" + type + "' is not supported (only NFC or none)");
  }
  return n;
}

std::string Normalizer::apply(std::string_view text) const {
  if (!nfc_) return std::string(text);
  bool ascii = true;  // ASCII is already NFC, and is most text
  for (char c : text) ascii &= static_cast<unsigned char>(c) < 0x80;
  if (ascii) return std::string(text);

  UErrorCode status = U_ZERO_ERROR;
  const UNormalizer2* nfc = unorm2_getNFCInstance(&status);
  std::vector<UChar> in(text.size() + 1), out;
  int32_t in_len = 0;
  u_strFromUTF8(in.data(), static_cast<int32_t>(in.size()), &in_len, text.data(),
                static_cast<int32_t>(text.size()), &status);
  if (U_SUCCESS(status) && unorm2_isNormalized(nfc, in.data(), in_len, &status) && U_SUCCESS(status)) {
    return std::string(text);
  }
  // NFC can at most triple the length in UTF-16 units.
  out.resize(static_cast<size_t>(in_len) * 3 + 16);
  const int32_t out_len =
      unorm2_normalize(nfc, in.data(), in_len, out.data(), static_cast<int32_t>(out.size()), &status);
  std::string result(static_cast<size_t>(out_len) * 3 + 4, '\0');
  int32_t result_len = 0;
  u_strToUTF8(result.data(), static_cast<int32_t>(result.size()), &result_len, out.data(), out_len, &status);
  if (U_FAILURE(status)) throw Error(std::string("tokenizer: NFC normalization failed: ") + u_errorName(status));
  result.resize(static_cast<size_t>(result_len));
  return result;
}

}  // namespace fsdpp::tokenizer_detail
