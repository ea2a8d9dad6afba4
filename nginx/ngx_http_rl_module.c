/*
 * ngx_http_rl_module: rl's fleet-wide rate limits inside nginx workers.
 *
 * The rules file is loaded and validated while nginx reads its config (in
 * the master, and by `nginx -t`), so a bad file fails there with rl's
 * message; then what the workers' agents will read (rl_config_check) is
 * opened with the workers' user, in a child of the master
 * (ngx_http_rl_check_module, below). Each worker opens its own agent after
 * the fork and closes it at exit, which flushes its synced counts: an
 * agent's I/O thread cannot cross a fork, and an old worker that drains
 * after a reload takes its counts with it. A worker whose agent still does
 * not open (a file changed since, a respawned worker, no thread to be had)
 * stays up: its requests are decided by their rules' on_error, and it tries
 * again, less and less often, until the agent opens.
 *
 * A worker never waits for the store. A request is first offered to
 * rl_check_nowait, which decides it at once when no rule that applies
 * needs a round trip (synced and local rules): no thread hop, no wake-up.
 * Only what it refuses (an exact rule applies) goes through rl_check_async.
 * The agent runs in the worker's own event loop (rl_options.host_loop):
 * its descriptor is an nginx read event, its next timeout an nginx timer,
 * and a check posts an event that runs the agent once the turn's events
 * are handled, so the turn's checks leave for Redis in one write. Their
 * decisions come back on the worker's thread, inside rl_agent_run, and the
 * worker resumes each request in the phase where it stopped. No thread
 * stands between a request and its store call: through the agent's own
 * I/O thread, an exact rule served 0.55 of nginx alone's requests per
 * second on two cores (docs/performance.md).
 *
 * The check runs in the preaccess phase (where limit_req runs), once per
 * client request: subrequests are not checked, and a request that nginx
 * redirects internally keeps the decision it had, found again through a
 * request cleanup that survives the redirect (nginx clears module contexts
 * then, not cleanups).
 *
 * With rl_cost_after, the check holds its charge open (rl_check_hold): it
 * holds rl_cost, an estimate, and the log phase ends the hold at the cost
 * rl_cost_after gives once the response is done ($upstream_http_x_cost,
 * say). With an in_flight rule, every check holds (its slot), and the log
 * phase ends the hold at rl_cost unless rl_cost_after says otherwise. Every other end of the request (a client gone, a request nginx
 * terminates) ends it at its estimate, through a pool cleanup: the pool
 * is destroyed after the log phase, so the cleanup only ends what the log
 * phase did not. A worker's exit leaves its holds to rl_agent_close, which
 * ends them at their estimates.
 */

#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include <grp.h>

#include <rl.h>


/*
 * A request waits at most rl's deadline (60 s at the very most) for its
 * decision; this timer outlasts it. It also keeps a worker that is shutting
 * down (after a reload) alive while decisions are pending: nginx lets such
 * a worker exit once no timer is left.
 */
#define NGX_HTTP_RL_GUARD_MS  61000

/* A worker whose agent did not open tries again after 100 ms, then after
 * twice as long each time, at most every 10 s: a file fixed by hand is
 * taken up within seconds, and a lasting failure logs a line per 10 s. */
#define NGX_HTTP_RL_RETRY_MIN_MS  100
#define NGX_HTTP_RL_RETRY_MAX_MS  10000

/* rl_format_headers needs at most 512 bytes, rl_format_body 1024. */
#define NGX_HTTP_RL_HEADERS_MAX  512
#define NGX_HTTP_RL_BODY_MAX     1024


typedef struct {
    ngx_str_t                  name;    /* NUL-terminated */
    ngx_http_complex_value_t   value;
} ngx_http_rl_attr_t;


typedef struct {
    ngx_str_t                  config_path;
    rl_config                 *config;
    ngx_flag_t                 in_flight;  /* a rule of config is */
    ngx_array_t               *attrs;   /* of ngx_http_rl_attr_t */
} ngx_http_rl_main_conf_t;


typedef struct {
    ngx_flag_t                 enable;
    ngx_http_complex_value_t  *cost;
    ngx_http_complex_value_t  *cost_after;
    ngx_uint_t                 status;
} ngx_http_rl_loc_conf_t;


typedef struct ngx_http_rl_pending_s  ngx_http_rl_pending_t;

/*
 * A check in flight, on the heap: the agent writes its decision and
 * queues it, whatever became of the request meanwhile. The worker clears
 * request when the request goes away, and frees the whole when it takes
 * the decision off the queue.
 */
struct ngx_http_rl_pending_s {
    ngx_http_request_t        *request;
    rl_decision                decision;
    rl_hold                   *hold;      /* an allowed rl_check_hold's */
    uint32_t                   estimate;  /* what the hold holds */
    ngx_http_rl_pending_t     *next;
};


typedef enum {
    NGX_HTTP_RL_PENDING = 0,
    NGX_HTTP_RL_DECIDED,     /* the decision is in, not yet acted on */
    NGX_HTTP_RL_DONE         /* acted on, or no decision will come */
} ngx_http_rl_state_e;


/* A client request's check, in its pool. */
typedef struct {
    ngx_http_rl_state_e        state;
    ngx_uint_t                 decided;  /* decision below is valid */
    ngx_http_rl_pending_t     *pending;
    rl_decision                decision;
    rl_hold                   *hold;     /* open until the request ends */
    uint32_t                   estimate;
} ngx_http_rl_ctx_t;


static ngx_int_t ngx_http_rl_handler(ngx_http_request_t *r);
static ngx_int_t ngx_http_rl_start(ngx_http_request_t *r,
    ngx_http_rl_loc_conf_t *rlcf);
static ngx_int_t ngx_http_rl_cost(ngx_http_request_t *r,
    ngx_http_rl_loc_conf_t *rlcf, uint32_t *cost);
static ngx_int_t ngx_http_rl_parse_cost(ngx_str_t *value, ngx_int_t min,
    uint32_t *cost);
static int ngx_http_rl_check(ngx_http_request_t *r, ngx_uint_t hold,
    ngx_http_rl_pending_t *p, rl_attr *attrs, size_t n, uint32_t cost);
static ngx_int_t ngx_http_rl_act(ngx_http_request_t *r,
    ngx_http_rl_ctx_t *ctx, ngx_http_rl_loc_conf_t *rlcf);
static ngx_int_t ngx_http_rl_reject(ngx_http_request_t *r,
    ngx_http_rl_ctx_t *ctx, ngx_http_rl_loc_conf_t *rlcf);
static void ngx_http_rl_wait_handler(ngx_http_request_t *r);
static void ngx_http_rl_decided(const rl_decision *decision, void *arg);
static void ngx_http_rl_held(const rl_decision *decision, rl_hold *hold,
    void *arg);
