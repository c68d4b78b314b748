/*
 * gradswitch control protocol, version 1: the names a client and the switch exchange over TCP.
 *
 * wire.h defines the data plane's bytes; this header is its counterpart for the control plane
 * (docs/protocol.md section 1 is the specification of both): verbs, keys, reply and error codes,
 * event names, abort reason names and the layout of the optimizer checkpoint blob. The switch
 * (src/switch/control), the worker (src/worker/control.cpp) and the tests build their lines from
 * these names; Python (python/gradswitch/_group.py, local_switch.py) mirrors them and the tests
 * check the mirror. C99 and C++ compatible, no dependencies beyond wire.h.
 *
 * Names are string literals, so that lines can be assembled by literal concatenation:
 * GS_VERB_JOIN " " GS_KEY_JOB "=" is "JOIN job=".
 */
#ifndef GRADSWITCH_CONTROL_H
#define GRADSWITCH_CONTROL_H

#include "gradswitch/wire.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A request or reply line is at most this many bytes, the terminating '\n' included. */
#define GS_CONTROL_MAX_LINE 4096u
#define GS_CONTROL_DEFAULT_PORT 7700u

/* ---- verbs (client -> switch) ---- */
#define GS_VERB_JOIN "JOIN"
#define GS_VERB_LEAVE "LEAVE"
#define GS_VERB_STATUS "STATUS"
#define GS_VERB_STATS "STATS"
#define GS_VERB_JOBS "JOBS"
#define GS_VERB_PING "PING"
/* authentication (docs/protocol.md section 1.5) and the operator's verb */
#define GS_VERB_CHALLENGE "CHALLENGE"
#define GS_VERB_AUTH "AUTH"
#define GS_VERB_ABORT "ABORT"
/* optimizer jobs (docs/protocol.md section 1.3) */
#define GS_VERB_PARAMS "PARAMS"
#define GS_VERB_SETLR "SETLR"
#define GS_VERB_STATE_GET "STATE_GET"
#define GS_VERB_STATE_SET "STATE_SET"

/* ---- replies (switch -> client) ---- */
#define GS_REPLY_OK "OK"
#define GS_REPLY_ERR "ERR"
/* An unsolicited line between two replies (docs/protocol.md section 1.4): "EVENT <kind> key=value ..." */
#define GS_EVENT "EVENT"
#define GS_EVENT_ABORTED "aborted"

/* ---- error codes: "ERR <code> <message>" ---- */
#define GS_ERR_BAD_REQUEST "bad_request"   /* malformed line, unknown verb, missing or invalid key */
#define GS_ERR_TOO_LONG "too_long"         /* line over GS_CONTROL_MAX_LINE; the switch closes */
#define GS_ERR_CONFLICT "conflict"         /* job exists with other parameters or token, rank taken */
#define GS_ERR_STATE "state"               /* verb not valid now (e.g. a second JOIN) */
#define GS_ERR_TIMEOUT "timeout"           /* not every rank joined in time */
#define GS_ERR_NO_RESOURCES "no_resources" /* job table full, not enough memory */
#define GS_ERR_NOT_FOUND "not_found"       /* unknown job, or one this connection may not see */
#define GS_ERR_AUTH "auth"                 /* AUTH failed; the verb needs AUTH, or an operator */

/* ---- keys of JOIN ---- */
#define GS_KEY_JOB "job"
#define GS_KEY_WORLD "world"
#define GS_KEY_RANK "rank"
#define GS_KEY_WIRE "wire"
#define GS_KEY_TOKEN "token"
#define GS_KEY_PORT "port"
/* a JOIN that a leaf switch forwards to its spine (docs/protocol.md section 8) */
#define GS_KEY_LEAF "leaf"   /* 1 */
#define GS_KEY_PEER "peer"   /* the worker's own ip:port */
#define GS_KEY_TYPES "types" /* optional: element types DATA may carry besides the wire and int32 */
/* bounded-time rounds (docs/protocol.md section 3.1): also keys of the JOIN reply */
#define GS_KEY_DEADLINE_US "deadline_us" /* a round closes this long after its first contribution */
#define GS_KEY_QUORUM "quorum"           /* ... once it holds at least this many contributions */
/* optimizer keys of JOIN (docs/protocol.md section 1.3) */
#define GS_KEY_OPTIMIZER "optimizer"
#define GS_KEY_PARAMS "params"
#define GS_KEY_LR "lr"
#define GS_KEY_WEIGHT_DECAY "weight_decay"
#define GS_KEY_AVERAGE "average"
#define GS_KEY_MOMENTUM "momentum"
#define GS_KEY_DAMPENING "dampening"
#define GS_KEY_NESTEROV "nesterov"
#define GS_KEY_BETA1 "beta1"
#define GS_KEY_BETA2 "beta2"
#define GS_KEY_EPS "eps"
#define GS_KEY_EPS_MODE "eps_mode"
#define GS_KEY_LR_DECAY "lr_decay"
#define GS_KEY_INITIAL_ACCUMULATOR "initial_accumulator"

