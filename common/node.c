/*
 * node.c: one connection to one Redis server (redis_conn.c) on a libuv
 * loop (the agent's I/O thread, the aggregator's main loop). Every command
 * written in one turn of the loop goes out in one write, so calls from
 * many requests share round trips (automatic pipelining); each such write
 * is counted as a batch. Replies come in the order of the commands: each
 * command sent leaves an entry in a queue that says what its reply is for
 * (a call, a WAIT, a step of the handshake), so a call costs no callback
 * object of its own.
 *
 * States: DOWN (waiting to reconnect: calls fail at once, so a gateway is
 * not held up while Redis is known to be away), CONNECTING and LOADING
 * (calls wait, to be sent once the scripts are loaded), READY, CLOSED.
 * The scripts are loaded on every connection: a restarted Redis or a
 * promoted replica has none. A NOSCRIPT or "function not found" reply (a
 * SCRIPT FLUSH or FUNCTION FLUSH behind our back) reloads them and resends
 * the calls that failed, so no check is lost to it.
 *
 * The handshake needs no privilege a least-privilege ACL user lacks: HELLO
 * (@fast @connection) authenticates, names the client and answers the
 * server's version and role in one round trip, where INFO is @dangerous
 * (Redis before 6 has no HELLO and no ACL: it gets AUTH and INFO). A
 * refusal of any command rl sends (NOPERM, WRONGPASS, an unknown command)
 * is logged once per command, with the server's own reason. With
 * `scripts: auto`, a server that refuses FUNCTION LOAD or FCALL (an ACL,
 * a managed service) gets the same bodies by SCRIPT LOAD and EVALSHA:
 * the buckets are the same keys and values either way (scripts.c).
 */
#include "node.h"

#include "redis_conn.h"
#include "sentinel.h"

#include <hiredis/hiredis.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CONNECT_TIMEOUT_MS 1000
#define BACKOFF_FIRST_MS 25
#define BACKOFF_MAX_MS 500
#define WATCHDOG_EVERY_MS 100
/* More calls than this in flight and new ones fail at once rather than
 * pile up in memory behind a store that is not keeping up. */
#define MAX_IN_FLIGHT 100000
/* A call is resent after a script reload at most this many times. */
#define MAX_ATTEMPTS 3
/* How often Redis's clock is read again while connected. */
#define CLOCK_EVERY_MS 5000
/* Calls of up to this many bytes (a bucket call; a three-rule multi call
 * whose keys take up to 300 bytes) are recycled: an answered one waits in
 * the node for the next call instead of going back to malloc, up to
 * CALLS_KEPT of them (192 KiB), more than the depth a busy agent keeps in
 * flight. perf put malloc and free at a sixth of an agent at 64 checks in
 * flight. */
#define CALL_BYTES 768
#define CALLS_KEPT 256
/* Commands whose refusal is logged once each (note_refusal). */
#define REFUSALS_MAX 16
#define COMMAND_NAME_MAX 32

typedef enum state { DOWN, CONNECTING, LOADING, READY, CLOSED } state;

/* What a reply answers, in the order the commands went. */
typedef enum reply_to {
    TO_CALL, TO_WAIT, TO_LOAD, TO_HELLO, TO_AUTH, TO_SELECT, TO_INFO,
    TO_TIME, TO_NOTHING
} reply_to;

typedef struct expected {
    reply_to to;
    int script;  /* TO_LOAD: which */
    void *ptr;   /* TO_CALL: the call; TO_WAIT: its group */
} expected;

typedef struct call {
    struct call *next;
    redisReply *stash;  /* the script's answer, held until WAIT answers */
    rl_node *store;
    bool recycled;      /* a CALL_BYTES block, kept for reuse once done */
    int script;         /* or RL_NODE_RAW, RL_NODE_RAW_WRITE */
    bool asking;        /* ASKING first (a cluster ASK redirection) */
    bool by_function;   /* last sent as FCALL (else EVALSHA or raw) */
    int argc;
    rl_node_fn fn;
    void *arg;
    int attempts;
    const char **argv;  /* point into data */
    size_t *lens;
    char data[];
} call;

struct rl_node {
    uv_loop_t *loop;
    const rl_store_config *cfg;
    rl_redis_tls *tls;
    rl_endpoint ep;
    rl_node_batches *batches;  /* shared with the other nodes, or NULL */
    int slot;                  /* this node's in batches->shards, or -1 */
    uint64_t batch_turn;       /* the turn of its last batch; UINT64_MAX: none */
    struct wait_group *open_wait; /* the WAIT this turn's answers join */
    const rl_script_set *scripts;
    const rl_logger *log;
    rl_redis_conn *conn;
    /* What the replies due on conn answer: a ring, grown (never shrunk)
     * to the depth in flight. */
    expected *due;
    size_t due_cap, due_head, due_len;
    state state;
    bool use_functions;
    char sha[RL_STORE_SCRIPTS_MAX][41]; /* EVALSHA digests by script */
    uint64_t clock_offset_ms;  /* Redis's ms minus the loop's; 0: unknown */
    uint64_t clock_read_at;    /* loop ms of the last TIME */
    int loads_pending;       /* replies still due before READY */
    call *waiting, **waiting_tail;
    size_t in_flight;        /* calls sent, not yet answered */
    uint64_t last_progress;  /* ms of the last reply, or of going busy */
    uint64_t loading_since;  /* ms the handshake or a reload began */
    uint64_t watchdog_ran;   /* ms the watchdog last ran */
    uint32_t backoff_ms;
    uv_timer_t retry_timer;  /* reconnect after backoff; connect timeout */
    uv_timer_t watchdog;     /* a connection that stopped answering */
    int open_handles;
    call *spare;             /* answered CALL_BYTES blocks, linked by next */
    int n_spare;
    /* The server refused functions (FUNCTION LOAD or FCALL) under
     * scripts: auto: this node loads and calls scripts from then on. */
    bool functions_refused;
    char refused[REFUSALS_MAX][COMMAND_NAME_MAX]; /* logged once each */
    int n_refused;
    char down_reason[1024];  /* the last drop's, logged once until ready */
    /* store.sentinel: asked for the primary before every connection. */
    rl_sentinel *sentinel;
    bool locating;
};