static ngx_int_t ngx_http_rl_log_handler(ngx_http_request_t *r);
static void ngx_http_rl_hold_cleanup(void *data);
static void ngx_http_rl_loop_handler(ngx_event_t *ev);
static void ngx_http_rl_run_soon(void);
static ngx_int_t ngx_http_rl_watch_loop(ngx_cycle_t *cycle);
static void ngx_http_rl_unwatch_loop(void);
static void ngx_http_rl_resume(ngx_http_rl_pending_t *p);
static ngx_http_rl_ctx_t *ngx_http_rl_get_ctx(ngx_http_request_t *r);
static void ngx_http_rl_cleanup(void *data);
static ngx_int_t ngx_http_rl_header_filter(ngx_http_request_t *r);
static ngx_int_t ngx_http_rl_add_headers(ngx_http_request_t *r,
    ngx_http_rl_ctx_t *ctx);
static ngx_int_t ngx_http_rl_push_header(ngx_http_request_t *r,
    u_char *key, size_t key_len, u_char *value, size_t value_len);

static ngx_int_t ngx_http_rl_variable(ngx_http_request_t *r,
    ngx_http_variable_value_t *v, uintptr_t data);

static char *ngx_http_rl_config(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
static char *ngx_http_rl_attr(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
static char *ngx_http_rl_cost_slot(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
static void ngx_http_rl_config_free(void *data);
static void *ngx_http_rl_create_main_conf(ngx_conf_t *cf);
static void *ngx_http_rl_create_loc_conf(ngx_conf_t *cf);
static char *ngx_http_rl_merge_loc_conf(ngx_conf_t *cf, void *parent,
    void *child);
static ngx_int_t ngx_http_rl_add_variables(ngx_conf_t *cf);
static ngx_int_t ngx_http_rl_init(ngx_conf_t *cf);
static ngx_int_t ngx_http_rl_init_process(ngx_cycle_t *cycle);
static void ngx_http_rl_exit_process(ngx_cycle_t *cycle);
static ngx_int_t ngx_http_rl_open_agent(ngx_cycle_t *cycle);
static void ngx_http_rl_retry_handler(ngx_event_t *ev);
static char *ngx_http_rl_check_conf(ngx_cycle_t *cycle, void *conf);
static void ngx_http_rl_check_child(ngx_core_conf_t *ccf,
    const rl_config *config, int fd);
static void ngx_http_rl_log(rl_log_level level, const char *line, void *arg);


static ngx_conf_num_bounds_t  ngx_http_rl_status_bounds = {
    ngx_conf_check_num_bounds, 400, 599
};


static ngx_command_t  ngx_http_rl_commands[] = {

    { ngx_string("rl_config"),
      NGX_HTTP_MAIN_CONF|NGX_CONF_TAKE1,
      ngx_http_rl_config,
      NGX_HTTP_MAIN_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("rl_attr"),
      NGX_HTTP_MAIN_CONF|NGX_CONF_TAKE2,
      ngx_http_rl_attr,
      NGX_HTTP_MAIN_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("rl"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_FLAG,
      ngx_conf_set_flag_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_rl_loc_conf_t, enable),
      NULL },

    { ngx_string("rl_cost"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_http_rl_cost_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_rl_loc_conf_t, cost),
      NULL },

    { ngx_string("rl_cost_after"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_http_set_complex_value_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_rl_loc_conf_t, cost_after),
      NULL },

    { ngx_string("rl_status"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_num_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_rl_loc_conf_t, status),
      &ngx_http_rl_status_bounds },

      ngx_null_command
};


static ngx_http_module_t  ngx_http_rl_module_ctx = {
    ngx_http_rl_add_variables,             /* preconfiguration */
    ngx_http_rl_init,                      /* postconfiguration */

    ngx_http_rl_create_main_conf,          /* create main configuration */
    NULL,                                  /* init main configuration */

    NULL,                                  /* create server configuration */
    NULL,                                  /* merge server configuration */

    ngx_http_rl_create_loc_conf,           /* create location configuration */
    ngx_http_rl_merge_loc_conf             /* merge location configuration */
};


ngx_module_t  ngx_http_rl_module = {
    NGX_MODULE_V1,
    &ngx_http_rl_module_ctx,               /* module context */
    ngx_http_rl_commands,                  /* module directives */
    NGX_HTTP_MODULE,                       /* module type */
    NULL,                                  /* init master */
    NULL,                                  /* init module */
    ngx_http_rl_init_process,              /* init process */
    NULL,                                  /* init thread */
    NULL,                                  /* exit thread */
    ngx_http_rl_exit_process,              /* exit process */
    NULL,                                  /* exit master */
    NGX_MODULE_V1_PADDING
};


/*
 * A core module in the same file, for its init_conf: nginx calls it once
 * the whole config is read (the `user` directive may come after the http
 * block), before the new cycle is taken up, and a failure there fails
 * `nginx -t`, a start, or a reload (the old workers go on). No directives.
 */
static ngx_core_module_t  ngx_http_rl_check_module_ctx = {
    ngx_string("rl_check"),
    NULL,                                  /* create conf */
    ngx_http_rl_check_conf                 /* init conf */
};


ngx_module_t  ngx_http_rl_check_module = {
    NGX_MODULE_V1,
    &ngx_http_rl_check_module_ctx,         /* module context */
    NULL,                                  /* module directives */
    NGX_CORE_MODULE,                       /* module type */
    NULL,                                  /* init master */
    NULL,                                  /* init module */
    NULL,                                  /* init process */
    NULL,                                  /* init thread */
    NULL,                                  /* exit thread */
    NULL,                                  /* exit process */
    NULL,                                  /* exit master */
    NGX_MODULE_V1_PADDING
};


enum {
    NGX_HTTP_RL_VAR_DECISION,
    NGX_HTTP_RL_VAR_RULE,
    NGX_HTTP_RL_VAR_LIMIT,
    NGX_HTTP_RL_VAR_REMAINING,
    NGX_HTTP_RL_VAR_RETRY_AFTER
};


static ngx_http_variable_t  ngx_http_rl_vars[] = {

    { ngx_string("rl_decision"), NULL, ngx_http_rl_variable,
      NGX_HTTP_RL_VAR_DECISION, NGX_HTTP_VAR_NOCACHEABLE, 0 },

    { ngx_string("rl_rule"), NULL, ngx_http_rl_variable,
      NGX_HTTP_RL_VAR_RULE, NGX_HTTP_VAR_NOCACHEABLE, 0 },

    { ngx_string("rl_limit"), NULL, ngx_http_rl_variable,
      NGX_HTTP_RL_VAR_LIMIT, NGX_HTTP_VAR_NOCACHEABLE, 0 },

    { ngx_string("rl_remaining"), NULL, ngx_http_rl_variable,
      NGX_HTTP_RL_VAR_REMAINING, NGX_HTTP_VAR_NOCACHEABLE, 0 },

    { ngx_string("rl_retry_after"), NULL, ngx_http_rl_variable,
      NGX_HTTP_RL_VAR_RETRY_AFTER, NGX_HTTP_VAR_NOCACHEABLE, 0 },

      ngx_http_null_variable
};


static ngx_http_output_header_filter_pt  ngx_http_next_header_filter;


/*
 * This worker's agent and its loop inside nginx's: the agent's descriptor
 * (a read event), its next timeout (a timer) and a posted event that runs
 * it after the turn's checks. A worker is one process with one event loop
 * thread, so these are per process; the master never sets them. Without
 * an agent (it did not open), the retry timer is set.
 */
static rl_agent               *ngx_http_rl_agent;
static ngx_event_t             ngx_http_rl_retry;
static ngx_msec_t              ngx_http_rl_retry_ms;
static ngx_uint_t              ngx_http_rl_tries;
static ngx_connection_t       *ngx_http_rl_loop_conn;
static ngx_event_t             ngx_http_rl_loop_timer;
static ngx_event_t             ngx_http_rl_loop_now;
static ngx_http_rl_pending_t  *ngx_http_rl_done;      /* newest first */


static ngx_int_t
ngx_http_rl_handler(ngx_http_request_t *r)
{
    ngx_http_rl_ctx_t       *ctx;
    ngx_http_rl_loc_conf_t  *rlcf;

    rlcf = ngx_http_get_module_loc_conf(r, ngx_http_rl_module);

    if (!rlcf->enable || r != r->main) {
        return NGX_DECLINED;
    }

    ctx = ngx_http_rl_get_ctx(r);

    if (ctx == NULL) {
        return ngx_http_rl_start(r, rlcf);
    }

    switch (ctx->state) {

    case NGX_HTTP_RL_PENDING:
        return NGX_AGAIN;

    case NGX_HTTP_RL_DECIDED:
        return ngx_http_rl_act(r, ctx, rlcf);

    default:
        /* checked before an internal redirect: once per client request */
        return NGX_DECLINED;
    }
}


static ngx_int_t
ngx_http_rl_start(ngx_http_request_t *r, ngx_http_rl_loc_conf_t *rlcf)
{
    int                       rc;
    uint32_t                  cost;
    ngx_str_t                 value;
    ngx_uint_t                i, n;
    ngx_http_rl_ctx_t        *ctx;
    ngx_http_cleanup_t       *cln;
    ngx_http_rl_attr_t       *attr;
    ngx_uint_t                hold;
    ngx_http_rl_pending_t    *p;
    ngx_http_rl_main_conf_t  *rmcf;
    rl_attr                   attrs[RL_ATTRS_MAX];

    rmcf = ngx_http_get_module_main_conf(r, ngx_http_rl_module);
    hold = rlcf->cost_after != NULL || rmcf->in_flight;

    if (ngx_http_rl_cost(r, rlcf, &cost) != NGX_OK) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    n = 0;
    attr = rmcf->attrs != NULL ? rmcf->attrs->elts : NULL;

    for (i = 0; rmcf->attrs != NULL && i < rmcf->attrs->nelts; i++) {
        if (ngx_http_complex_value(r, &attr[i].value, &value) != NGX_OK) {
            return NGX_HTTP_INTERNAL_SERVER_ERROR;
        }

        /* an empty value: the rules keyed on it do not apply, as in
         * rl-gateway (a request without an API key is not one key) */
        if (value.len == 0) {
            continue;
        }

        attrs[n].name = (const char *) attr[i].name.data;
        attrs[n].value = (const char *) value.data;
        attrs[n].value_len = value.len;
        n++;
    }

    ctx = ngx_pcalloc(r->pool, sizeof(ngx_http_rl_ctx_t));
    cln = ngx_http_cleanup_add(r, 0);
    if (ctx == NULL || cln == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    cln->handler = ngx_http_rl_cleanup;
    cln->data = ctx;
    ngx_http_set_ctx(r, ctx, ngx_http_rl_module);
    ctx->estimate = cost;

    if (n == 0) {
        /* no rule can apply: allowed, without a trip to the agent */
        ctx->state = NGX_HTTP_RL_DONE;
        ctx->decided = 1;
        ctx->decision.allowed = true;
        return NGX_DECLINED;
    }

    if (ngx_http_rl_agent == NULL) {
        /* the agent did not open (the error log says why, and a timer
         * tries again): the rules decide as without their store */
        rc = rl_config_decide_on_error(rmcf->config, attrs, n, cost,
                                       &ctx->decision);

    } else if (hold) {
        /* a hold is only had through the agent's loop */
        rc = RL_EAGAIN;

    } else {
        rc = rl_check_nowait(ngx_http_rl_agent, attrs, n, cost,
                             &ctx->decision);
    }

    if (rc == RL_OK) {
        ctx->decided = 1;
        return ngx_http_rl_act(r, ctx, rlcf);
    }

    p = NULL;

    if (rc == RL_EAGAIN) {
        /* an exact rule applies: the decision comes back to the event
         * loop */
        p = ngx_alloc(sizeof(ngx_http_rl_pending_t), r->connection->log);
        if (p == NULL) {
            ctx->state = NGX_HTTP_RL_DONE;
            return NGX_HTTP_INTERNAL_SERVER_ERROR;
        }

        p->request = r;
        p->hold = NULL;
        p->estimate = cost;
        p->next = NULL;
        ctx->pending = p;
        ctx->state = NGX_HTTP_RL_PENDING;

        rc = ngx_http_rl_check(r, hold, p, attrs, n, cost);

        if (rc == RL_OK) {
            ngx_http_rl_run_soon();
        }
    }

    if (rc != RL_OK) {
        ngx_free(p);
        ctx->pending = NULL;
        ctx->state = NGX_HTTP_RL_DONE;

        if (rc == RL_ETOOLONG || rc == RL_EINVAL) {
            ngx_log_error(NGX_LOG_INFO, r->connection->log, 0,
                          "rl: request refused: a value the rules key on "
                          "is too long or holds a NUL byte (%s)",
                          rl_strerror(rc));
            return NGX_HTTP_BAD_REQUEST;
        }

        ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                      "rl: check failed: %s", rl_strerror(rc));
        return NGX_HTTP_SERVICE_UNAVAILABLE;
    }

    /* like limit_req's delay: notice a client that goes away meanwhile,
     * and keep a timer while the request waits */
    r->read_event_handler = ngx_http_test_reading;
    r->write_event_handler = ngx_http_rl_wait_handler;
    ngx_add_timer(r->connection->write, NGX_HTTP_RL_GUARD_MS);

    return NGX_AGAIN;
}


/*
 * The check that goes to the agent's loop, as rl_check_async returns: when
 * it holds (rl_cost_after, in_flight rules), one whose charge is held
 * open, and whose hold a pool cleanup ends whatever becomes of the
 * request.
 */
static int
ngx_http_rl_check(ngx_http_request_t *r, ngx_uint_t hold,
    ngx_http_rl_pending_t *p, rl_attr *attrs, size_t n, uint32_t cost)
{
    ngx_pool_cleanup_t  *cln;

    if (!hold) {
        return rl_check_async(ngx_http_rl_agent, attrs, n, cost,
                              ngx_http_rl_decided, p);
    }

    cln = ngx_pool_cleanup_add(r->pool, 0);
    if (cln == NULL) {
        return RL_ENOMEM;
    }

    cln->handler = ngx_http_rl_hold_cleanup;
    cln->data = ngx_http_rl_get_ctx(r);

    return rl_check_hold(ngx_http_rl_agent, attrs, n, cost,
                         ngx_http_rl_held, p);
}


/* The decision is in: on to the next phase handler, or the rejection
 * sent. */
static ngx_int_t
ngx_http_rl_act(ngx_http_request_t *r, ngx_http_rl_ctx_t *ctx,
    ngx_http_rl_loc_conf_t *rlcf)
{
    ctx->state = NGX_HTTP_RL_DONE;

    if (ctx->decision.allowed) {
        return NGX_DECLINED;
    }

    ngx_http_finalize_request(r, ngx_http_rl_reject(r, ctx, rlcf));
    return NGX_DONE;
}


static ngx_int_t
ngx_http_rl_cost(ngx_http_request_t *r, ngx_http_rl_loc_conf_t *rlcf,
    uint32_t *cost)
{
    ngx_str_t  value;

    *cost = 1;

    if (rlcf->cost == NULL) {
        return NGX_OK;
    }

    if (ngx_http_complex_value(r, rlcf->cost, &value) != NGX_OK) {
        return NGX_ERROR;
    }

    if (ngx_http_rl_parse_cost(&value, 1, cost) != NGX_OK) {
        ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                      "rl: rl_cost is \"%V\" for this request: it must be "
                      "a whole number from 1 to 4294967295", &value);
        return NGX_ERROR;
    }

    return NGX_OK;
}


/* librl takes a cost of 1 to 2^32 - 1 tokens; a hold's actual cost may
 * be 0. */
static ngx_int_t
ngx_http_rl_parse_cost(ngx_str_t *value, ngx_int_t min, uint32_t *cost)
{
    ngx_int_t  n;

    n = ngx_atoi(value->data, value->len);

    if (n == NGX_ERROR || n < min || (uint64_t) n > UINT32_MAX) {
        return NGX_ERROR;
    }

    *cost = (uint32_t) n;

    return NGX_OK;
}


static ngx_int_t
ngx_http_rl_reject(ngx_http_request_t *r, ngx_http_rl_ctx_t *ctx,
    ngx_http_rl_loc_conf_t *rlcf)
{
    int           n;
    ngx_int_t     rc;
    ngx_buf_t    *b;
    ngx_chain_t   out;

    if (ngx_http_discard_request_body(r) != NGX_OK) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    b = ngx_create_temp_buf(r->pool, NGX_HTTP_RL_BODY_MAX);
    if (b == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    n = rl_format_body(&ctx->decision, (char *) b->pos, NGX_HTTP_RL_BODY_MAX);
    if (n < 0) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    b->last = b->pos + n;
    b->last_buf = 1;
    b->last_in_chain = 1;

    /* the store's absence with on_error: deny is not the client's limit:
     * 503, as rl-gateway answers, with the same body */
    r->headers_out.status = ctx->decision.degraded && !ctx->decision.fallback
                            ? NGX_HTTP_SERVICE_UNAVAILABLE : rlcf->status;
    r->headers_out.content_length_n = n;
    ngx_str_set(&r->headers_out.content_type, "application/json");
    r->headers_out.content_type_len = r->headers_out.content_type.len;
    r->headers_out.content_type_lowcase = NULL;

    rc = ngx_http_send_header(r);

    if (rc == NGX_ERROR || rc > NGX_OK || r->header_only) {
        return rc;
    }

    out.buf = b;
    out.next = NULL;

    return ngx_http_output_filter(r, &out);
}


static void
ngx_http_rl_wait_handler(ngx_http_request_t *r)
{
    ngx_event_t        *wev;
    ngx_http_rl_ctx_t  *ctx;

    wev = r->connection->write;

    if (!wev->timedout) {
        if (ngx_handle_write_event(wev, 0) != NGX_OK) {
            ngx_http_finalize_request(r, NGX_HTTP_INTERNAL_SERVER_ERROR);
        }

        return;
    }

    /* rl answers within its deadline: this is a bug, not a slow store */
    wev->timedout = 0;

    ngx_log_error(NGX_LOG_ALERT, r->connection->log, 0,
                  "rl: no decision within %M ms, answering 503",
                  (ngx_msec_t) NGX_HTTP_RL_GUARD_MS);

    ctx = ngx_http_rl_get_ctx(r);
    if (ctx != NULL) {
        ngx_http_rl_cleanup(ctx);
    }

    ngx_http_finalize_request(r, NGX_HTTP_SERVICE_UNAVAILABLE);
}


/*
 * Inside rl_agent_run, on the worker's thread: the request is resumed once
 * the agent's loop has returned (ngx_http_rl_loop_handler), not from
 * inside it.
 */
static void
ngx_http_rl_decided(const rl_decision *decision, void *arg)
{
    ngx_http_rl_pending_t  *p;

    p = arg;
    p->decision = *decision;
    p->next = ngx_http_rl_done;
    ngx_http_rl_done = p;
}


static void
ngx_http_rl_held(const rl_decision *decision, rl_hold *hold, void *arg)
{
    ngx_http_rl_pending_t  *p;

    p = arg;
    p->hold = hold;
    ngx_http_rl_decided(decision, p);
}


/* Takes the queue of decided checks, oldest first. */
static ngx_http_rl_pending_t *
ngx_http_rl_take_done(void)
{
    ngx_http_rl_pending_t  *p, *next, *oldest;

    p = ngx_http_rl_done;
    ngx_http_rl_done = NULL;
    oldest = NULL;

    while (p != NULL) {
        next = p->next;
        p->next = oldest;
        oldest = p;
        p = next;
    }

    return oldest;
}


/*
 * The agent's descriptor is readable, its timeout has passed, or checks
 * were made this turn: run what is due, resume the requests decided, and
 * wait for the agent's next timeout.
 */
static void
ngx_http_rl_loop_handler(ngx_event_t *ev)
{
    int                     timeout;
    ngx_http_rl_pending_t  *p, *next;

    if (ngx_http_rl_agent == NULL) {
        return;
    }

    (void) rl_agent_run(ngx_http_rl_agent);

    for (p = ngx_http_rl_take_done(); p != NULL; p = next) {
        next = p->next;
        ngx_http_rl_resume(p);
    }

    /* a resumed request may have checked again, and posted a run */
    timeout = rl_agent_loop_timeout(ngx_http_rl_agent);

    if (ngx_http_rl_loop_timer.timer_set) {
        /* nginx keeps a timer within 300 ms of the new one: too late */
        ngx_del_timer(&ngx_http_rl_loop_timer);
    }

    if (timeout == 0) {
        ngx_http_rl_run_soon();

    } else if (timeout > 0) {
        ngx_add_timer(&ngx_http_rl_loop_timer, (ngx_msec_t) timeout);
    }
}


/* Once this turn's events are handled: its checks go out together. */
static void
ngx_http_rl_run_soon(void)
{
    if (!ngx_http_rl_loop_now.posted) {
        ngx_post_event(&ngx_http_rl_loop_now, &ngx_posted_events);
    }
}


static void
ngx_http_rl_resume(ngx_http_rl_pending_t *p)
{
    ngx_connection_t    *c;
    ngx_http_request_t  *r;
    ngx_http_rl_ctx_t   *ctx;

    r = p->request;

    if (r == NULL) {
        /* the request went away while it waited: nothing to charge but
         * its estimate */
        if (p->hold != NULL) {
            (void) rl_hold_end(p->hold, p->estimate);
        }

        ngx_free(p);
        return;
    }

    ctx = ngx_http_rl_get_ctx(r);
    ctx->hold = p->hold;
    ctx->decision = p->decision;
    ctx->decided = 1;
    ctx->pending = NULL;
    ctx->state = NGX_HTTP_RL_DECIDED;
    ngx_free(p);

    c = r->connection;

    if (c->write->timer_set) {
        ngx_del_timer(c->write);
    }

    if (ngx_handle_read_event(c->read, 0) != NGX_OK) {
        ngx_http_finalize_request(r, NGX_HTTP_INTERNAL_SERVER_ERROR);
        ngx_http_run_posted_requests(c);
        return;
    }

    r->read_event_handler = ngx_http_block_reading;
    r->write_event_handler = ngx_http_core_run_phases;

    ngx_http_core_run_phases(r);
    ngx_http_run_posted_requests(c);
}


/*
 * The client request's check. An internal redirect clears module contexts
 * but keeps the request's cleanups, where the check is found again: so a
 * redirected request is not checked twice and its variables still show
 * its decision.
 */
static ngx_http_rl_ctx_t *
ngx_http_rl_get_ctx(ngx_http_request_t *r)
{
    ngx_http_rl_ctx_t   *ctx;
    ngx_http_cleanup_t  *cln;

    r = r->main;

    ctx = ngx_http_get_module_ctx(r, ngx_http_rl_module);
    if (ctx != NULL) {
        return ctx;
    }

    for (cln = r->cleanup; cln != NULL; cln = cln->next) {
        if (cln->handler == ngx_http_rl_cleanup) {
            ctx = cln->data;
            ngx_http_set_ctx(r, ctx, ngx_http_rl_module);
            return ctx;
        }
    }

    return NULL;
}


/* The request is finalized or terminated: a decision still to come finds
 * no request. */
static void
ngx_http_rl_cleanup(void *data)
{
    ngx_http_rl_ctx_t  *ctx = data;

    if (ctx->pending != NULL) {
        ctx->pending->request = NULL;
        ctx->pending = NULL;
        ctx->state = NGX_HTTP_RL_DONE;
    }
}


/*
 * The log phase, once the response is done: the hold ends at the cost
 * rl_cost_after gives, or at its estimate when there is no rl_cost_after
 * (an in_flight rule's hold), or its value is empty (no upstream answered,
 * it sent no such header) or not a cost.
 */
static ngx_int_t
ngx_http_rl_log_handler(ngx_http_request_t *r)
{
    uint32_t                 actual;
    ngx_str_t                value;
    ngx_http_rl_ctx_t       *ctx;
    ngx_http_rl_loc_conf_t  *rlcf;

    /* A subrequest shares the main request's ctx, and with
     * log_subrequest on (mirror, auth_request, SSI) it is logged first,
     * without the response's cost: the hold is the main request's. */
    if (r != r->main) {
        return NGX_OK;
    }

    ctx = ngx_http_rl_get_ctx(r);

    if (ctx == NULL || ctx->hold == NULL) {
        return NGX_OK;
    }

    rlcf = ngx_http_get_module_loc_conf(r, ngx_http_rl_module);
    actual = ctx->estimate;

    if (rlcf->cost_after == NULL) {
        /* void */

    } else if (ngx_http_complex_value(r, rlcf->cost_after, &value)
               != NGX_OK)
    {
        ngx_log_error(NGX_LOG_WARN, r->connection->log, 0,
                      "rl: rl_cost_after could not be evaluated: the "
                      "estimate %uD is charged", actual);

    } else if (value.len == 0) {
        ngx_log_error(NGX_LOG_WARN, r->connection->log, 0,
                      "rl: rl_cost_after is empty (no response gave it): "
                      "the estimate %uD is charged", actual);

    } else if (ngx_http_rl_parse_cost(&value, 0, &actual) != NGX_OK) {
        actual = ctx->estimate;
        ngx_log_error(NGX_LOG_WARN, r->connection->log, 0,
                      "rl: rl_cost_after is \"%V\", not a whole number "
                      "from 0 to 4294967295: the estimate %uD is charged",
                      &value, actual);
    }

    (void) rl_hold_end(ctx->hold, actual);
    ctx->hold = NULL;

    return NGX_OK;
}


/* The request's pool goes, after its log phase: a hold still open (the
 * request ended before it was logged) ends at its estimate. */
static void
ngx_http_rl_hold_cleanup(void *data)
{
    ngx_http_rl_ctx_t  *ctx = data;

    if (ctx->hold != NULL) {
        (void) rl_hold_end(ctx->hold, ctx->estimate);
        ctx->hold = NULL;
    }
}


static ngx_int_t
ngx_http_rl_header_filter(ngx_http_request_t *r)
{
    ngx_http_rl_ctx_t  *ctx;

    if (r == r->main) {
        ctx = ngx_http_rl_get_ctx(r);

        if (ctx != NULL && ctx->decided
            && ngx_http_rl_add_headers(r, ctx) != NGX_OK)
        {
            return NGX_ERROR;
        }
    }

    return ngx_http_next_header_filter(r);
}


/* rl_format_headers' lines ("Name: value\r\n"), as response headers. */
static ngx_int_t
ngx_http_rl_add_headers(ngx_http_request_t *r, ngx_http_rl_ctx_t *ctx)
{
    int      n;
    u_char  *p, *end, *colon, *eol;

    p = ngx_pnalloc(r->pool, NGX_HTTP_RL_HEADERS_MAX);
    if (p == NULL) {
        return NGX_ERROR;
    }

    n = rl_format_headers(&ctx->decision, (char *) p,
                          NGX_HTTP_RL_HEADERS_MAX);
    if (n < 0) {
        return NGX_ERROR;
    }

    end = p + n;

    while (p < end) {
        colon = ngx_strlchr(p, end, ':');
        eol = ngx_strlchr(p, end, '\r');

        if (colon == NULL || eol == NULL || colon > eol) {
            return NGX_ERROR;
        }

        if (ngx_http_rl_push_header(r, p, colon - p, colon + 2,
                                    eol - (colon + 2))
            != NGX_OK)
        {
            return NGX_ERROR;
        }

        p = eol + 2;
    }

    if (ctx->decision.degraded) {
        /* rl-gateway's header: the store did not answer and on_error
         * decided */
        return ngx_http_rl_push_header(r, (u_char *) "RateLimit-Degraded",
                   sizeof("RateLimit-Degraded") - 1,
                   (u_char *) "store unavailable, on_error decided",
                   sizeof("store unavailable, on_error decided") - 1);
    }

    return NGX_OK;
}


static ngx_int_t
ngx_http_rl_push_header(ngx_http_request_t *r, u_char *key, size_t key_len,
    u_char *value, size_t value_len)
{
    ngx_table_elt_t  *h;

    h = ngx_list_push(&r->headers_out.headers);
    if (h == NULL) {
        return NGX_ERROR;
    }

    ngx_memzero(h, sizeof(ngx_table_elt_t));
    h->hash = 1;
    h->key.data = key;
    h->key.len = key_len;
    h->value.data = value;
    h->value.len = value_len;

    return NGX_OK;
}


static ngx_int_t
ngx_http_rl_variable(ngx_http_request_t *r, ngx_http_variable_value_t *v,
    uintptr_t data)
{
    u_char              *p;
    uint64_t             n;
    const char          *s;
    rl_decision         *d;
    ngx_http_rl_ctx_t   *ctx;

    ctx = ngx_http_rl_get_ctx(r);

    if (ctx == NULL || !ctx->decided) {
        v->not_found = 1;
        return NGX_OK;
    }

    d = &ctx->decision;
    s = NULL;
    n = 0;

    switch (data) {

    case NGX_HTTP_RL_VAR_DECISION:
        /* a rejection is a rejection even when on_error denied; degraded
         * names the requests let through without the store's word */
        s = !d->allowed ? "rejected"
                        : d->degraded ? "degraded" : "allowed";
        break;

    case NGX_HTTP_RL_VAR_RULE:
        s = d->rule;
        break;

    case NGX_HTTP_RL_VAR_LIMIT:
        n = d->limit;
        break;

    case NGX_HTTP_RL_VAR_REMAINING:
        n = d->remaining;
        break;

    default: /* NGX_HTTP_RL_VAR_RETRY_AFTER: as the Retry-After header */
        if (d->allowed || d->retry_after_ms < 0) {
            v->not_found = 1;
            return NGX_OK;
        }

        n = ((uint64_t) d->retry_after_ms + 999) / 1000;
        n = n > 0 ? n : 1;
        break;
    }

    if (data != NGX_HTTP_RL_VAR_DECISION && d->rule[0] == '\0') {
        /* no rule applied: no limit to speak of */
        v->not_found = 1;
        return NGX_OK;
    }

    if (s != NULL) {
        v->data = (u_char *) s;
        v->len = ngx_strlen(s);

    } else {
        p = ngx_pnalloc(r->pool, NGX_INT64_LEN);
        if (p == NULL) {
            return NGX_ERROR;
        }

        v->data = p;
        v->len = ngx_sprintf(p, "%uL", n) - p;
    }

    v->valid = 1;
    v->no_cacheable = 1;
    v->not_found = 0;

    return NGX_OK;
}


static char *
ngx_http_rl_config(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_http_rl_main_conf_t *rmcf = conf;

    int                  rc;
    ngx_str_t           *value;
    rl_error             err;
    ngx_pool_cleanup_t  *cln;

    if (rmcf->config_path.data != NULL) {
        return "is duplicate";
    }

    value = cf->args->elts;
    rmcf->config_path = value[1];

    if (ngx_conf_full_name(cf->cycle, &rmcf->config_path, 1) != NGX_OK) {
        return NGX_CONF_ERROR;
    }

    cln = ngx_pool_cleanup_add(cf->pool, 0);
    if (cln == NULL) {
        return NGX_CONF_ERROR;
    }

    /* Loaded here so that `nginx -t` and a reload refuse a bad file with
     * rl's message; the workers' agents read this very config, freed with
     * the cycle that holds it. */
    rc = rl_config_load((const char *) rmcf->config_path.data, &rmcf->config,
                        &err);

    if (rc != RL_OK) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0, "rl_config: %s",
                           rc == RL_ECONFIG || rc == RL_EIO
                           ? err.message : rl_strerror(rc));
        return NGX_CONF_ERROR;
    }

    cln->handler = ngx_http_rl_config_free;
    cln->data = rmcf->config;
    rmcf->in_flight = rl_config_has_in_flight(rmcf->config);

    return NGX_CONF_OK;
}


static void
ngx_http_rl_config_free(void *data)
{
    rl_config_free(data);
}


/*
 * The workers' side of the rules, checked before any worker of the new
 * config starts: the files their agents read at rl_agent_open are opened
 * by a child of the master that takes the workers' user and groups first,
 * as a worker does (ngx_worker_process_init), so that a file only root can
 * read fails here, not in every worker. A child, not the master: checking
 * TLS files starts nng's threads, and a process that forks workers must
 * have none. `nginx -s` only signals, and checks nothing.
 */
static char *
ngx_http_rl_check_conf(ngx_cycle_t *cycle, void *conf)
{
    int                       fds[2], status;
    pid_t                     pid;
    size_t                    got;
    ssize_t                   n;
    sigset_t                  chld, saved;
    rl_error                  err;
    ngx_core_conf_t          *ccf;
    ngx_http_rl_main_conf_t  *rmcf;

    rmcf = ngx_http_cycle_get_module_main_conf(cycle, ngx_http_rl_module);

    if (ngx_process == NGX_PROCESS_SIGNALLER
        || rmcf == NULL || rmcf->config == NULL)
    {
        return NGX_CONF_OK;
    }

    ccf = (ngx_core_conf_t *) ngx_get_conf(cycle->conf_ctx, ngx_core_module);

    if (pipe2(fds, O_CLOEXEC) == -1) {
        ngx_log_error(NGX_LOG_EMERG, cycle->log, ngx_errno,
                      "rl_config: pipe2() failed");
        return NGX_CONF_ERROR;
    }

    /* The master's SIGCHLD handler reaps every child it is told of: this
     * one is reaped here, with the signal held meanwhile. */
    sigemptyset(&chld);
    sigaddset(&chld, SIGCHLD);
    sigprocmask(SIG_BLOCK, &chld, &saved);

    pid = fork();

    if (pid == 0) {
        close(fds[0]);
        ngx_http_rl_check_child(ccf, rmcf->config, fds[1]);
    }

    close(fds[1]);
    got = 0;

    while (pid > 0 && got < sizeof(rl_error)) {
        n = read(fds[0], (u_char *) &err + got, sizeof(rl_error) - got);

        if (n > 0) {
            got += n;

        } else if (n == 0 || ngx_errno != NGX_EINTR) {
            break;
        }
    }

    close(fds[0]);

    while (pid > 0 && waitpid(pid, &status, 0) == -1
           && ngx_errno == NGX_EINTR)
    {
        /* void */
    }

    sigprocmask(SIG_SETMASK, &saved, NULL);

    if (pid == -1 || got != sizeof(rl_error)) {
        ngx_log_error(NGX_LOG_EMERG, cycle->log, ngx_errno,
                      "rl_config: %V: the check of the workers' files did "
                      "not run", &rmcf->config_path);
        return NGX_CONF_ERROR;
    }

    if (err.code != RL_OK) {
        err.message[RL_ERROR_MAX - 1] = '\0';

        if (geteuid() == 0) {
            ngx_log_error(NGX_LOG_EMERG, cycle->log, 0,
                          "rl_config: %V: %s (as the workers' user \"%s\", "
                          "who open the agents)", &rmcf->config_path,
                          err.message, ccf->username);

        } else {
            ngx_log_error(NGX_LOG_EMERG, cycle->log, 0,
                          "rl_config: %V: %s", &rmcf->config_path,
                          err.message);
        }

        return NGX_CONF_ERROR;
    }

    return NGX_CONF_OK;
}


/* In the child: the workers' credentials, the check, its rl_error into fd
 * (under PIPE_BUF: one write), and out without nginx's exit handlers. */
static void
ngx_http_rl_check_child(ngx_core_conf_t *ccf, const rl_config *config,
    int fd)
{
    rl_error  err;

    ngx_memzero(&err, sizeof(rl_error));

    if (geteuid() == 0
        && (setgid(ccf->group) == -1
            || initgroups(ccf->username, ccf->group) == -1
            || setuid(ccf->user) == -1))
    {
        err.code = RL_ESYS;
        ngx_snprintf((u_char *) err.message, RL_ERROR_MAX - 1,
                     "cannot take the workers' user \"%s\": %s%Z",
                     ccf->username, strerror(errno));

    } else {
        (void) rl_config_check(config, &err);
    }

    if (write(fd, &err, sizeof(rl_error)) != (ssize_t) sizeof(rl_error)) {
        _exit(1);
    }

    _exit(0);
}


static char *
ngx_http_rl_attr(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_http_rl_main_conf_t *rmcf = conf;

    ngx_str_t                         *value;
    ngx_uint_t                         i;
    ngx_http_rl_attr_t                *attr;
    ngx_http_compile_complex_value_t   ccv;

    value = cf->args->elts;

    if (value[1].len == 0) {
        return "needs a non-empty attribute name";
    }

    if (rmcf->attrs == NULL) {
        rmcf->attrs = ngx_array_create(cf->pool, 4,
                                       sizeof(ngx_http_rl_attr_t));
        if (rmcf->attrs == NULL) {
            return NGX_CONF_ERROR;
        }
    }

    attr = rmcf->attrs->elts;

    for (i = 0; i < rmcf->attrs->nelts; i++) {
        if (attr[i].name.len == value[1].len
            && ngx_strncmp(attr[i].name.data, value[1].data, value[1].len)
               == 0)
        {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "rl_attr \"%V\" is given twice: an attribute "
                               "has one value per request", &value[1]);
            return NGX_CONF_ERROR;
        }
    }

    if (rmcf->attrs->nelts == RL_ATTRS_MAX) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "too many rl_attr: rl takes at most %d "
                           "attributes per request", RL_ATTRS_MAX);
        return NGX_CONF_ERROR;
    }

    attr = ngx_array_push(rmcf->attrs);
    if (attr == NULL) {
        return NGX_CONF_ERROR;
    }

    /* nginx's config words end in a NUL: rl_attr.name can point here */
    attr->name = value[1];

    ngx_memzero(&ccv, sizeof(ngx_http_compile_complex_value_t));
    ccv.cf = cf;
    ccv.value = &value[2];
    ccv.complex_value = &attr->value;

    if (ngx_http_compile_complex_value(&ccv) != NGX_OK) {
        return NGX_CONF_ERROR;
    }

    return NGX_CONF_OK;
}