/* ---- keys of the JOIN reply ---- */
#define GS_KEY_JOB_ID "job_id"
#define GS_KEY_KEY "key"
#define GS_KEY_SLOTS "slots"
#define GS_KEY_PAYLOAD "payload"
#define GS_KEY_DATA_PORT "data_port"
#define GS_KEY_THREADS "threads"
#define GS_KEY_PEERS "peers"
#define GS_KEY_CHUNK "chunk"
#define GS_KEY_STATE_BYTES "state_bytes"

/* ---- keys of STATUS (request: job_id, slot, version) and its reply ---- */
#define GS_KEY_SLOT "slot"
#define GS_KEY_VERSION "version"
#define GS_KEY_NAME "name"
#define GS_KEY_STATE "state"
#define GS_KEY_ABORT_REASON "abort_reason"
#define GS_KEY_ABORT_RANK "abort_rank"
#define GS_KEY_IDLE_MS "idle_ms"
#define GS_KEY_RANK_SEQ "rank_seq"
#define GS_KEY_LEFT "left"
/* LEAVE lost=<host:port>: the rank leaves because that switch of its job is gone; STATUS and EVENT aborted
 * carry it back for the rank that aborted the job (rank_left) */
#define GS_KEY_LOST "lost"
#define GS_KEY_SLOT_STATE "slot_state"
#define GS_KEY_SLOT_SEQ "slot_seq"
#define GS_KEY_SLOT_OFFSET "slot_offset"
#define GS_KEY_SEEN "seen"
/* the job's open rounds (a contribution arrived, not every rank's yet) and the oldest of them */
#define GS_KEY_OPEN_ROUNDS "open_rounds"
#define GS_KEY_OLDEST_SLOT "oldest_slot"
#define GS_KEY_OLDEST_VERSION "oldest_version"
#define GS_KEY_OLDEST_SEQ "oldest_seq"
#define GS_KEY_OLDEST_OFFSET "oldest_offset"
#define GS_KEY_OLDEST_AGE_MS "oldest_age_ms" /* since its first contribution */
#define GS_KEY_OLDEST_SEEN "oldest_seen"     /* the ranks that contributed to it */
/* a leaf switch's STATUS, and its EVENT aborted with reason uplink (docs/protocol.md section 8) */
#define GS_KEY_UPLINK "uplink"               /* the spine's ip:port */
#define GS_KEY_MEMBERS "members"             /* the ranks the leaf serves */
#define GS_KEY_UPLINK_REASON "uplink_reason" /* the spine's abort reason, or "lost" */
#define GS_KEY_UPLINK_RANK "uplink_rank"     /* the spine's abort rank */
#define GS_UPLINK_LOST "lost"
/* the two contributions of a GS_ABORT_MISMATCH (STATUS and EVENT aborted), each "held,arriving" */
#define GS_KEY_MISMATCH_SEQ "mismatch_seq"
#define GS_KEY_MISMATCH_OFFSET "mismatch_offset"
#define GS_KEY_MISMATCH_RANKS "mismatch_ranks"
#define GS_KEY_MISMATCH_COUNTS "mismatch_counts"
#define GS_KEY_MISMATCH_LAST "mismatch_last"
#define GS_KEY_MISMATCH_TYPES "mismatch_types"
#define GS_KEY_MISMATCH_SCALES "mismatch_scales"
/* EVENT aborted: job_id, reason, rank, left and the mismatch keys */
#define GS_KEY_REASON "reason"

/* ---- keys of JOBS and STATS replies ---- */
#define GS_KEY_JOBS "jobs"
#define GS_KEY_JOINING "joining"
#define GS_KEY_JOBS_STARTED "jobs_started"
/* an operator's STATS total, with an auth file: its re-reads (SIGHUP) put in force, and refused */
#define GS_KEY_AUTH_RELOADS "auth_reloads"
#define GS_KEY_AUTH_RELOAD_FAILURES "auth_reload_failures"
#define GS_KEY_DROPS "drops"
#define GS_KEY_DROP_PREFIX "drop." /* drop.<reason> */

/* ---- authentication: CHALLENGE -> OK nonce=; AUTH tenant= cnonce= proof= -> OK tenant= role= proof= ---- */
#define GS_KEY_TENANT "tenant"
#define GS_KEY_NONCE "nonce"
#define GS_KEY_CNONCE "cnonce"
#define GS_KEY_PROOF "proof"
#define GS_KEY_ROLE "role"
#define GS_ROLE_TENANT "tenant"
#define GS_ROLE_OPERATOR "operator"
/* proof = HMAC-SHA-256(secret, label "\n" tenant "\n" nonce "\n" cnonce) in lower-case hex */
#define GS_AUTH_CLIENT_LABEL "gradswitch-auth-v1 client"
#define GS_AUTH_SWITCH_LABEL "gradswitch-auth-v1 switch"
/* the bearer token of GET /metrics: HMAC-SHA-256(secret, label "\n" tenant) in lower-case hex */
#define GS_METRICS_TOKEN_LABEL "gradswitch-metrics-v1"
#define GS_TENANT_SEPARATOR "/" /* a tenant's job `name` is shown as "tenant/name" */