static void connect_now(rl_node *s);
static void send_call(rl_node *s, call *c);
static void went_down(rl_node *s, const char *why);
static void lose(rl_node *s, const char *why);

static uint64_t now_ms(const rl_node *s)
{
    return uv_now(s->loop);
}

/* A call's block back to the node's spares, or to the heap. */
static void release_call(call *c)
{
    rl_node *s = c->store;
    if (!c->recycled || s->n_spare >= CALLS_KEPT) {
        free(c);
        return;
    }
    c->next = s->spare;
    s->spare = c;
    s->n_spare++;
}

static void finish(call *c, const redisReply *reply, const char *error)
{
    c->fn(c->arg, reply, error);
    release_call(c);
}

static void wait_for_ready(rl_node *s, call *c)
{
    c->next = NULL;
    *s->waiting_tail = c;
    s->waiting_tail = &c->next;
}

/* Fails every call that waits to be sent. */
static void fail_waiting(rl_node *s, const char *why)
{
    call *c = s->waiting;
    s->waiting = NULL;
    s->waiting_tail = &s->waiting;
    while (c != NULL) {
        call *next = c->next;
        finish(c, NULL, why);
        c = next;
    }
}

static void send_waiting(rl_node *s)
{
    call *c = s->waiting;
    s->waiting = NULL;
    s->waiting_tail = &s->waiting;
    while (c != NULL) {
        call *next = c->next;
        send_call(s, c);
        c = next;
    }
}

static void retry_fired(uv_timer_t *t)
{
    rl_node *s = t->data;
    if (s->state == DOWN) {
        connect_now(s);
    } else if (s->state == CONNECTING && s->conn != NULL && !s->locating) {
        rl_log(s->log, RL_LOG_WARN, "store_connect_timeout",
               "addr=%s:%u after_ms=%d", s->ep.host,
               s->ep.port, CONNECT_TIMEOUT_MS);
        lose(s, "store connect timed out");
    }
}

/* The connection is gone (or never came): fail what waits, retry later. */
static void went_down(rl_node *s, const char *why)
{
    if (why != s->down_reason)
        snprintf(s->down_reason, sizeof s->down_reason, "%s", why);
    s->in_flight = 0;
    if (s->state == CLOSED)
        return;
    s->state = DOWN;
    fail_waiting(s, why);
    uv_timer_start(&s->retry_timer, retry_fired, s->backoff_ms, 0);
    s->backoff_ms = s->backoff_ms * 2 > BACKOFF_MAX_MS ? BACKOFF_MAX_MS
                                                       : s->backoff_ms * 2;
}

/* Closed at once, not after the replies due: a stalled server never sends
 * them. The calls in flight fail, and a new connection is scheduled. */
static void drop_connection(rl_node *s, const char *event, const char *why)
{
    /* A server that refuses every handshake alike is said once, not at
     * every reconnect. */
    if (strcmp(s->down_reason, why) != 0) {
        rl_log(s->log, RL_LOG_WARN, event, "addr=%s:%u reason=\"%s\"",
               s->ep.host, s->ep.port, why);
        snprintf(s->down_reason, sizeof s->down_reason, "%s", why);
    }
    lose(s, why);
}

/* An error reply that says the server will not run the command for us,
 * rather than that the call failed. */
static bool is_refusal(const char *reply)
{
    static const char *const refusals[] = {
        "NOPERM", "WRONGPASS", "NOAUTH", "ERR unknown command",
        "ERR unknown subcommand", "ERR unknown or unsupported subcommand",
        "ERR The user executing the script can't run"};
    for (size_t i = 0; i < sizeof refusals / sizeof *refusals; i++) {
        if (strncmp(reply, refusals[i], strlen(refusals[i])) == 0)
            return true;
    }
    return false;
}

/* Logs a refusal of command once in the node's life, with the server's
 * reason (which names no secret: WRONGPASS does not echo the password).
 * Returns whether reply is a refusal. */
static bool note_refusal(rl_node *s, const char *command, const char *reply)
{
    if (!is_refusal(reply))
        return false;
    for (int i = 0; i < s->n_refused; i++) {
        if (strcmp(s->refused[i], command) == 0)
            return true;
    }
    if (s->n_refused < REFUSALS_MAX)
        snprintf(s->refused[s->n_refused++], COMMAND_NAME_MAX, "%s",
                 command);
    rl_log(s->log, RL_LOG_WARN, "store_command_refused",
           "addr=%s:%u command=%s reason=\"%s\"", s->ep.host, s->ep.port,
           command, reply);
    return true;
}

