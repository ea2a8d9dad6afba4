/*
 * rls_worker.c: one loop of rl-rls (rls_worker.h). The agent is in
 * host-loop mode: its descriptor is watched here (uv_poll), its timeout is
 * a uv_timer, and a check phase runs it after any turn in which calls
 * started checks, so that one turn's checks leave in one write.
 */
#include "rls_worker.h"

#include "grpc/health/v1/health.pb-c.h"

#include <pthread.h>
#include <semaphore.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SHOULD_RATE_LIMIT \
    "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
#define HEALTH_CHECK "/grpc.health.v1.Health/Check"

enum { CMD_NONE, CMD_DRAIN, CMD_STOP };

/* A call handed over by rls_worker_call. */
typedef struct job {
    struct job *next;
    rls_worker *w;
    rls_reply_fn fn;
    void *arg;
    bool starting, answered;
    size_t len;
    uint8_t msg[];
} job;

struct rls_worker {
    const rls_worker_config *wc;
    pthread_t thread;
    sem_t started;
    int start_rc;
    char *start_err;
    size_t start_cap;
    uv_loop_t loop;
    uv_async_t wake;
    atomic_int command;
    uv_poll_t agent_poll;
    uv_timer_t agent_timer;
    uv_check_t agent_check;
    uv_timer_t drain_timer;
    atomic_bool drained;   /* draining, and no connection left */
    bool checks_started;   /* this turn: run the agent in the check phase */
    rl_agent *agent;
    rls_h2_server *server;
    rls_pool pool;         /* the calls' memory, on this loop */
    uint16_t port;
    pthread_mutex_t jobs_lock; /* the jobs' fields below */
    job *jobs, **jobs_end;     /* handed over, not yet started */
    size_t jobs_held;          /* handed over, not yet answered */
    bool jobs_closed;          /* stopped: no more taken */
};

/* --- The agent, driven by this loop ------------------------------------ */

static void on_agent_timer(uv_timer_t *t);

static void run_agent(rls_worker *w)
{
    w->checks_started = false;
    rl_agent_run(w->agent);
    int timeout = rl_agent_loop_timeout(w->agent);
    if (timeout < 0)
        uv_timer_stop(&w->agent_timer);
    else
        uv_timer_start(&w->agent_timer, on_agent_timer, (uint64_t)timeout,
                       0);
}

static void on_agent_timer(uv_timer_t *t)
{
    run_agent(t->data);
}

static void on_agent_readable(uv_poll_t *p, int status, int events)
{
    (void)status, (void)events;
    run_agent(p->data);
}

static void on_turn_end(uv_check_t *c)
{
    rls_worker *w = c->data;
    if (w->checks_started)
        run_agent(w);
}

/* --- Calls ------------------------------------------------------------- */

/* What a ShouldRateLimit call keeps between the transport and the
 * service: each side may end first. */
typedef struct call {
    rls_worker *w;
    rls_h2_call *h2;     /* NULL once answered */
    rls_call *svc;       /* NULL until started, and once answered */
    uv_timer_t deadline; /* the client's grpc-timeout, if it gave one */
    bool timed;          /* deadline is a handle to close */
    bool starting;
    bool orphan;         /* answered into a closing connection: wait for
                          * its on_cancel */
    uint64_t started;    /* uv_hrtime at its start */
    bool replied;        /* its end is counted */
} call;

static void on_deadline_closed(uv_handle_t *h)
{
    call *c = h->data;
    rls_pool_free(&c->w->pool, c);
}

static void release(call *c)
{
    if (!c->timed) {
        rls_pool_free(&c->w->pool, c);
        return;
    }
    uv_timer_stop(&c->deadline);
    uv_close((uv_handle_t *)&c->deadline, on_deadline_closed);
}

/* Near the client's deadline: answered now, what waits let through. */
static void on_deadline(uv_timer_t *t)
{
    call *c = t->data;
    if (c->svc != NULL)
        rls_call_expire(c->svc);
}

/* The answer goes a tenth of the client's timeout (1 ms at least) before
 * the client gives up, so that it is read, not dropped. */
static void arm_deadline(rls_worker *w, call *c, uint64_t timeout_ms)
{
    uint64_t lead = timeout_ms / 10 > 0 ? timeout_ms / 10 : 1;
    uv_timer_init(&w->loop, &c->deadline);
    c->deadline.data = c;
    c->timed = true;
    uv_timer_start(&c->deadline, on_deadline,
                   timeout_ms > lead ? timeout_ms - lead : 0, 0);
}