static char *
ngx_http_rl_cost_slot(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_http_rl_loc_conf_t *rlcf = conf;

    char       *rv;
    uint32_t    cost;
    ngx_str_t  *value;

    rv = ngx_http_set_complex_value_slot(cf, cmd, conf);
    if (rv != NGX_CONF_OK) {
        return rv;
    }

    /* a constant is checked now; a variable per request */
    if (rlcf->cost->lengths == NULL) {
        value = cf->args->elts;

        if (ngx_http_rl_parse_cost(&value[1], 1, &cost) != NGX_OK) {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "rl_cost \"%V\" must be a whole number from "
                               "1 to 4294967295, or a variable", &value[1]);
            return NGX_CONF_ERROR;
        }
    }

    return NGX_CONF_OK;
}


static void *
ngx_http_rl_create_main_conf(ngx_conf_t *cf)
{
    /* config_path, config and attrs start empty */
    return ngx_pcalloc(cf->pool, sizeof(ngx_http_rl_main_conf_t));
}


static void *
ngx_http_rl_create_loc_conf(ngx_conf_t *cf)
{
    ngx_http_rl_loc_conf_t  *conf;

    conf = ngx_pcalloc(cf->pool, sizeof(ngx_http_rl_loc_conf_t));
    if (conf == NULL) {
        return NULL;
    }

    conf->enable = NGX_CONF_UNSET;
    conf->cost = NGX_CONF_UNSET_PTR;
    conf->cost_after = NGX_CONF_UNSET_PTR;
    conf->status = NGX_CONF_UNSET_UINT;

    return conf;
}