static void became_ready(rl_node *s)
{
    s->state = READY;
    s->backoff_ms = BACKOFF_FIRST_MS;
    s->down_reason[0] = '\0';
    rl_log(s->log, RL_LOG_INFO, "store_ready", "addr=%s:%u scripts=%s "
           "tls=%s", s->ep.host, s->ep.port,
           s->use_functions ? "function" : "eval",
           rl_redis_conn_tls(s->conn));
    send_waiting(s);
}

/* --- Sending, and what each reply answers ------------------------------ */

/* Room in the ring for two more entries (a call and its ASKING). */
static int due_reserve(rl_node *s)
{
    if (s->due_len + 2 <= s->due_cap)
        return 0;
    size_t cap = s->due_cap > 0 ? s->due_cap * 2 : 64;
    expected *due = malloc(cap * sizeof *due);
    if (due == NULL)
        return -1;
    for (size_t i = 0; i < s->due_len; i++)
        due[i] = s->due[(s->due_head + i) % s->due_cap];
    free(s->due);
    s->due = due;
    s->due_cap = cap;
    s->due_head = 0;
    return 0;
}

static void due_push(rl_node *s, reply_to to, int script, void *ptr)
{
    s->due[(s->due_head + s->due_len++) % s->due_cap] =
        (expected){.to = to, .script = script, .ptr = ptr};
}

static expected due_pop(rl_node *s)
{
    expected e = s->due[s->due_head];
    s->due_head = (s->due_head + 1) % s->due_cap;
    s->due_len--;
    return e;
}

/* Sends a command of NUL-terminated arguments (argv ends with NULL) whose
 * reply goes to `to`. Returns -1 when it cannot be sent (out of memory, no
 * connection). */
static int ask(rl_node *s, reply_to to, int script, void *ptr,
               const char *const *argv)
{
    size_t lens[16];
    int argc = 0;
    while (argv[argc] != NULL && argc < 16) {
        lens[argc] = strlen(argv[argc]);
        argc++;
    }
    if (s->conn == NULL || due_reserve(s) != 0
        || rl_redis_conn_command(s->conn, argc, argv, lens) != 0)
        return -1;
    due_push(s, to, script, ptr);
    return 0;
}

static void load_scripts(rl_node *s);

/* Under scripts: auto, functions refused (FUNCTION LOAD or FCALL) move
 * this node to SCRIPT LOAD and EVALSHA for good: same bodies, same
 * buckets. False when the config asks for functions only. */
static bool fall_back_to_scripts(rl_node *s, const char *reply)
{
    if (s->cfg->scripts != RL_SCRIPTS_AUTO || s->scripts == NULL)
        return false;
    if (!s->functions_refused)
        rl_log(s->log, RL_LOG_WARN, "store_functions_refused",
               "addr=%s:%u reason=\"%s\" using=evalsha", s->ep.host,
               s->ep.port, reply);
    s->functions_refused = true;
    s->use_functions = false;
    return true;
}

static void on_load_reply(rl_node *s, int script, const redisReply *reply)
{
    if (s->state != LOADING)
        return;
    if (reply->type == REDIS_REPLY_ERROR) {
        bool refused = note_refusal(s, s->use_functions ? "FUNCTION LOAD"
                                                        : "SCRIPT LOAD",
                                    reply->str);
        if (refused && s->use_functions
            && fall_back_to_scripts(s, reply->str)) {
            load_scripts(s);
            return;
        }
        drop_connection(s, "store_load_failed", reply->str);
        return;
    }
    if (!s->use_functions && reply->type == REDIS_REPLY_STRING
        && reply->len == 40)
        memcpy(s->sha[script], reply->str, 41);
    if (--s->loads_pending == 0)
        became_ready(s);
}

static void load_scripts(rl_node *s)
{
    s->state = LOADING;
    s->loading_since = now_ms(s);
    if (s->use_functions) {
        s->loads_pending = 1;
        if (ask(s, TO_LOAD, 0, NULL,
                (const char *[]){"FUNCTION", "LOAD", "REPLACE",
                                 s->scripts->library, NULL})
            != 0)
            drop_connection(s, "store_load_failed", "out of memory");
        return;
    }
    s->loads_pending = s->scripts->n;
    for (int i = 0; i < s->scripts->n; i++) {
        if (ask(s, TO_LOAD, i, NULL,
                (const char *[]){"SCRIPT", "LOAD", s->scripts->sources[i],
                                 NULL})
            != 0) {
            drop_connection(s, "store_load_failed", "out of memory");
            return;
        }
    }
}

/* TIME answers [seconds, microseconds]. */
static void on_time_reply(rl_node *s, const redisReply *reply)
{
    if (reply->type == REDIS_REPLY_ERROR)
        note_refusal(s, "TIME", reply->str);
    if (reply->type != REDIS_REPLY_ARRAY || reply->elements != 2)
        return;
    uint64_t ms = strtoull(reply->element[0]->str, NULL, 10) * 1000
                  + strtoull(reply->element[1]->str, NULL, 10) / 1000;
    s->clock_read_at = now_ms(s);
    s->clock_offset_ms = ms - s->clock_read_at;
}

static void read_clock(rl_node *s)
{
    s->clock_read_at = now_ms(s);
    ask(s, TO_TIME, 0, NULL, (const char *[]){"TIME", NULL});
}

/* What the handshake learnt decides how scripts are called: functions on
 * Redis 7 or later (scripts: auto), unless this node saw them refused. */
