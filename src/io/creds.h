/*
 * creds.h -- the S3 credential chain: where the keys that sign requests come
 * from, and their refresh when they expire. Internal to src/io (remote.c).
 *
 * The chain, first that gives credentials wins (docs/remote.md, "Credentials"):
 *   1. AWS_ACCESS_KEY_ID + AWS_SECRET_ACCESS_KEY (+ AWS_SESSION_TOKEN);
 *   2. AWS_WEB_IDENTITY_TOKEN_FILE + AWS_ROLE_ARN: STS AssumeRoleWithWebIdentity;
 *   3. the profile (AWS_PROFILE, else "default") in the shared credentials
 *      file, then the config file (keys, or role_arn + web_identity_token_file);
 *   4. the container endpoint (AWS_CONTAINER_CREDENTIALS_RELATIVE_URI or
 *      _FULL_URI);
 *   5. the EC2 instance metadata service (IMDSv2), unless
 *      AWS_EC2_METADATA_DISABLED=true;
 *   6. none: requests go unsigned (a public bucket).
 * A profile named by AWS_PROFILE that neither file has is an error, as is a
 * half-given source (a key id without a secret, a role without a token file).
 *
 * Credentials are held as immutable, reference-counted snapshots. A refresh
 * reads the chain again (network I/O, with no lock held) and swaps in a new
 * snapshot under the lock; a request signed with an older one keeps its
 * snapshot until it releases it. Every function may be called from any
 * thread; stk__creds_refresh blocks on the network (bounded by short
 * timeouts, and cut short by stk__creds_cancel). The chain's lock is
 * innermost: it is held only to copy a pointer or count a reference, and no
 * other lock is taken under it.
 *
 * No message written here contains a secret, a session token or a web
 * identity token.
 */
#ifndef STK_IO_CREDS_H
#define STK_IO_CREDS_H

#include "internal.h"

#include <stdbool.h>
#include <stdint.h>

typedef struct stk__creds stk__creds;

/* One set of credentials; read-only once published. */
typedef struct stk__cred {
    char *key_id, *secret, *token; /* token NULL: long-term keys */
    int64_t expires;               /* Unix time, 0 when the source gives none */
    uint64_t gen;                  /* 1 for the first set, +1 per refresh that changed it */
    const char *source;            /* static text: "environment", "web identity", ... */
    unsigned refs;                 /* under the chain's lock */
} stk__cred;

/* Resolves the region (region_opt, else AWS_REGION, AWS_DEFAULT_REGION, the
 * profile's region, else us-east-1) and reads the chain once. STK_EINVAL with
 * the reason in err (a profile not found, a half-given source, a provider that
 * answered with an error), STK_ENOMEM. Finding no credentials is not an error:
 * stk__creds_acquire then returns NULL (unsigned requests). */
int stk__creds_open(stk__creds **out, const char *region_opt, char *err, size_t errlen);
/* Cancels a refresh in progress and makes later ones fail at once. */
void stk__creds_cancel(stk__creds *c);
/* Frees c (the last snapshot is wiped). Snapshots must be released first. */
void stk__creds_close(stk__creds *c);

const char *stk__creds_region(const stk__creds *c);
/* The current snapshot, referenced (release it), or NULL when unsigned. */
stk__cred *stk__creds_acquire(stk__creds *c);
void stk__creds_release(stk__creds *c, stk__cred *k);

/* Reads the chain again when the snapshot of generation gen is still the
 * current one (else another caller refreshed already: STK_OK at once).
 * force: a request was refused for an expired token (tried at most once a
 * second); else only when the current credentials expire within 5 minutes
 * (tried at most every 10 s). A failed refresh keeps the old credentials and
 * returns STK_EIO with the reason in err. Blocks on the network. */
int stk__creds_refresh(stk__creds *c, uint64_t gen, bool force, char *err, size_t errlen);
/* Would stk__creds_refresh(c, current, false) read the chain now? Cheap. */
bool stk__creds_due(stk__creds *c);

/* Does this S3/STS error body (XML) say the token expired (Code ExpiredToken,
 * ExpiredTokenException, TokenRefreshRequired)? */
bool stk__creds_expired_error(const char *body);

/* ---- Pieces shared with tests ------------------------------------------- */
/* Copies the JSON string value of top-level key in the object body[0..len)
 * into out (n bytes). 1 found, 0 absent, -1 not a well-formed object or a
 * value that does not fit or is not a string. */
int stk__json_string(const char *body, size_t len, const char *key, char *out, size_t n);
/* Parses an ISO 8601 UTC time ("2026-11-24T23:40:00Z", fractions and
 * "+00:00" allowed) into Unix seconds; -1 when malformed. */
int64_t stk__iso8601(const char *s);

#endif