/* A call's end, counted once: answered, or its client gone first. */
static void call_end(call *c)
{
    if (c->replied)
        return;
    c->replied = true;
    rls_metrics_call_end(c->w->wc->metrics, RLS_METHOD_SHOULD_RATE_LIMIT,
                         uv_hrtime() - c->started);
}

static void on_answer(void *arg, rls_grpc_status status, const uint8_t *msg,
                      size_t len, const char *message)
{
    call *c = arg;
    call_end(c);
    int rc = rls_h2_reply(c->h2, status, msg, len, message);
    c->svc = NULL;
    if (rc == RLS_H2_ECANCELLED) {
        c->orphan = true;
        return;
    }
    c->h2 = NULL;
    if (!c->starting)
        release(c);
}

static void should_rate_limit(rls_worker *w, rls_h2_call *h2,
                              const uint8_t *msg, size_t len,
                              uint64_t timeout_ms)
{
    call *c = rls_pool_alloc(&w->pool, sizeof *c);
    if (c == NULL) {
        rls_h2_reply(h2, RLS_GRPC_RESOURCE_EXHAUSTED, NULL, 0,
                     "out of memory");
        return;
    }
    *c = (call){.w = w, .h2 = h2, .starting = true, .started = uv_hrtime()};
    rls_metrics_call_start(w->wc->metrics, RLS_METHOD_SHOULD_RATE_LIMIT);
    rls_h2_call_set_data(h2, c);
    rls_snapshot *snap = rls_runtime_get(w->wc->runtime);
    rls_call *svc = rls_should_rate_limit(w->agent, &w->pool,
                                          snap != NULL ? snap->cfg : NULL,
                                          w->wc->options, msg, len,
                                          on_answer, c);
    rls_snapshot_put(snap);
    c->starting = false;
    w->checks_started = true;
    if (c->h2 == NULL) {
        rls_pool_free(&w->pool, c); /* answered already */
    } else if (!c->orphan) {
        c->svc = svc;
        if (timeout_ms > 0)
            arm_deadline(w, c, timeout_ms);
    }
}

static void health_check(rls_worker *w, rls_h2_call *h2, const uint8_t *msg,
                         size_t len)
{
    Grpc__Health__V1__HealthCheckRequest *req =
        grpc__health__v1__health_check_request__unpack(NULL, len, msg);
    if (req == NULL) {
        rls_h2_reply(h2, RLS_GRPC_INTERNAL, NULL, 0,
                     "grpc: error unmarshalling request");
        return;
    }
    grpc__health__v1__health_check_request__free_unpacked(req, NULL);
    Grpc__Health__V1__HealthCheckResponse r =
        GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__INIT;
    r.status = atomic_load(w->wc->draining)
                   ? GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__NOT_SERVING
                   : GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING;
    uint8_t buf[16];
    size_t n = grpc__health__v1__health_check_response__pack(&r, buf);
    rls_h2_reply(h2, RLS_GRPC_OK, buf, n, NULL);
}

static bool is_path(const char *path, size_t len, const char *want)
{
    return len == strlen(want) && memcmp(path, want, len) == 0;
}

static void on_call(void *arg, rls_h2_call *h2, const char *path,
                    size_t path_len, const uint8_t *msg, size_t len,
                    uint64_t timeout_ms)
{
    rls_worker *w = arg;
    if (is_path(path, path_len, SHOULD_RATE_LIMIT))
        should_rate_limit(w, h2, msg, len, timeout_ms);
    else if (is_path(path, path_len, HEALTH_CHECK)) {
        uint64_t started = uv_hrtime();
        rls_metrics_call_start(w->wc->metrics, RLS_METHOD_HEALTH_CHECK);
        health_check(w, h2, msg, len);
        rls_metrics_call_end(w->wc->metrics, RLS_METHOD_HEALTH_CHECK,
                             uv_hrtime() - started);
    }
    else
        rls_h2_reply(h2, RLS_GRPC_UNIMPLEMENTED, NULL, 0, "unknown method");
}