static void handshake_done(rl_node *s, int major)
{
    s->use_functions = s->cfg->scripts == RL_SCRIPTS_FUNCTION
                       || (s->cfg->scripts == RL_SCRIPTS_AUTO && major >= 7
                           && !s->functions_refused);
    if (s->use_functions && major < 7) {
        drop_connection(s, "store_handshake_failed", "scripts: function "
                        "needs Redis 7 or later");
        return;
    }
    read_clock(s);
    if (s->scripts == NULL)
        became_ready(s);
    else
        load_scripts(s);
}

/* A handshake command's error ends the handshake, said once. */
static bool handshake_refused(rl_node *s, const char *command,
                              const redisReply *reply)
{
    if (reply->type != REDIS_REPLY_ERROR)
        return false;
    note_refusal(s, command, reply->str);
    char why[256];
    snprintf(why, sizeof why, "%s: %s", command, reply->str);
    drop_connection(s, "store_handshake_failed", why);
    return true;
}

/* "redis_version:7.0.15" -> 7 */
static int major_version(const char *info)
{
    const char *v = strstr(info, "redis_version:");
    return v != NULL ? atoi(v + strlen("redis_version:")) : 0;
}

/* Redis before 6 (no HELLO, no ACL): INFO gives the version. */
static void on_info_reply(rl_node *s, const redisReply *reply)
{
    if (handshake_refused(s, "INFO", reply))
        return;
    if (reply->type != REDIS_REPLY_STRING) {
        drop_connection(s, "store_handshake_failed", "INFO failed");
        return;
    }
    handshake_done(s, major_version(reply->str));
}

/* The value of field in HELLO's answer (RESP2: a flat list of names and
 * values), or NULL. */
static const redisReply *hello_field(const redisReply *r, const char *field)
{
    for (size_t i = 0; i + 1 < r->elements; i += 2) {
        const redisReply *k = r->element[i];
        if (k->type == REDIS_REPLY_STRING && strcmp(k->str, field) == 0)
            return r->element[i + 1];
    }
    return NULL;
}

static int select_db(rl_node *s)
{
    char db[16];
    snprintf(db, sizeof db, "%u", s->cfg->db);
    return ask(s, TO_SELECT, 0, NULL, (const char *[]){"SELECT", db, NULL});
}

static void legacy_handshake(rl_node *s)
{
    const rl_store_config *cfg = s->cfg;
    if ((cfg->password != NULL
         && ask(s, TO_AUTH, 0, NULL,
                (const char *[]){"AUTH", cfg->password, NULL}) != 0)
        || (cfg->db != 0 && select_db(s) != 0)
        || ask(s, TO_INFO, 0, NULL, (const char *[]){"INFO", "server", NULL})
               != 0)
        drop_connection(s, "store_handshake_failed", "out of memory");
}

/* HELLO's answer: the version, and a role that must be master (a replica
 * refuses writes, and rl never writes to one). */
static void on_hello_reply(rl_node *s, const redisReply *reply)
{
    if (reply->type == REDIS_REPLY_ERROR
        && strncmp(reply->str, "ERR unknown command", 19) == 0
        && s->cfg->username == NULL) {
        legacy_handshake(s);
        return;
    }
    if (handshake_refused(s, "HELLO", reply))
        return;
    const redisReply *version = reply->type == REDIS_REPLY_ARRAY
                                    ? hello_field(reply, "version")
                                    : NULL;
    const redisReply *role = reply->type == REDIS_REPLY_ARRAY
                                 ? hello_field(reply, "role")
                                 : NULL;
    if (version == NULL || version->type != REDIS_REPLY_STRING) {
        drop_connection(s, "store_handshake_failed", "HELLO answered no "
                        "version");
        return;
    }
    if (role != NULL && role->type == REDIS_REPLY_STRING
        && strcmp(role->str, "master") != 0) {
        char why[128];
        snprintf(why, sizeof why, "the server is a replica (role %.32s): "
                 "rl writes to primaries only", role->str);
        drop_connection(s, "store_handshake_failed", why);
        return;
    }
    if (s->cfg->db != 0 && select_db(s) != 0) {
        drop_connection(s, "store_handshake_failed", "out of memory");
        return;
    }
    handshake_done(s, atoi(version->str));
}

/* The name the connection shows in CLIENT LIST: rl, the program and its
 * process, e.g. rl:rl-gateway:4242 (no spaces: SETNAME refuses them). */
static void client_name(char *out, size_t cap)
{
    char comm[32] = "";
    FILE *f = fopen("/proc/self/comm", "r");
    if (f != NULL) {
        if (fgets(comm, sizeof comm, f) == NULL)
            comm[0] = '\0';
        fclose(f);
    }
    for (char *p = comm; *p != '\0'; p++) {
        if (*p == '\n') {
            *p = '\0';
            break;
        }
        if (!(*p >= 'a' && *p <= 'z') && !(*p >= 'A' && *p <= 'Z')
            && !(*p >= '0' && *p <= '9') && *p != '-' && *p != '_'
            && *p != '.')
            *p = '_';
    }
    snprintf(out, cap, "rl:%s:%ld", comm[0] != '\0' ? comm : "librl",
             (long)getpid());
}

/* HELLO 2 keeps RESP2 replies; AUTH in it takes "default" as the user of
 * a password alone (requirepass), as AUTH with one argument does. */