static char *
ngx_http_rl_merge_loc_conf(ngx_conf_t *cf, void *parent, void *child)
{
    ngx_http_rl_loc_conf_t *prev = parent;
    ngx_http_rl_loc_conf_t *conf = child;

    ngx_http_rl_main_conf_t  *rmcf;

    ngx_conf_merge_value(conf->enable, prev->enable, 0);
    ngx_conf_merge_ptr_value(conf->cost, prev->cost, NULL);
    ngx_conf_merge_ptr_value(conf->cost_after, prev->cost_after, NULL);
    ngx_conf_merge_uint_value(conf->status, prev->status,
                              NGX_HTTP_TOO_MANY_REQUESTS);

    rmcf = ngx_http_conf_get_module_main_conf(cf, ngx_http_rl_module);

    if (conf->enable && rmcf->config == NULL) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "\"rl on\" needs the rules: add "
                           "\"rl_config <file>;\" to the http block");
        return NGX_CONF_ERROR;
    }

    return NGX_CONF_OK;
}


static ngx_int_t
ngx_http_rl_add_variables(ngx_conf_t *cf)
{
    ngx_http_variable_t  *var, *v;

    for (v = ngx_http_rl_vars; v->name.len; v++) {
        var = ngx_http_add_variable(cf, &v->name, v->flags);
        if (var == NULL) {
            return NGX_ERROR;
        }

        var->get_handler = v->get_handler;
        var->data = v->data;
    }

    return NGX_OK;
}


