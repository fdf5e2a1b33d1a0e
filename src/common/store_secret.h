#pragma once
// The secret a multi-node job's keys live under. c10d's TCPStore has no authentication and no
// way to list its keys, so keys under an unguessable prefix cannot be read or forged by a
// stranger who reaches the port. Pure: fsdpp-run and the ranks derive the same prefix.
#include <string>

namespace fsdpp {

// Set by the user for every launcher (srun passes the environment on); the launcher's ranks
// inherit it. Never printed.
inline constexpr const char* kStoreSecretVariable = "FSDPP_STORE_SECRET";  // named in redact_store_secret too
inline constexpr std::size_t kStoreSecretMinLength = 16;

// Why `secret` cannot serve, naming the variable but never the value; "" if it can.
inline std::string store_secret_problem(const std::string& secret) {
  const std::string name = kStoreSecretVariable;
  if (secret.size() < kStoreSecretMinLength)
    return name + " has " + std::to_string(secret.size()) + " characters; a secret needs at least " +
           std::to_string(kStoreSecretMinLength) + " (e.g. head -c 24 /dev/urandom | base64)";
  for (char c : secret)
    if (c <= ' ' || c > '~' || c == '/')
      return name + " may hold printable characters other than space and '/' only";
  return "";
}

// The prefix of every key under `secret`.
inline std::string store_secret_prefix(const std::string& secret) { return "fsdpp-secret-" + secret; }

// `text` with every occurrence of `secret` replaced by the variable's name.
inline std::string redact_store_secret(std::string text, const std::string& secret) {
  if (secret.empty()) return text;
  const std::string mask = "<FSDPP_STORE_SECRET>";
  for (auto at = text.find(secret); at != std::string::npos; at = text.find(secret, at + mask.size()))
    text.replace(at, secret.size(), mask);
  return text;
}

}  // namespace fsdpp
