// Tenants (src/switch/control/auth.h): the auth file's grammar and errors, quotas and their
// defaults; the AUTH, ABORT and JOIN types= parsers; the proofs of the challenge-response
// (src/common/challenge.h); the metrics endpoint's tokens and who sees which job; the table that
// replaces the one in force when the file is read again (SIGHUP); and the protected-mode checks of
// the configuration.
#include <string>

#include "common/challenge.h"
#include "gradswitch/control.h"
#include "harness.h"
#include "switch/config.h"
#include "switch/control/auth.h"
#include "switch/control/parse.h"
#include "switch/options/validate.h"

using namespace gradswitch;
using namespace gradswitch::control;

namespace {

const Quota kLimits{64, 1ull << 30};
const std::string kSecret = "0123456789abcdef0123";

std::optional<AuthTable> parse(const std::string& text, std::string* error) {
  error->clear();
  return parse_auth_file(text, kLimits, error);
}

std::optional<Request> line(const std::string& text) {
  Error err;
  return parse_request(text, &err);
}

}  // namespace

TEST(auth_file_entries_quotas_and_defaults) {
  std::string e;
  auto t = parse(
      "# shared switch\n"
      "tenant alice secret=" +
          kSecret +
          " max_jobs=3   # a comment\n"
          "\n"
          "  tenant bob\tsecret=" +
          kSecret +
          "x max_memory=2M\r\n"
          "operator ops secret=" +
          kSecret +
          "y\n"
          "defaults max_jobs=5 max_memory=512M\n"
          "anonymous max_jobs=1\n",
      &e);
  CHECK(t.has_value());
  if (!t) return;
  CHECK(t->tenants.size() == 3 && t->find("alice") == 0 && t->find("bob") == 1 && t->find("eve") == -1);
  const Tenant& alice = t->tenants[0];
  CHECK(alice.secret == kSecret && !alice.is_operator);
  CHECK(alice.quota.max_jobs == 3 && alice.quota.max_memory == 512ull << 20);  // defaults fill the rest
  CHECK(t->tenants[1].quota.max_jobs == 5 && t->tenants[1].quota.max_memory == 2ull << 20);
  CHECK(t->tenants[2].is_operator);
  CHECK(t->anonymous && t->anonymous->max_jobs == 1 && t->anonymous->max_memory == 512ull << 20);
  // Without `defaults`, a quota is half of the switch's own limits (--tenant-share), so that no tenant
  // with defaults can take them all; without `anonymous`, JOIN needs AUTH.
  t = parse("tenant a secret=" + kSecret + "\n", &e);
  CHECK(t && t->tenants[0].quota.max_jobs == 32 && t->tenants[0].quota.max_memory == 512ull << 20 &&
        !t->anonymous);
  t = parse_auth_file("tenant a secret=" + kSecret + "\nanonymous\n", kLimits, &e, 10);
  CHECK(t && t->tenants[0].quota.max_jobs == 6 && t->tenants[0].quota.max_memory == (1ull << 30) / 10 &&
        t->anonymous && t->anonymous->max_jobs == 6);
  // An explicit quota may still be the switch's whole limit; a share never rounds down to nothing.
  t = parse("tenant a secret=" + kSecret + " max_jobs=64 max_memory=1G\n", &e);
  CHECK(t && t->tenants[0].quota.max_jobs == 64 && t->tenants[0].quota.max_memory == 1ull << 30);
  CHECK(default_quota({1, 1}, 50).max_jobs == 1 && default_quota({1, 1}, 50).max_memory == 1);
}

TEST(auth_file_errors_name_the_line) {
  std::string e;
  auto fails_with = [&](const std::string& text, const std::string& what) {
    bool ok = !parse(text, &e) && e.find(what) != std::string::npos;
    if (!ok) std::fprintf(stderr, "  for %s: got '%s'\n", text.c_str(), e.c_str());
    return ok;
  };
  CHECK(fails_with("tenant alice\n", "line 1: tenant 'alice' needs secret="));
  CHECK(fails_with("\ntenant alice secret=short\n", "line 2: the secret must be 16"));
  CHECK(fails_with("tenant al/ice secret=" + kSecret + "\n", "line 1: tenant needs a name"));
  CHECK(fails_with("tenant a secret=" + kSecret + "\noperator a secret=" + kSecret + "\n",
                   "line 2: 'a' is named twice"));
  CHECK(fails_with("operator o secret=" + kSecret + " max_jobs=1\n", "an operator has no quota"));
  CHECK(fails_with("anonymous secret=" + kSecret + "\n", "takes no secret"));
  CHECK(fails_with("tenant a secret=" + kSecret + " max_jobs=65\n", "at most --max-jobs"));
  CHECK(fails_with("tenant a secret=" + kSecret + " max_memory=2G\n", "exceeds --max-memory"));
  CHECK(fails_with("tenant a secret=" + kSecret + " colour=blue\n", "unknown key 'colour'"));
  CHECK(fails_with("anonymous\nanonymous\n", "line 2: a second 'anonymous'"));
  CHECK(fails_with("tenant a secret=" + kSecret + " max_jobs\n", "expected key=value"));
  CHECK(fails_with("", "nobody could use the switch"));
  CHECK(fails_with("defaults max_jobs=2\n", "nobody could use the switch"));
  std::string why;  // a directory (one way a reloaded file is unreadable, even for root) says so
  CHECK(!load_auth_file("/", kLimits, &why) && why == "--auth-file /: not a regular file");
}