static ngx_int_t
ngx_http_rl_init(ngx_conf_t *cf)
{
    ngx_http_handler_pt        *h;
    ngx_http_core_main_conf_t  *cmcf;

    cmcf = ngx_http_conf_get_module_main_conf(cf, ngx_http_core_module);

    h = ngx_array_push(&cmcf->phases[NGX_HTTP_PREACCESS_PHASE].handlers);
    if (h == NULL) {
        return NGX_ERROR;
    }

    *h = ngx_http_rl_handler;

    h = ngx_array_push(&cmcf->phases[NGX_HTTP_LOG_PHASE].handlers);
    if (h == NULL) {
        return NGX_ERROR;
    }

    *h = ngx_http_rl_log_handler;

    ngx_http_next_header_filter = ngx_http_top_header_filter;
    ngx_http_top_header_filter = ngx_http_rl_header_filter;

    return NGX_OK;
}


static ngx_int_t
ngx_http_rl_init_process(ngx_cycle_t *cycle)
{
    ngx_http_rl_main_conf_t  *rmcf;

    rmcf = ngx_http_cycle_get_module_main_conf(cycle, ngx_http_rl_module);

    if (rmcf == NULL || rmcf->config == NULL) {
        return NGX_OK;
    }

    /* Cancelable: the agent's timers do not keep a worker that shuts down
     * alive (a request waiting for a decision has its own timer). */
    ngx_http_rl_loop_timer.handler = ngx_http_rl_loop_handler;
    ngx_http_rl_loop_timer.log = cycle->log;
    ngx_http_rl_loop_timer.cancelable = 1;
    ngx_http_rl_loop_now.handler = ngx_http_rl_loop_handler;
    ngx_http_rl_loop_now.log = cycle->log;

    /* Cancelable: a worker that shuts down does not wait for it. */
    ngx_http_rl_retry.handler = ngx_http_rl_retry_handler;
    ngx_http_rl_retry.log = cycle->log;
    ngx_http_rl_retry.data = cycle;
    ngx_http_rl_retry.cancelable = 1;
    ngx_http_rl_retry_ms = NGX_HTTP_RL_RETRY_MIN_MS;

    /* A worker that fails its init exits, and nginx does not respawn it:
     * rather serve by on_error than take the instance down. */
    if (ngx_http_rl_open_agent(cycle) != NGX_OK) {
        ngx_add_timer(&ngx_http_rl_retry, ngx_http_rl_retry_ms);
    }

    return NGX_OK;
}