static void on_cancel(void *arg, rls_h2_call *h2)
{
    (void)arg;
    call *c = rls_h2_call_data(h2);
    if (c == NULL)
        return;
    call_end(c);
    if (c->svc != NULL)
        rls_call_cancel(c->svc);
    release(c);
}

/* --- Calls handed over by other threads -------------------------------- */

static void job_done(job *j)
{
    rls_worker *w = j->w;
    pthread_mutex_lock(&w->jobs_lock);
    w->jobs_held--;
    pthread_mutex_unlock(&w->jobs_lock);
    free(j);
}

static void on_job_answer(void *arg, rls_grpc_status status,
                          const uint8_t *msg, size_t len, const char *message)
{
    job *j = arg;
    j->fn(j->arg, status, msg, len, message);
    j->answered = true;
    if (!j->starting)
        job_done(j);
}

static void start_job(rls_worker *w, job *j)
{
    j->starting = true;
    rls_snapshot *snap = rls_runtime_get(w->wc->runtime);
    rls_should_rate_limit(w->agent, &w->pool,
                          snap != NULL ? snap->cfg : NULL, w->wc->options,
                          j->msg, j->len, on_job_answer, j);
    rls_snapshot_put(snap);
    w->checks_started = true;
    j->starting = false;
    if (j->answered)
        job_done(j);
}

/* Starts every job handed over so far; with close, takes no more. */
static void take_jobs(rls_worker *w, bool close)
{
    pthread_mutex_lock(&w->jobs_lock);
    job *j = w->jobs;
    w->jobs = NULL;
    w->jobs_end = &w->jobs;
    w->jobs_closed = w->jobs_closed || close;
    pthread_mutex_unlock(&w->jobs_lock);
    while (j != NULL) {
        job *next = j->next;
        start_job(w, j);
        j = next;
    }
}

int rls_worker_call(rls_worker *w, const uint8_t *msg, size_t len,
                    rls_reply_fn fn, void *arg)
{
    job *j = malloc(sizeof *j + len);
    if (j == NULL)
        return -1;
    *j = (job){.w = w, .fn = fn, .arg = arg, .len = len};
    memcpy(j->msg, msg, len);
    pthread_mutex_lock(&w->jobs_lock);
    bool taken = !w->jobs_closed && w->jobs_held < RLS_WORKER_CALLS_MAX;
    if (taken) {
        *w->jobs_end = j;
        w->jobs_end = &j->next;
        w->jobs_held++;
        /* Under the lock: the handle is open until jobs_closed is set. */
        uv_async_send(&w->wake);
    }
    pthread_mutex_unlock(&w->jobs_lock);
    if (!taken)
        free(j);
    return taken ? 0 : -1;
}

static size_t jobs_held(rls_worker *w)
{
    pthread_mutex_lock(&w->jobs_lock);
    size_t n = w->jobs_held;
    pthread_mutex_unlock(&w->jobs_lock);
    return n;
}

/* --- The loop ---------------------------------------------------------- */

static void close_handle(uv_handle_t *h, void *arg)
{
    (void)arg;
    if (!uv_is_closing(h))
        uv_close(h, NULL);
}

static void on_server_closed(void *arg)
{
    rls_worker *w = arg;
    w->server = NULL;
    uv_timer_stop(&w->drain_timer);
    uv_poll_stop(&w->agent_poll);
    uv_timer_stop(&w->agent_timer);
    /* Jobs not started: started, so that they are checked too. */
    take_jobs(w, true);
    /* Runs the agent's own loop to its end: what waits is decided. */
    rl_agent_close(w->agent);
    w->agent = NULL;
    uv_walk(&w->loop, close_handle, NULL);
}

/* Looks every 20 ms whether the drain is over: no connection open, no
 * job unanswered. */
static void on_drain_timer(uv_timer_t *t)
{
    rls_worker *w = t->data;
    rls_h2_stats st;
    rls_h2_server_stats(w->server, &st);
    if (st.connections == 0 && jobs_held(w) == 0) {
        atomic_store(&w->drained, true);
        uv_timer_stop(t);
    }
}

static void on_wake(uv_async_t *a)
{
    rls_worker *w = a->data;
    int cmd = atomic_exchange(&w->command, CMD_NONE);
    if (cmd == CMD_DRAIN && w->server != NULL) {
        rls_h2_server_drain(w->server);
        uv_timer_start(&w->drain_timer, on_drain_timer, 0, 20);
    } else if (cmd == CMD_STOP && w->server != NULL)
        rls_h2_server_close(w->server, on_server_closed, w);
    take_jobs(w, false);
}