TEST(auth_and_abort_requests) {
  Error err;
  const std::string nonce(64, 'a'), good_proof(64, '0');
  auto a = parse_auth(*line("AUTH tenant=alice cnonce=" + nonce + " proof=" + good_proof), &err);
  CHECK(a && a->tenant == "alice" && a->cnonce == nonce && a->proof == good_proof);
  CHECK(!parse_auth(*line("AUTH tenant=alice cnonce=" + nonce), &err) &&
        err.code == std::string(kErrBadRequest));
  CHECK(!parse_auth(*line("AUTH tenant=a:b cnonce=" + nonce + " proof=" + good_proof), &err));
  CHECK(!parse_auth(*line("AUTH tenant=a cnonce=abc proof=" + good_proof), &err));  // short nonce
  CHECK(!parse_auth(*line("AUTH tenant=a cnonce=" + nonce + " proof=" + std::string(64, 'G')), &err));
  CHECK(!parse_auth(*line("AUTH tenant=a cnonce=" + nonce + " proof=" + good_proof + " x=1"), &err));
  auto id = parse_abort(*line("ABORT job_id=0x1234"), &err);
  CHECK(id && *id == 0x1234);
  CHECK(!parse_abort(*line("ABORT"), &err) && !parse_abort(*line("ABORT job_id=0"), &err));
}

TEST(join_types_lists_extra_element_types) {
  Error err;
  auto j =
      parse_join(*line("JOIN job=j world=1 rank=0 wire=float32 token=t port=9 types=float64,int32"), &err);
  CHECK(j && j->types == ((1u << GS_ELEM_FLOAT64) | (1u << GS_ELEM_INT32)));
  for (const char* bad : {"types=float64,", "types=,float64", "types=float64,float64", "types=int64"})
    CHECK(!parse_join(*line(std::string("JOIN job=j world=1 rank=0 wire=float32 token=t port=9 ") + bad),
                      &err));
  CHECK(!parse_join(*line("JOIN job=j world=1 rank=0 wire=float32 token=t port=9 types=float64 optimizer=sgd "
                          "params=4 lr=0.1"),
                    &err));
}

TEST(proofs_bind_the_secret_tenant_and_both_nonces) {
  const std::string n(64, '1'), c(32, '2');
  const std::string p = auth_proof(GS_AUTH_CLIENT_LABEL, kSecret, "alice", n, c);
  CHECK(p.size() == 64 && is_nonce(random_hex(32)) && random_hex(32) != random_hex(32));
  CHECK(p != auth_proof(GS_AUTH_SWITCH_LABEL, kSecret, "alice", n, c));  // the switch's differs
  CHECK(p != auth_proof(GS_AUTH_CLIENT_LABEL, kSecret + "x", "alice", n, c));
  CHECK(p != auth_proof(GS_AUTH_CLIENT_LABEL, kSecret, "bob", n, c));
  CHECK(p != auth_proof(GS_AUTH_CLIENT_LABEL, kSecret, "alice", std::string(64, '3'), c));
  CHECK(p != auth_proof(GS_AUTH_CLIENT_LABEL, kSecret, "alice", n, std::string(32, '4')));
}

TEST(a_reachable_control_host_needs_an_auth_file_or_insecure) {
  SwitchConfig c;
  CHECK(c.control_host == "127.0.0.1" && validate_config(c).empty());  // the default: loopback
  c.control_host = "127.5.6.7";
  CHECK(validate_config(c).empty());
  c.control_host = "0.0.0.0";
  CHECK(validate_config(c).find("--auth-file") != std::string::npos);
  c.insecure = true;
  CHECK(validate_config(c).empty());
  c.insecure = false;
  c.control_host = "10.0.0.1";
  c.auth_file = "/etc/gradswitch/auth";
  CHECK(validate_config(c).empty());
}

TEST(metrics_tokens_are_derived_from_the_secrets_and_found_by_token) {
  // The vector: Python's hmac.new(secret, b"gradswitch-metrics-v1\nops", sha256).hexdigest().
  CHECK(metrics_token(kSecret, "ops") == "f5d94dc5637883cec870e3cd4a283f24dd79c38f11ad6af1667365483a5df6da");
  std::string e;
  auto t = parse("tenant alice secret=" + kSecret + "\noperator ops secret=" + kSecret + "\n", &e);
  CHECK(t && t->metrics_tokens.size() == 2);
  CHECK(t->metrics_tokens[0] != t->metrics_tokens[1]);  // one secret, two entries: two tokens
  CHECK(t->find_metrics_token(metrics_token(kSecret, "ops")) == 1);
  CHECK(t->find_metrics_token(metrics_token(kSecret, "alice")) == 0);
  CHECK(t->find_metrics_token(kSecret) == -1);  // the secret itself is no token
  CHECK(t->find_metrics_token("") == -1);
  CHECK(t->find_metrics_token(metrics_token(kSecret, "mallory")) == -1);
}