static ngx_int_t
ngx_http_rl_open_agent(ngx_cycle_t *cycle)
{
    int                       rc;
    rl_error                  err;
    rl_options                options;
    ngx_http_rl_main_conf_t  *rmcf;

    rmcf = ngx_http_cycle_get_module_main_conf(cycle, ngx_http_rl_module);

    ngx_memzero(&options, sizeof(rl_options));
    options.config = rmcf->config;
    options.log = ngx_http_rl_log;
    options.log_arg = cycle->log;
    options.log_level = RL_LOG_INFO;
    options.host_loop = 1;

    ngx_http_rl_tries++;

    rc = rl_agent_open(&ngx_http_rl_agent, &options, &err);

    if (rc == RL_OK && ngx_http_rl_watch_loop(cycle) != NGX_OK) {
        rl_agent_close(ngx_http_rl_agent);
        ngx_http_rl_agent = NULL;
        rc = RL_ESYS;
        ngx_cpystrn((u_char *) err.message,
                    (u_char *) "its descriptor could not be added to the "
                    "worker's events", sizeof(err.message));
    }

    if (rc != RL_OK) {
        ngx_log_error(NGX_LOG_ERR, cycle->log, 0,
                      "rl: the agent did not open (try %ui): %s; requests "
                      "are decided by their rules' on_error until it does, "
                      "next try in %M ms", ngx_http_rl_tries, err.message,
                      ngx_http_rl_retry_ms);
        return NGX_ERROR;
    }

    if (ngx_http_rl_tries > 1) {
        ngx_log_error(NGX_LOG_NOTICE, cycle->log, 0,
                      "rl: the agent opened at try %ui", ngx_http_rl_tries);
    }

    return NGX_OK;
}


