#!/bin/sh
# Adds to .device-deps/ (made by ../shared/tools/device-deps.sh) what libfsdpp's tokenizers need
# and the accelerator machine lacks: Oniguruma, ICU's common library and SentencePiece, headers
# and shared libraries from this machine's Debian packages (libonig-dev, libicu-dev,
# libsentencepiece-dev; scripts/install-deps.sh installs them). Run it after device-deps.sh,
# from the project root; scripts/run-gpu-tests.sh checks for it.
set -eu
d=.device-deps
[ -d "$d" ] || { echo "device-deps-tokenizers: run ../shared/tools/device-deps.sh first" >&2; exit 1; }
lib=/usr/lib/x86_64-linux-gnu
for f in /usr/include/oniguruma.h /usr/include/sentencepiece_processor.h /usr/include/unicode; do
  [ -e "$f" ] || { echo "device-deps-tokenizers: $f missing (scripts/install-deps.sh)" >&2; exit 1; }
done
cp -r /usr/include/oniguruma.h /usr/include/sentencepiece_processor.h /usr/include/sentencepiece_trainer.h \
  /usr/include/unicode "$d/include/"
cp -a "$lib"/libonig.so* "$lib"/libicuuc.so* "$lib"/libicudata.so* "$lib"/libsentencepiece.so* "$d/lib/x86_64-linux-gnu/"
echo "device-deps-tokenizers: Oniguruma, ICU and SentencePiece added to $d"