static void send_hello(rl_node *s)
{
    const rl_store_config *cfg = s->cfg;
    char name[64];
    client_name(name, sizeof name);
    int rc = cfg->password != NULL
                 ? ask(s, TO_HELLO, 0, NULL,
                       (const char *[]){"HELLO", "2", "AUTH",
                                        cfg->username != NULL
                                            ? cfg->username
                                            : "default",
                                        cfg->password, "SETNAME", name,
                                        NULL})
                 : ask(s, TO_HELLO, 0, NULL,
                       (const char *[]){"HELLO", "2", "SETNAME", name,
                                        NULL});
    if (rc != 0)
        drop_connection(s, "store_handshake_failed", "out of memory");
}

static void on_connected(void *arg)
{
    rl_node *s = arg;
    uv_timer_stop(&s->retry_timer);
    s->state = LOADING;
    s->loading_since = now_ms(s);
    send_hello(s);
}

static void on_lost(void *arg, const char *why)
{
    rl_node *s = arg;
    /* Said once per reason, not at every attempt to reconnect. */
    if (s->state == CONNECTING) {
        if (strcmp(s->down_reason, why) != 0)
            rl_log(s->log, RL_LOG_WARN, "store_connect_failed",
                   "addr=%s:%u reason=\"%s\"", s->ep.host, s->ep.port, why);
        uv_timer_stop(&s->retry_timer);
    }
    lose(s, why);
}

static void on_reply(void *arg, redisReply *reply);

static const rl_redis_conn_events conn_events = {
    .connected = on_connected, .reply = on_reply, .lost = on_lost};

static void connect_to_primary(rl_node *s);

/* A sentinel named the primary (or none could): connect to it. */
static void on_located(void *arg, const rl_endpoint *primary,
                       const char *error)
{
    rl_node *s = arg;
    s->locating = false;
    if (s->state != CONNECTING)
        return;
    uv_timer_stop(&s->retry_timer);
    if (primary == NULL) {
        if (strcmp(s->down_reason, error) != 0)
            rl_log(s->log, RL_LOG_WARN, "store_sentinel_failed",
                   "master=%s reason=\"%s\"", s->cfg->sentinel.master,
                   error);
        went_down(s, error);
        return;
    }
    if (primary->port != s->ep.port || strcmp(primary->host, s->ep.host)) {
        rl_log(s->log, RL_LOG_INFO, "store_master", "master=%s addr=%s:%u",
               s->cfg->sentinel.master, primary->host, primary->port);
        s->ep = *primary;
        if (s->batches != NULL)
            s->slot = rl_node_batches_slot(s->batches, primary);
    }
    connect_to_primary(s);
}

/* The master moved (+switch-master): reconnect, asking again, before the
 * old primary answers READONLY. */
static void on_master_moved(void *arg)
{
    rl_node *s = arg;
    if (s->conn != NULL && s->state != CLOSED)
        drop_connection(s, "store_master_moved", "a sentinel announced a "
                        "new master");
}

static void connect_now(rl_node *s)
{
    if (s->sentinel == NULL) {
        connect_to_primary(s);
        return;
    }
    s->state = CONNECTING;
    s->locating = true;
    rl_sentinel_locate(s->sentinel, on_located, s);
}

static void connect_to_primary(rl_node *s)
{
    s->state = CONNECTING;
    s->conn = rl_redis_conn_open(s->loop, &s->ep, s->tls, &conn_events, s);
    if (s->conn == NULL) {
        went_down(s, "out of memory");
        return;
    }
    if (s->state == CONNECTING)
        uv_timer_start(&s->retry_timer, retry_fired, CONNECT_TIMEOUT_MS, 0);
}

/* The scripts are gone from the server (flushed, or a restart the
 * connection did not notice): reload them, and resend c once they are. */
static bool scripts_missing(const redisReply *r)
{
    return strncmp(r->str, "NOSCRIPT", 8) == 0
           || strstr(r->str, "Function not found") != NULL;
}

/* The calls whose answers arrived in one turn of the loop share one WAIT:
 * one per shard per batch of replies. */
typedef struct wait_group {
    call *calls;       /* linked by next: answered calls are in no list */
    uint64_t turn;
} wait_group;

/* WAIT's answer (how many replicas have the write) does not change the
 * calls': the writes are done either way; WAIT only narrows the window in
 * which a failover can lose them. reply NULL: the connection went (and
 * in_flight with it). */
static void on_wait_reply(rl_node *s, wait_group *g, const redisReply *reply)
{
    if (reply != NULL) {
        s->in_flight--;
        s->last_progress = now_ms(s);
        if (reply->type == REDIS_REPLY_ERROR)
            note_refusal(s, "WAIT", reply->str);
    }
    if (s->open_wait == g)
        s->open_wait = NULL;
    call *c = g->calls;
    free(g);
    while (c != NULL) {
        call *next = c->next;
        redisReply *stash = c->stash;
        finish(c, stash, NULL);
        freeReplyObject(stash);
        c = next;
    }
}

/* With store.wait_replicas, a script's answer waits for WAIT: the call
 * keeps the reply. */