/* The agent's descriptor as an nginx read event, level-triggered: what
 * one run leaves ready is run on the next turn. Then a first run, which
 * starts connecting and sets the timer. */
static ngx_int_t
ngx_http_rl_watch_loop(ngx_cycle_t *cycle)
{
    int                fd;
    ngx_connection_t  *c;

    fd = rl_agent_loop_fd(ngx_http_rl_agent);
    if (fd < 0) {
        return NGX_ERROR;
    }

    c = ngx_get_connection(fd, cycle->log);
    if (c == NULL) {
        return NGX_ERROR;
    }

    c->read->handler = ngx_http_rl_loop_handler;
    c->read->log = cycle->log;
    c->write->log = cycle->log;
    c->data = NULL;

    if (ngx_add_event(c->read, NGX_READ_EVENT, NGX_LEVEL_EVENT) != NGX_OK) {
        ngx_free_connection(c);
        return NGX_ERROR;
    }

    ngx_http_rl_loop_conn = c;

    /* not posted: an idle worker may wait in epoll for a long time */
    ngx_http_rl_loop_handler(c->read);

    return NGX_OK;
}


/* The descriptor is the agent's to close: nginx only stops watching it. */
static void
ngx_http_rl_unwatch_loop(void)
{
    ngx_connection_t  *c;

    c = ngx_http_rl_loop_conn;

    if (c != NULL) {
        if (c->read->active) {
            (void) ngx_del_event(c->read, NGX_READ_EVENT, 0);
        }

        c->fd = (ngx_socket_t) -1;
        ngx_free_connection(c);
        ngx_http_rl_loop_conn = NULL;
    }

    if (ngx_http_rl_loop_timer.timer_set) {
        ngx_del_timer(&ngx_http_rl_loop_timer);
    }

    if (ngx_http_rl_loop_now.posted) {
        ngx_delete_posted_event(&ngx_http_rl_loop_now);
    }
}