TEST(who_sees_a_job) {
  const Viewer op{true, 3, std::nullopt}, alice{false, 0, std::nullopt}, rank{false, kAnonymous, 7u};
  CHECK(may_see(op, 7, 1) && may_see(op, 8, kAnonymous));
  CHECK(may_see(alice, 7, 0) && !may_see(alice, 7, 1) && !may_see(alice, 7, kAnonymous));
  CHECK(may_see(rank, 7, kAnonymous) && !may_see(rank, 8, kAnonymous));  // an anonymous rank: its job
  CHECK(!may_see(Viewer{}, 7, kAnonymous));                              // anonymous use shares no tenant
}

TEST(a_reloaded_table_keeps_every_index_and_retires_what_left) {
  std::string e;
  const std::string other = "fedcba9876543210fedcba";
  auto old = parse("tenant alice secret=" + kSecret + "\ntenant bob secret=" + kSecret +
                       "\noperator ops secret=" + kSecret + "\nanonymous\n",
                   &e);
  // bob goes, alice gets a new secret and another quota, ops becomes a tenant, carol comes.
  auto fresh = parse("tenant carol secret=" + kSecret + "\ntenant alice secret=" + other +
                         " max_jobs=2\ntenant ops secret=" + kSecret + "\n",
                     &e);
  CHECK(old && fresh);
  AuthChange change;
  const AuthTable t = merge_reloaded(*old, *fresh, &change);
  CHECK(t.tenants.size() == 5 && t.metrics_tokens.size() == 5);
  // The old indices name the same entries: alice stays 0 with the new secret and quota.
  CHECK(t.tenants[0].name == "alice" && t.tenants[0].secret == other && t.tenants[0].quota.max_jobs == 2 &&
        !t.tenants[0].retired && t.metrics_tokens[0] == metrics_token(other, "alice"));
  // bob is retired at 1: no secret, no token, found by no name; so is the operator whose role changed.
  CHECK(t.tenants[1].name == "bob" && t.tenants[1].retired && t.tenants[1].secret.empty() &&
        t.metrics_tokens[1].empty() && t.find("bob") == -1);
  CHECK(t.tenants[2].name == "ops" && t.tenants[2].retired && t.tenants[2].is_operator);
  CHECK(t.find("ops") == 4 && !t.tenants[4].is_operator && t.find("carol") == 3);
  CHECK(t.find_metrics_token("") == -1 && t.find_metrics_token(metrics_token(kSecret, "bob")) == -1);
  CHECK(change.tenants.size() == 3 && change.tenants[0] == AuthChange::kNewSecret &&
        change.tenants[1] == AuthChange::kGone && change.tenants[2] == AuthChange::kGone);
  CHECK(change.added == 2 && change.gone == 2 && change.new_secrets == 1 && change.anonymous_gone &&
        !t.anonymous);
  CHECK(change.summary() == "2 added, 2 removed, 1 with a new secret, anonymous JOINs no longer allowed");
  // bob back in a later file: his old index again, and his jobs that still run are his own again.
  auto back = parse("tenant bob secret=" + kSecret + "\ntenant alice secret=" + other + "\n", &e);
  CHECK(back.has_value());
  AuthChange again;
  const AuthTable u = merge_reloaded(t, *back, &again);
  CHECK(u.tenants.size() == 5 && u.find("bob") == 1 && !u.tenants[1].retired && u.tenants[0].name == "alice");
  CHECK(u.tenants[3].retired && u.tenants[4].retired && u.find("carol") == -1 && u.find("ops") == -1);
  CHECK(again.tenants[0] == AuthChange::kKept && again.tenants[1] == AuthChange::kKept &&
        again.tenants[2] == AuthChange::kKept && again.tenants[3] == AuthChange::kGone);
  CHECK(again.added == 1 && again.gone == 2 && again.new_secrets == 0 && !again.anonymous_gone);
}

TEST(a_reachable_metrics_host_needs_tokens_or_insecure) {
  SwitchConfig c;
  c.metrics_port = 9101;
  c.metrics_host = "0.0.0.0";
  const std::string why = validate_config(c);
  CHECK(why.find("--metrics-host 0.0.0.0") != std::string::npos &&
        why.find("--auth-file") != std::string::npos && why.find("--insecure") != std::string::npos);
  c.auth_file = "/etc/gradswitch/auth";  // scrapes then need a bearer token
  CHECK(validate_config(c).empty());
  c.auth_file.clear();
  c.insecure = true;
  CHECK(validate_config(c).empty());
}

GS_TEST_MAIN()