/* ---- keys of the optimizer verbs ---- */
#define GS_KEY_OFFSET "offset" /* PARAMS */
#define GS_KEY_COUNT "count"   /* PARAMS */
#define GS_KEY_BYTES "bytes"   /* STATE_SET request, STATE_GET reply */
#define GS_KEY_ALGO "algo"     /* STATE_GET reply */
#define GS_KEY_ARRAYS "arrays" /* STATE_GET reply */
#define GS_KEY_CHUNKS "chunks" /* STATE_GET reply */

/* ---- values ---- */
#define GS_STATE_RUNNING "running"
#define GS_STATE_ABORTED "aborted"
#define GS_STATE_JOINING "joining"
#define GS_NO_RANK "-" /* abort_rank / rank of an abort that names no rank */

/* The name of a gs_abort_reason as STATUS (abort_reason=) and EVENT aborted (reason=) write it;
 * 0 is "none". */
static inline const char* gs_abort_reason_name(uint8_t reason) {
  switch (reason) {
    case 0:
      return "none";
    case GS_ABORT_RANK_LEFT:
      return "rank_left";
    case GS_ABORT_IDLE:
      return "idle";
    case GS_ABORT_SHUTDOWN:
      return "shutdown";
    case GS_ABORT_OPERATOR:
      return "operator";
    case GS_ABORT_MISMATCH:
      return "mismatch";
    case GS_ABORT_UPLINK:
      return "uplink";
    default:
      return "unknown";
  }
}

/* The gs_abort_reason of a name written by gs_abort_reason_name; 0 for "none" and unknown names. */
static inline uint8_t gs_abort_reason_from_name(const char* name) {
  for (uint8_t r = GS_ABORT_RANK_LEFT; r <= GS_ABORT_UPLINK; ++r)
    if (strcmp(name, gs_abort_reason_name(r)) == 0) return r;
  return 0;
}

/* ---- the optimizer checkpoint blob of STATE_GET / STATE_SET (docs/protocol.md section 1.3) ----
 *
 * A 32-byte header, then `arrays` arrays of `params` float32 (the parameters, then the algorithm's
 * state arrays), then `chunks` uint32 step counters. Everything little-endian (the host's order:
 * wire.h refuses big-endian hosts). */
enum gs_optimizer_algo {
  GS_OPT_SGD = 0,
  GS_OPT_ADAGRAD = 1,
  GS_OPT_ADAM = 2,
  GS_OPT_ADAMW = 3,
  GS_OPT_SMORMS3 = 4,
};

#define GS_STATE_MAGIC "GSOPTST1" /* 8 bytes, no terminator in the blob */
#define GS_STATE_HEADER_BYTES 32u

struct gs_state_header {
  char magic[8];     /* GS_STATE_MAGIC */
  uint8_t algo;      /* gs_optimizer_algo */
  uint8_t arrays;    /* 1 + the algorithm's state arrays */
  uint16_t reserved; /* 0 */
  uint32_t chunk;    /* elements per chunk (payload / 4) */
  uint64_t params;   /* parameters */
  uint32_t chunks;   /* ceil(params / chunk) */
  float lr;          /* the learning rate, float32 */
};

GS_STATIC_ASSERT(sizeof(struct gs_state_header) == GS_STATE_HEADER_BYTES, "checkpoint header is 32 bytes");
GS_STATIC_ASSERT(offsetof(struct gs_state_header, algo) == 8, "algo offset");
GS_STATIC_ASSERT(offsetof(struct gs_state_header, arrays) == 9, "arrays offset");
GS_STATIC_ASSERT(offsetof(struct gs_state_header, reserved) == 10, "reserved offset");
GS_STATIC_ASSERT(offsetof(struct gs_state_header, chunk) == 12, "chunk offset");
GS_STATIC_ASSERT(offsetof(struct gs_state_header, params) == 16, "params offset");
GS_STATIC_ASSERT(offsetof(struct gs_state_header, chunks) == 24, "chunks offset");
GS_STATIC_ASSERT(offsetof(struct gs_state_header, lr) == 28, "lr offset");
GS_STATIC_ASSERT(sizeof(float) == 4, "lr is a float32");

/* Bytes of the whole blob. */
static inline uint64_t gs_state_blob_bytes(const struct gs_state_header* h) {
  return GS_STATE_HEADER_BYTES + (uint64_t)h->arrays * h->params * 4u + (uint64_t)h->chunks * 4u;
}

#ifdef __cplusplus
}
#endif

#endif /* GRADSWITCH_CONTROL_H */