static void
ngx_http_rl_retry_handler(ngx_event_t *ev)
{
    if (ngx_exiting || ngx_terminate || ngx_quit) {
        return;
    }

    ngx_http_rl_retry_ms = ngx_min(2 * ngx_http_rl_retry_ms,
                                   NGX_HTTP_RL_RETRY_MAX_MS);

    if (ngx_http_rl_open_agent(ev->data) != NGX_OK) {
        ngx_add_timer(ev, ngx_http_rl_retry_ms);
    }
}


static void
ngx_http_rl_exit_process(ngx_cycle_t *cycle)
{
    ngx_http_rl_pending_t  *p, *next;

    /* rl_agent_close runs the agent's loop itself to the end: it decides
     * what still waits (on_error) and sends the synced counts not yet
     * reported. The decisions land in the queue, and with the process
     * going, no request is resumed. */
    ngx_http_rl_unwatch_loop();
    rl_agent_close(ngx_http_rl_agent);
    ngx_http_rl_agent = NULL;

    for (p = ngx_http_rl_take_done(); p != NULL; p = next) {
        next = p->next;

        if (p->hold != NULL) {
            /* ended by the close at its estimate: this only frees it */
            (void) rl_hold_end(p->hold, p->estimate);
        }

        ngx_free(p);
    }
}


/* librl's lines, from the worker's thread (inside rl_agent_run, or in
 * rl_agent_open and rl_agent_close). */
static void
ngx_http_rl_log(rl_log_level level, const char *line, void *arg)
{
    ngx_log_t   *log = arg;
    ngx_uint_t   nlevel;

    switch (level) {
    case RL_LOG_ERROR:
        nlevel = NGX_LOG_ERR;
        break;
    case RL_LOG_WARN:
        nlevel = NGX_LOG_WARN;
        break;
    case RL_LOG_INFO:
        nlevel = NGX_LOG_INFO;
        break;
    default:
        nlevel = NGX_LOG_DEBUG;
        break;
    }

    ngx_log_error(nlevel, log, 0, "rl: %s", line);
}
