#!/bin/sh
# PyTorch's libtorch ships no Gloo headers, so fsdpp compiles c10d's ProcessGroupGloo.hpp against
# whatever Gloo headers the system has (Debian's libgloo-dev), which may be another Gloo version
# than the one compiled into libtorch. That is safe only if fsdpp's code depends on no Gloo type's
# layout, virtual table or inline code. This reads the symbols of the one object file that includes
# those headers (src/compat/gloo_backend.cpp) and fails on anything that could:
#   - any symbol naming a Gloo function, virtual table or typeinfo, defined or called (a read-only Gloo
#     constant with internal linkage is the headers' own and never reaches libtorch);
#   - Gloo types other than std::shared_ptr<gloo::transport::Device>, which fsdpp only moves and
#     destroys (its control block and deleter were made inside libtorch);
#   - inline code of ProcessGroupGloo compiled here other than the allowed list below: an inline
#     member could reach into Gloo objects (setTimeout walks gloo::Context, for one).
# Optimized code can inline a member completely and leave no symbol, so the suite also checks a
# copy compiled at -O0 (fsdpp_gloo_backend_O0), where every inline function used is emitted. A
# virtual call on a Gloo object leaves no symbol at any level and is not seen here:
# gloo_backend.cpp makes none, and its header comment forbids it (process_group.cpp once called
# device->str()).
#   check_gloo_abi.sh OBJECT_FILE...
set -eu
for object in "$@"; do
  symbols=$(nm -C "$object")
  # Not vacuous: this must be the object that makes the backend.
  printf '%s\n' "$symbols" | grep -q ' U c10d::ProcessGroupGloo::ProcessGroupGloo(' || {
    echo "check_gloo_abi: $object does not construct c10d::ProcessGroupGloo: not the Gloo translation unit" >&2; exit 1; }
  # Gloo's own names: lower-case "gloo::" (c10d's class is "ProcessGroupGloo::").
  gloo=$(printf '%s\n' "$symbols" | grep 'gloo::' || true)
  device_ptr='std::(__)?shared_ptr<gloo::transport::Device(, \(__gnu_cxx::_Lock_policy\)2)?>'
  bad=$(printf '%s\n' "$gloo" | sed -E "s/$device_ptr/DEVICE_PTR/g" | grep 'gloo::' |
    grep -Ev '^[0-9a-f]* [r] gloo::([a-z]+::)*k[A-Za-z]*$' || true)
  # ProcessGroupGloo code compiled here (not the intrusive_ptr machinery around the type): inline
  # members, local clones of them, its vtable or typeinfo.
  allowed_inline='c10d::ProcessGroupGloo::Options::create('
  inline=$(printf '%s\n' "$symbols" |
    grep -E '^[0-9a-f]+ [WwVvTt] ((vtable|typeinfo|typeinfo name|VTT) for )?c10d::ProcessGroupGloo' |
    grep -vF "$allowed_inline" || true)
  if [ -n "$bad" ] || [ -n "$inline" ]; then
    echo "check_gloo_abi: $object depends on Gloo's headers beyond a pointer to a device:" >&2
    printf '%s\n' "$bad" "$inline" | sed '/^$/d' >&2
    echo "(docs/building.md, 'Gloo headers', says why each is unsafe with another Gloo version's headers)" >&2
    exit 1
  fi
  count=$(printf '%s\n' "$gloo" | sed '/^$/d' | wc -l)
  echo "check_gloo_abi: $object: $count symbols name Gloo types, all std::shared_ptr<gloo::transport::Device> machinery or Gloo's internal constants; no Gloo code, vtable or layout"
done
