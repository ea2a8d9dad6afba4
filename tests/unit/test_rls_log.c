/*
 * LOG_FORMAT=json (rls/rls_log.c): rl's key=value lines as logrus's JSON
 * objects, byte for byte: the fields, quoted values holding quotes and
 * spaces, logrus's reserved keys, escapes, bytes that are not UTF-8, and
 * a line rl_log cut.
 */
#include "rls_log.h"

#include <criterion/criterion.h>
#include <string.h>

static const char *json(rl_log_level level, const char *line)
{
    static char buf[RLS_LOG_JSON_MAX + 1];
    struct timespec t = {1700000000, 120000000};
    cr_assert_gt(rls_log_json_format(level, line, &t, buf, sizeof buf), 0);
    return buf;
}

Test(rls_log, pairs_as_fields_event_as_msg_logrus_level_and_time)
{
    cr_assert_str_eq(json(RL_LOG_WARN, "event=listening grpc=127.0.0.1:81 "
                                       "workers=2"),
                     "{\"level\":\"warning\",\"msg\":\"listening\","
                     "\"time\":\"2023-11-14T22:13:20.12Z\","
                     "\"event\":\"listening\",\"grpc\":\"127.0.0.1:81\","
                     "\"workers\":\"2\"}");
    struct timespec whole = {0, 0};
    char buf[256];
    cr_assert_gt(rls_log_json_format(RL_LOG_DEBUG, "event=x", &whole, buf,
                                     sizeof buf), 0);
    cr_assert_str_eq(buf, "{\"level\":\"debug\",\"msg\":\"x\","
                          "\"time\":\"1970-01-01T00:00:00Z\","
                          "\"event\":\"x\"}");
}

Test(rls_log, quoted_values_words_and_reserved_keys)
{
    cr_assert_str_eq(
        json(RL_LOG_ERROR, "event=config_refused why=change reason=\"a \"b\" "
                           "c\\d\" kept=previous"),
        "{\"level\":\"error\",\"msg\":\"config_refused\","
        "\"time\":\"2023-11-14T22:13:20.12Z\",\"event\":\"config_refused\","
        "\"why\":\"change\",\"reason\":\"a \\\"b\\\" c\\\\d\","
        "\"kept\":\"previous\"}");
    cr_assert_str_eq(
        json(RL_LOG_INFO, "event=setting_without_effect REDIS_POOL_SIZE has "
                          "no effect level=x time=y msg=z"),
        "{\"level\":\"info\",\"msg\":\"setting_without_effect "
        "REDIS_POOL_SIZE has no effect\","
        "\"time\":\"2023-11-14T22:13:20.12Z\","
        "\"event\":\"setting_without_effect\",\"fields.level\":\"x\","
        "\"fields.time\":\"y\",\"fields.msg\":\"z\"}");
}

Test(rls_log, control_bytes_escaped_bad_utf8_replaced_cut_quote_closed)
{
    cr_assert_str_eq(
        json(RL_LOG_INFO, "event=e v=\"\x01\t\nok\xc3\xa9\xff\xc0\xaf\""),
        "{\"level\":\"info\",\"msg\":\"e\","
        "\"time\":\"2023-11-14T22:13:20.12Z\",\"event\":\"e\","
        "\"v\":\"\\u0001\\u0009\\u000aok\xc3\xa9\\ufffd\\ufffd\\ufffd\"}");
    cr_assert_str_eq(json(RL_LOG_INFO, "event=e reason=\"cut in the mid..."),
                     "{\"level\":\"info\",\"msg\":\"e\","
                     "\"time\":\"2023-11-14T22:13:20.12Z\",\"event\":\"e\","
                     "\"reason\":\"cut in the mid...\"}");
    char small[40];
    struct timespec t = {0, 0};
    cr_assert_eq(rls_log_json_format(RL_LOG_INFO, "event=long", &t, small,
                                     sizeof small), 0);
}