static bool held_for_wait(rl_node *s, call *c, redisReply *reply)
{
    if (s->cfg->wait_replicas == 0 || c->script == RL_NODE_RAW
        || s->state == CLOSED || s->conn == NULL)
        return false;
    uint64_t turn = s->batches != NULL ? s->batches->turn : 0;
    wait_group *g = s->open_wait;
    if (g == NULL || s->batches == NULL || g->turn != turn) {
        /* Half the deadline: the answer still arrives in time when the
         * replicas are slow. */
        unsigned wait_ms = s->cfg->timeout_ms / 2 > 0 ? s->cfg->timeout_ms / 2
                                                      : 1;
        char replicas[16], ms[16];
        snprintf(replicas, sizeof replicas, "%u", s->cfg->wait_replicas);
        snprintf(ms, sizeof ms, "%u", wait_ms);
        g = calloc(1, sizeof *g);
        if (g == NULL
            || ask(s, TO_WAIT, 0, g,
                   (const char *[]){"WAIT", replicas, ms, NULL}) != 0) {
            free(g);
            return false;
        }
        g->turn = turn;
        s->open_wait = g;
        s->in_flight++;
    }
    c->stash = reply;
    c->next = g->calls;
    g->calls = c;
    return true;
}

/* The command a call was sent as, for a refusal's log line. */
static const char *command_of(const call *c)
{
    if (c->script >= 0)
        return c->by_function ? "FCALL" : "EVALSHA";
    return c->argv[2];
}

/* Returns whether the call kept reply. */
static bool on_call_reply(rl_node *s, call *c, redisReply *reply)
{
    s->in_flight--;
    s->last_progress = now_ms(s);
    bool refused = reply->type == REDIS_REPLY_ERROR
                   && note_refusal(s, command_of(c), reply->str);
    if (reply->type == REDIS_REPLY_ERROR && c->attempts < MAX_ATTEMPTS
        && s->state != CLOSED && strncmp(reply->str, "READONLY", 8) == 0) {
        /* A replica now (a failover demoted it): nothing was written.
         * Reconnect, to the primary the sentinels name, and send the call
         * again there. */
        wait_for_ready(s, c);
        if (s->state == READY)
            drop_connection(s, "store_readonly", reply->str);
    } else if (reply->type == REDIS_REPLY_ERROR && c->script >= 0
        && c->attempts < MAX_ATTEMPTS && s->state != CLOSED
        && (scripts_missing(reply)
            || (refused && c->by_function
                && fall_back_to_scripts(s, reply->str)))) {
        if (s->state == READY) {
            if (!refused)
                rl_log(s->log, RL_LOG_WARN, "store_scripts_missing",
                       "addr=%s:%u reason=\"%s\"", s->ep.host,
                       s->ep.port, reply->str);
            load_scripts(s);
        }
        wait_for_ready(s, c);
    } else if (reply->type == REDIS_REPLY_ERROR) {
        finish(c, NULL, reply->str);
    } else if (held_for_wait(s, c, reply)) {
        return true;
    } else {
        finish(c, reply, NULL);
    }
    return false;
}

/* A reply from the connection, to what its entry in the ring says. */
static void on_reply(void *arg, redisReply *reply)
{
    rl_node *s = arg;
    if (s->due_len == 0) {
        freeReplyObject(reply);
        drop_connection(s, "store_protocol_error", "a reply to no command");
        return;
    }
    expected e = due_pop(s);
    bool kept = false;
    bool handshake = s->state == LOADING;
    switch (e.to) {
    case TO_CALL: kept = on_call_reply(s, e.ptr, reply); break;
    case TO_WAIT: on_wait_reply(s, e.ptr, reply); break;
    case TO_LOAD: on_load_reply(s, e.script, reply); break;
    case TO_TIME: on_time_reply(s, reply); break;
    case TO_HELLO: if (handshake) on_hello_reply(s, reply); break;
    case TO_INFO: if (handshake) on_info_reply(s, reply); break;
    case TO_AUTH: if (handshake) handshake_refused(s, "AUTH", reply); break;
    case TO_SELECT:
        if (handshake)
            handshake_refused(s, "SELECT", reply);
        break;
    case TO_NOTHING: break;
    }
    if (!kept)
        freeReplyObject(reply);
}

/* The replies due on a connection that is gone never come: the calls fail,
 * and the calls a WAIT held get their answers (they were written). */
static void fail_due(rl_node *s)
{
    while (s->due_len > 0) {
        expected e = due_pop(s);
        if (e.to == TO_CALL)
            finish(e.ptr, NULL, "store connection lost");
        else if (e.to == TO_WAIT)
            on_wait_reply(s, e.ptr, NULL);
    }
}

/* The connection is gone (lost, dropped, timed out): what was sent on it
 * fails, and the node waits to connect again. A handshake the server
 * refused gives the waiting calls its reason. */
static void lose(rl_node *s, const char *why)
{
    if (s->conn == NULL)
        return;
    bool loading = s->state == LOADING;
    bool was_up = loading || s->state == READY;
    rl_redis_conn_close(s->conn);
    s->conn = NULL;
    /* A handshake refused alike at every reconnect (a client certificate
     * the server does not take, which TLS 1.3 says after the handshake)
     * is said once. */
    if (was_up && !(loading && strcmp(s->down_reason, why) == 0))
        rl_log(s->log, RL_LOG_WARN, "store_disconnected",
               "addr=%s:%u reason=\"%s\"", s->ep.host, s->ep.port, why);
    went_down(s, loading || !was_up ? why : "store connection lost");
    fail_due(s);
}

/* Counts a batch the first time this node is written to in a turn of the
 * loop: everything queued in one turn goes out in one write. */
