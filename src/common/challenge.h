// The control plane's challenge-response authentication (docs/protocol.md section 1.5), the part
// both sides compute: the proofs a client and the switch give that they know a tenant's secret,
// and the random bytes nonces (and the switch's job ids and keys) are drawn from.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace gradswitch {

// HMAC-SHA-256(secret, "<label>\n<tenant>\n<nonce>\n<cnonce>") in lower-case hex: the client's proof
// (label GS_AUTH_CLIENT_LABEL) in AUTH, the switch's (GS_AUTH_SWITCH_LABEL) in its reply.
std::string auth_proof(std::string_view label, std::string_view secret, std::string_view tenant,
                       std::string_view nonce, std::string_view cnonce);

// `n` bytes from the kernel's CSPRNG (getrandom); aborts the process if it cannot (a switch must
// not run with guessable ids and keys).
void secure_random(void* out, size_t n);
// `bytes` random bytes in lower-case hex (2 * bytes characters).
std::string random_hex(size_t bytes);

// Lower-case hex of 32..128 characters: a nonce as the protocol takes it.
bool is_nonce(std::string_view s);

}  // namespace gradswitch
