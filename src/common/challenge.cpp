// Challenge-response proofs and secure random bytes (see challenge.h).
#include "common/challenge.h"

#include <sys/random.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "common/sha256.h"

namespace gradswitch {

std::string auth_proof(std::string_view label, std::string_view secret, std::string_view tenant,
                       std::string_view nonce, std::string_view cnonce) {
  std::string message;
  message.reserve(label.size() + tenant.size() + nonce.size() + cnonce.size() + 3);
  (((((message += label) += '\n') += tenant) += '\n') += nonce) += '\n';
  message += cnonce;
  return to_hex(hmac_sha256(secret, message));
}

void secure_random(void* out, size_t n) {
  auto* p = static_cast<unsigned char*>(out);
  while (n > 0) {
    const ssize_t got = ::getrandom(p, n, 0);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) {
      std::fprintf(stderr, "gradswitch: getrandom() failed: %s\n", std::strerror(errno));
      std::abort();
    }
    p += got;
    n -= static_cast<size_t>(got);
  }
}

std::string random_hex(size_t bytes) {
  std::vector<uint8_t> b(bytes);
  secure_random(b.data(), b.size());
  return to_hex(b.data(), b.size());
}

bool is_nonce(std::string_view s) {
  if (s.size() < 32 || s.size() > 128) return false;
  for (char c : s)
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  return true;
}

}  // namespace gradswitch