static void count_batch(rl_node *s)
{
    rl_node_batches *b = s->batches;
    if (b != NULL && s->slot >= 0)
        atomic_fetch_add_explicit(&b->shards[s->slot].commands, 1,
                                  memory_order_relaxed);
    if (b == NULL || s->batch_turn == b->turn)
        return;
    s->batch_turn = b->turn;
    atomic_fetch_add_explicit(&b->batches, 1, memory_order_relaxed);
    if (s->slot >= 0)
        atomic_fetch_add_explicit(&b->shards[s->slot].batches, 1,
                                  memory_order_relaxed);
    if (b->counted_turn != b->turn) {
        b->counted_turn = b->turn;
        atomic_fetch_add_explicit(&b->turns, 1, memory_order_relaxed);
    }
}

/* Queues c (after ASKING, when it asks) on the connection. Returns why it
 * could not, or NULL. */
static const char *queue_command(rl_node *s, call *c, int argc,
                                 const char *const *argv,
                                 const size_t *lens)
{
    if (due_reserve(s) != 0)
        return "out of memory";
    if (c->asking) {
        if (rl_redis_conn_send(s->conn, "ASKING", NULL) != 0)
            return "out of memory";
        due_push(s, TO_NOTHING, 0, NULL);
    }
    if (rl_redis_conn_command(s->conn, argc, argv, lens) != 0) {
        /* An ASKING already queued would apply to the next command. */
        if (c->asking)
            drop_connection(s, "store_out_of_memory", "out of memory");
        return "out of memory";
    }
    due_push(s, TO_CALL, 0, c);
    return NULL;
}

static void send_call(rl_node *s, call *c)
{
    if (s->state != READY) {
        wait_for_ready(s, c);
        return;
    }
    int first = 0, argc = c->argc;
    if (c->script < 0) {
        first = 2; /* the command is the caller's first argument */
    } else {
        /* Slots 0 and 1 were left free for the command and the script. */
        c->by_function = s->use_functions;
        c->argv[0] = s->use_functions ? "FCALL" : "EVALSHA";
        c->argv[1] = s->use_functions ? s->scripts->functions[c->script]
                                      : s->sha[c->script];
        c->lens[0] = strlen(c->argv[0]);
        c->lens[1] = strlen(c->argv[1]);
        argc += 2;
    }
    c->attempts++;
    const char *error = queue_command(s, c, argc, c->argv + first,
                                      c->lens + first);
    if (error != NULL) {
        finish(c, NULL, error);
        return;
    }
    count_batch(s);
    if (s->in_flight++ == 0)
        s->last_progress = now_ms(s);
}

/* A block of size bytes for a call: a spare one when it fits. */
static call *take_block(rl_node *s, size_t size)
{
    bool recycled = size <= CALL_BYTES;
    call *c = recycled ? s->spare : NULL;
    if (c != NULL) {
        s->spare = c->next;
        s->n_spare--;
    } else {
        c = malloc(recycled ? CALL_BYTES : size);
    }
    if (c != NULL)
        c->recycled = recycled;
    return c;
}

/* One allocation holds the call and copies of its arguments, after two
 * free slots for the command and the script's name or digest. */
static call *new_call(rl_node *s, int argc, const char *const *argv,
                      const size_t *lens)
{
    size_t slots = (size_t)argc + 2, bytes = 0;
    for (int i = 0; i < argc; i++)
        bytes += lens[i] + 1;
    size_t size = sizeof(call) + slots * (sizeof(char *) + sizeof(size_t))
                  + bytes;
    call *c = take_block(s, size);
    if (c == NULL)
        return NULL;
    c->argv = (const char **)c->data;
    c->lens = (size_t *)(c->data + slots * sizeof(char *));
    char *p = (char *)(c->lens + slots);
    for (int i = 0; i < argc; i++) {
        memcpy(p, argv[i], lens[i]);
        p[lens[i]] = '\0';
        c->argv[i + 2] = p;
        c->lens[i + 2] = lens[i];
        p += lens[i] + 1;
    }
    c->argc = argc;
    return c;
}

void rl_node_run(rl_node *s, int script, bool asking, int argc,
                 const char *const *argv, const size_t *lens, rl_node_fn fn,
                 void *arg)
{
    if (s->state == DOWN || s->state == CLOSED) {
        char why[1100];
        snprintf(why, sizeof why, "store unavailable%s%s",
                 s->down_reason[0] != '\0' ? ": " : "", s->down_reason);
        fn(arg, NULL, s->state == DOWN ? why : "shutting down");
        return;
    }
    if (s->in_flight >= MAX_IN_FLIGHT) {
        fn(arg, NULL, "too many calls in flight to the store");
        return;
    }
    call *c = new_call(s, argc, argv, lens);
    if (c == NULL) {
        fn(arg, NULL, "out of memory");
        return;
    }
    c->next = NULL;
    c->stash = NULL;
    c->store = s;
    c->script = script;
    c->asking = asking;
    c->by_function = false;
    c->fn = fn;
    c->arg = arg;
    c->attempts = 0;
    send_call(s, c);
}

bool rl_node_up(const rl_node *s)
{
    return s->state == READY;
}

uint64_t rl_node_now_ms(const rl_node *s)
{
    return s->clock_offset_ms == 0 ? 0 : s->clock_offset_ms + now_ms(s);
}

/* A connection with calls in flight that has answered nothing for this
 * long is taken as dead (a peer gone without a FIN) and replaced. */
static uint64_t stall_limit_ms(const rl_node *s)
{
    uint64_t ten_deadlines = 10ULL * s->cfg->timeout_ms;
    return ten_deadlines > 1000 ? ten_deadlines : 1000;
}

