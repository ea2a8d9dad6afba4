/* Periods: every unit, and every way of writing one wrong. */
#include "duration.h"
#include "rl.h"

#include <criterion/criterion.h>

static uint64_t parsed(const char *text)
{
    uint64_t ms = 0;
    cr_assert_eq(rl_duration_parse(text, &ms), RL_OK, "'%s' should parse",
                 text);
    return ms;
}

Test(duration, every_unit_is_whole_milliseconds)
{
    cr_assert_eq(parsed("500ms"), 500);
    cr_assert_eq(parsed("1s"), 1000);
    cr_assert_eq(parsed("90s"), 90000);
    cr_assert_eq(parsed("1m"), 60000);
    cr_assert_eq(parsed("1h"), 3600000);
    cr_assert_eq(parsed("1d"), 86400000);
    cr_assert_eq(parsed("366d"), RL_DURATION_MAX_MS);
}

Test(duration, malformed_or_out_of_range_periods_are_refused)
{
    const char *bad[] = {"", "0s", "0ms", "1", "60", "s", "1x", "1 s", " 1s",
                         "1s ", "-1s", "+1s", "1.5s", "1S", "1sec", "367d",
                         "8785h", "99999999999999999999999ms", "1ms1"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        uint64_t ms = 7;
        cr_assert_eq(rl_duration_parse(bad[i], &ms), RL_EINVAL,
                     "'%s' should be refused", bad[i]);
        cr_assert_eq(ms, 7, "'%s' changed the output", bad[i]);
    }
}

Test(duration, formats_in_the_largest_exact_unit)
{
    char buf[24];
    rl_duration_format(60000, buf, sizeof buf);
    cr_assert_str_eq(buf, "1m");
    rl_duration_format(1500, buf, sizeof buf);
    cr_assert_str_eq(buf, "1500ms");
    rl_duration_format(7200000, buf, sizeof buf);
    cr_assert_str_eq(buf, "2h");
    rl_duration_format(86400000, buf, sizeof buf);
    cr_assert_str_eq(buf, "1d");
}