static int open_agent(rls_worker *w, char *err, size_t cap)
{
    rl_options o = {.config = w->wc->rl, .host_loop = 1, .log = w->wc->log,
                    .log_level = w->wc->log_level};
    rl_error e;
    int rc = rl_agent_open(&w->agent, &o, &e);
    if (rc != RL_OK) {
        snprintf(err, cap, "%s", e.message);
        return -1;
    }
    uv_poll_init(&w->loop, &w->agent_poll, rl_agent_loop_fd(w->agent));
    uv_timer_init(&w->loop, &w->agent_timer);
    uv_check_init(&w->loop, &w->agent_check);
    w->agent_poll.data = w->agent_timer.data = w->agent_check.data = w;
    uv_poll_start(&w->agent_poll, UV_READABLE, on_agent_readable);
    uv_check_start(&w->agent_check, on_turn_end);
    run_agent(w);
    return 0;
}

static int start_loop(rls_worker *w, char *err, size_t cap)
{
    uv_loop_init(&w->loop);
    uv_async_init(&w->loop, &w->wake, on_wake);
    uv_timer_init(&w->loop, &w->drain_timer);
    w->wake.data = w->drain_timer.data = w;
    if (open_agent(w, err, cap) != 0)
        return -1;
    rls_h2_handler h = {on_call, on_cancel, w};
    w->server = rls_h2_listen(&w->loop, w->wc->host, w->wc->port, true,
                              &w->wc->limits, &h, err, cap);
    if (w->server == NULL)
        return -1;
    w->port = rls_h2_server_port(w->server);
    if (w->wc->tls != NULL) {
        rl_logger log = {w->wc->log, NULL, w->wc->log_level};
        rls_h2_server_use_tls(w->server, w->wc->tls, &log);
    }
    return 0;
}

static void *worker_main(void *arg)
{
    rls_worker *w = arg;
    w->start_rc = start_loop(w, w->start_err, w->start_cap);
    bool ok = w->start_rc == 0;
    if (!ok) {
        if (w->agent != NULL) {
            uv_poll_stop(&w->agent_poll);
            rl_agent_close(w->agent);
        }
        uv_walk(&w->loop, close_handle, NULL);
    }
    sem_post(&w->started);
    uv_run(&w->loop, UV_RUN_DEFAULT);
    uv_loop_close(&w->loop);
    return NULL;
}

int rls_worker_start(rls_worker **out, const rls_worker_config *wc,
                     char *err, size_t cap)
{
    rls_worker *w = calloc(1, sizeof *w);
    *out = NULL;
    if (w == NULL) {
        snprintf(err, cap, "out of memory");
        return -1;
    }
    w->wc = wc;
    w->start_err = err;
    w->start_cap = cap;
    w->jobs_end = &w->jobs;
    pthread_mutex_init(&w->jobs_lock, NULL);
    sem_init(&w->started, 0, 0);
    if (pthread_create(&w->thread, NULL, worker_main, w) != 0) {
        snprintf(err, cap, "cannot start a thread");
        sem_destroy(&w->started);
        pthread_mutex_destroy(&w->jobs_lock);
        free(w);
        return -1;
    }
    while (sem_wait(&w->started) != 0)
        ;
    if (w->start_rc != 0) {
        pthread_join(w->thread, NULL);
        sem_destroy(&w->started);
        pthread_mutex_destroy(&w->jobs_lock);
        free(w);
        return -1;
    }
    *out = w;
    return 0;
}

uint16_t rls_worker_port(const rls_worker *w)
{
    return w->port;
}

static void send_command(rls_worker *w, int cmd)
{
    atomic_store(&w->command, cmd);
    uv_async_send(&w->wake);
}

void rls_worker_drain(rls_worker *w)
{
    send_command(w, CMD_DRAIN);
}

bool rls_worker_drained(const rls_worker *w)
{
    return atomic_load(&w->drained);
}

void rls_worker_stop(rls_worker *w)
{
    send_command(w, CMD_STOP);
    pthread_join(w->thread, NULL);
    sem_destroy(&w->started);
    pthread_mutex_destroy(&w->jobs_lock);
    rls_pool_fini(&w->pool);
    free(w);
}