static uint64_t skip(uint64_t since, uint64_t lost, uint64_t now)
{
    return since + lost < now ? since + lost : now;
}

/* A loop held up (a long callback elsewhere, the process not scheduled)
 * ran neither the writes nor the reads: the time it lost is not the
 * server's silence, and the stall clocks skip it. */
static void skip_time_held_up(rl_node *s)
{
    uint64_t now = now_ms(s), due = s->watchdog_ran + WATCHDOG_EVERY_MS;
    s->watchdog_ran = now;
    if (now <= due)
        return;
    s->last_progress = skip(s->last_progress, now - due, now);
    s->loading_since = skip(s->loading_since, now - due, now);
}

static void watchdog_fired(uv_timer_t *t)
{
    rl_node *s = t->data;
    skip_time_held_up(s);
    if (s->state == READY && now_ms(s) - s->clock_read_at > CLOCK_EVERY_MS)
        read_clock(s);
    /* Timers run before the loop reads: replies may be waiting in the
     * socket, and are not a stall (asked only of a connection that looks
     * stalled: it is a system call). */
    if (s->state == READY && s->in_flight > 0
        && now_ms(s) - s->last_progress > stall_limit_ms(s)
        && !rl_redis_conn_input_waiting(s->conn))
        drop_connection(s, "store_stalled", "no reply within the stall "
                        "limit");
    /* A server that accepts the connection but does not answer (stopped,
     * swapping) must not hold the calls waiting for it forever. */
    if (s->state == LOADING
        && now_ms(s) - s->loading_since > stall_limit_ms(s)
        && !rl_redis_conn_input_waiting(s->conn))
        drop_connection(s, "store_stalled", "no answer to the handshake "
                        "within the stall limit");
}

rl_node *rl_node_new(uv_loop_t *loop, const rl_store_config *cfg,
                     rl_redis_tls *tls, const rl_endpoint *ep, const rl_script_set *scripts,
                     rl_node_batches *batches, const rl_logger *log)
{
    rl_node *s = calloc(1, sizeof *s);
    if (s == NULL)
        return NULL;
    s->loop = loop;
    s->cfg = cfg;
    s->tls = tls;
    s->ep = *ep;
    s->batches = batches;
    s->slot = batches != NULL ? rl_node_batches_slot(batches, ep) : -1;
    s->batch_turn = UINT64_MAX;
    s->scripts = scripts;
    s->log = log;
    s->waiting_tail = &s->waiting;
    s->backoff_ms = BACKOFF_FIRST_MS;
    uv_timer_init(loop, &s->retry_timer);
    uv_timer_init(loop, &s->watchdog);
    s->retry_timer.data = s->watchdog.data = s;
    s->open_handles = 2;
    s->watchdog_ran = now_ms(s);
    uv_timer_start(&s->watchdog, watchdog_fired, WATCHDOG_EVERY_MS,
                   WATCHDOG_EVERY_MS);
    if (cfg->sentinel.master != NULL
        && (s->sentinel = rl_sentinel_new(loop, cfg, tls, log,
                                          on_master_moved, s)) == NULL) {
        rl_node_close(s);
        return NULL;
    }
    connect_now(s);
    return s;
}

static void handle_closed(uv_handle_t *h)
{
    rl_node *s = h->data;
    if (--s->open_handles > 0)
        return;
    while (s->spare != NULL) {
        call *c = s->spare;
        s->spare = c->next;
        free(c);
    }
    free(s->due);
    free(s);
}

void rl_node_close(rl_node *s)
{
    if (s == NULL)
        return;
    s->state = CLOSED;
    rl_sentinel_close(s->sentinel);
    s->sentinel = NULL;
    lose(s, "shutting down");
    fail_waiting(s, "shutting down");
    uv_close((uv_handle_t *)&s->retry_timer, handle_closed);
    uv_close((uv_handle_t *)&s->watchdog, handle_closed);
}

const rl_endpoint *rl_node_endpoint(const rl_node *s)
{
    return &s->ep;
}

size_t rl_node_in_flight(const rl_node *s)
{
    return s->in_flight;
}

void rl_node_batches_init(rl_node_batches *b)
{
    memset(b, 0, sizeof *b);
    b->counted_turn = UINT64_MAX; /* so that turn 0 counts too */
    pthread_mutex_init(&b->lock, NULL);
    for (int i = 0; i < RL_SHARDS_MAX; i++) {
        atomic_init(&b->shards[i].batches, 0);
        atomic_init(&b->shards[i].commands, 0);
    }
}

void rl_node_batches_fini(rl_node_batches *b)
{
    pthread_mutex_destroy(&b->lock);
}

int rl_node_batches_slot(rl_node_batches *b, const rl_endpoint *ep)
{
    char addr[sizeof b->shards[0].addr];
    snprintf(addr, sizeof addr, strchr(ep->host, ':') ? "[%s]:%u" : "%s:%u",
             ep->host, ep->port);
    pthread_mutex_lock(&b->lock);
    int at = -1;
    for (int i = 0; i < b->n_shards && at < 0; i++) {
        if (strcmp(b->shards[i].addr, addr) == 0)
            at = i;
    }
    if (at < 0 && b->n_shards < RL_SHARDS_MAX) {
        at = b->n_shards++;
        snprintf(b->shards[at].addr, sizeof b->shards[at].addr, "%s", addr);
    }
    pthread_mutex_unlock(&b->lock);
    return at;
}
