/* SPDX-License-Identifier: MIT */
/* check_options.c: the OOC_* options: every option's valid and invalid forms, defaults,
 * overflow, percentages, resolution against a device, unknown-name warnings, and agreement
 * between the options table and README.md. The parser reads values through a callback, so
 * these tests never touch the real environment (except the load tests, which run forked). */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "log.h"
#include "options.h"

Suite *suite_options(void);

/* ---- helpers ------------------------------------------------------------------------------- */

/* A getter over a NULL-terminated list of "NAME=value" strings. */
static const char *list_get(const char *name, void *ctx) {
    const char *const *kv = ctx;
    size_t n = strlen(name);
    for (; *kv; kv++)
        if (strncmp(*kv, name, n) == 0 && (*kv)[n] == '=')
            return *kv + n + 1;
    return NULL;
}

static ooc_options_t opts;
static char err[512];

static int parse_list(const char *const *kv) {
    return ooc_options_parse(list_get, (void *)kv, &opts, err, sizeof err);
}

#define PARSE(...) parse_list((const char *const[]){__VA_ARGS__, NULL})

/* Parses NAME=value alone and returns the result code. */
static int parse1(const char *name, const char *value) {
    char kv[8192];
    snprintf(kv, sizeof kv, "%s=%s", name, value);
    return PARSE(kv);
}

static uint64_t budget_bytes(const char *value) {
    ck_assert_msg(parse1("OOC_BUDGET", value) == 0, "OOC_BUDGET=%s rejected: %s", value, err);
    ck_assert_int_eq(opts.budget.kind, OOC_SIZE_BYTES);
    return opts.budget.bytes;
}

/* Asserts that NAME=value is rejected with `code` and a message that names the variable, the
 * value and the accepted form, and contains `problem`. */
static void expect_bad(const char *name, const char *value, int code, const char *problem) {
    int rc = parse1(name, value);
    ck_assert_msg(rc == code, "%s=%s: got %d, want %d (%s)", name, value, rc, code, err);
    char prefix[256];
    snprintf(prefix, sizeof prefix, "%s=%s: ", name, value);
    ck_assert_msg(strncmp(err, prefix, strlen(prefix)) == 0, "message '%s' lacks '%s'", err,
                  prefix);
    ck_assert_msg(strstr(err, problem), "message '%s' lacks '%s'", err, problem);
    const ooc_option_desc_t *d = ooc_options_find(name);
    ck_assert_ptr_nonnull(d);
    char form[256];
    snprintf(form, sizeof form, "; expected %s", d->accepted);
    ck_assert_msg(strstr(err, form), "message '%s' lacks the accepted form", err);
}

static void expect_choice(const char *name, const char *value, int want, const int *field) {
    ck_assert_msg(parse1(name, value) == 0, "%s=%s rejected: %s", name, value, err);
    ck_assert_int_eq(*field, want);
}

/* ---- defaults ------------------------------------------------------------------------------ */

START_TEST(test_defaults_when_unset) {
    ck_assert_int_eq(ooc_options_parse(NULL, NULL, &opts, err, sizeof err), 0);
    ck_assert_str_eq(err, "");
    ck_assert_int_eq(opts.budget.kind, OOC_SIZE_DEFAULT);
    ck_assert_int_eq(opts.reserve.kind, OOC_SIZE_BYTES);
    ck_assert_uint_eq(opts.reserve.bytes, OOC_GiB);
    ck_assert_int_eq(opts.chunk.kind, OOC_SIZE_AUTO);
    ck_assert_int_eq(opts.window.kind, OOC_SIZE_AUTO);
    ck_assert_int_eq(opts.mode, OOC_MODE_AUTO);
    ck_assert_int_eq(opts.policy, OOC_POLICY_AUTO);
    ck_assert_int_eq(opts.profile_iters, 3);
    ck_assert_int_eq(opts.log_level, OOC_LOG_WARN);
    ck_assert_int_eq(opts.stats, 0);
    ck_assert_int_eq(opts.safe, OOC_SAFE_AUTO);
    ck_assert_str_eq(opts.profile_dir, "");
    ck_assert_str_eq(opts.plan, "");
    ck_assert_str_eq(opts.log_file, "");
    ck_assert_uint_eq(opts.set_mask, 0);
}
END_TEST

START_TEST(test_documented_defaults_parse_to_the_defaults) {
    ooc_options_t def;
    ck_assert_int_eq(ooc_options_parse(NULL, NULL, &def, err, sizeof err), 0);
    size_t n;
    const ooc_option_desc_t *t = ooc_options_table(&n);
    for (size_t i = 0; i < n; i++) {
        if (t[i].dynamic)
            continue;
        ck_assert_msg(parse1(t[i].name, t[i].def) == 0, "default of %s: %s", t[i].name, err);
        opts.set_mask = 0;
        ck_assert_msg(memcmp(&opts, &def, sizeof def) == 0, "%s=%s differs from unset", t[i].name,
                      t[i].def);
    }
}
END_TEST

START_TEST(test_empty_value_counts_as_unset) {
    ck_assert_int_eq(PARSE("OOC_BUDGET=", "OOC_MODE=", "OOC_PROFILE_DIR="), 0);
    ck_assert_int_eq(opts.budget.kind, OOC_SIZE_DEFAULT);
    ck_assert_int_eq(opts.mode, OOC_MODE_AUTO);
    ck_assert_uint_eq(opts.set_mask, 0);
}
END_TEST

START_TEST(test_set_mask_marks_options_given) {
    ck_assert_int_eq(PARSE("OOC_STATS=1", "OOC_MODE=demand"), 0);
    size_t n;
    const ooc_option_desc_t *t = ooc_options_table(&n);
    for (size_t i = 0; i < n; i++) {
        int given = strcmp(t[i].name, "OOC_STATS") == 0 || strcmp(t[i].name, "OOC_MODE") == 0;
        ck_assert_int_eq(!!(opts.set_mask & (UINT32_C(1) << i)), given);
    }
}
END_TEST

/* ---- sizes --------------------------------------------------------------------------------- */

START_TEST(test_budget_accepts_suffixes) {
    ck_assert_uint_eq(budget_bytes("16G"), 16 * OOC_GiB);
    ck_assert_uint_eq(budget_bytes("512M"), 512 * OOC_MiB);
    ck_assert_uint_eq(budget_bytes("4096K"), 4 * OOC_MiB);
    ck_assert_uint_eq(budget_bytes("1T"), OOC_TiB);
    ck_assert_uint_eq(budget_bytes("3145728"), 3 * OOC_MiB);
    ck_assert_uint_eq(budget_bytes("16g"), 16 * OOC_GiB);
    ck_assert_uint_eq(budget_bytes("16GB"), 16 * OOC_GiB);
    ck_assert_uint_eq(budget_bytes("16GiB"), 16 * OOC_GiB);
    ck_assert_uint_eq(budget_bytes("16gib"), 16 * OOC_GiB);
    ck_assert_uint_eq(budget_bytes("4194304B"), 4 * OOC_MiB);
    ck_assert_uint_eq(budget_bytes(" 8G\n"), 8 * OOC_GiB);
}
END_TEST

START_TEST(test_budget_accepts_fractions_with_a_suffix) {
    ck_assert_uint_eq(budget_bytes("1.5G"), 3 * OOC_GiB / 2);
    ck_assert_uint_eq(budget_bytes("0.25T"), OOC_TiB / 4);
    ck_assert_uint_eq(budget_bytes("2.0M"), 2 * OOC_MiB);
    expect_bad("OOC_BUDGET", "1.5", OOC_EINVAL, "not a size"); /* a fraction of a byte */
}
END_TEST

START_TEST(test_budget_accepts_percentages) {
    ck_assert_int_eq(parse1("OOC_BUDGET", "80%"), 0);
    ck_assert_int_eq(opts.budget.kind, OOC_SIZE_PERCENT);
    ck_assert_uint_eq(opts.budget.pct_x100, 8000);
    ck_assert_int_eq(parse1("OOC_BUDGET", "12.5%"), 0);
    ck_assert_uint_eq(opts.budget.pct_x100, 1250);
    ck_assert_int_eq(parse1("OOC_BUDGET", "0.25%"), 0);
    ck_assert_uint_eq(opts.budget.pct_x100, 25);
    ck_assert_int_eq(parse1("OOC_BUDGET", "100%"), 0);
    ck_assert_uint_eq(opts.budget.pct_x100, 10000);
}
END_TEST

START_TEST(test_bad_budget_names_variable_value_and_form) {
    ck_assert_int_eq(parse1("OOC_BUDGET", "12X"), OOC_EINVAL);
    ck_assert_str_eq(err, "OOC_BUDGET=12X: not a size; expected bytes with an optional K/M/G/T "
                          "suffix (e.g. 16G) or a percentage of device memory (e.g. 80%)");
}
END_TEST

START_TEST(test_budget_rejects_malformed_sizes) {
    static const char *const bad[] = {"G",    "-1G",  "+1G",  "1..5G", "1.G",    ".5G",    "0x10",
                                      "16 G", "16GG", "1e9",  "abc",   "16Gx",   "16KiBB", "16P",
                                      "1,5G", "%",    "80%%", "%80",   "1.2.3%", "eighty%"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        expect_bad("OOC_BUDGET", bad[i], OOC_EINVAL, "not a");
}
END_TEST

START_TEST(test_budget_rejects_zero_and_more_than_all_memory) {
    expect_bad("OOC_BUDGET", "0", OOC_ERANGE, "must be more than 0");
    expect_bad("OOC_BUDGET", "0G", OOC_ERANGE, "must be more than 0");
    expect_bad("OOC_BUDGET", "0%", OOC_ERANGE, "must be more than 0");
    expect_bad("OOC_BUDGET", "101%", OOC_ERANGE, "a percentage above 100");
    expect_bad("OOC_BUDGET", "100.5%", OOC_ERANGE, "a percentage above 100");
    expect_bad("OOC_BUDGET", "99999999999999999999999%", OOC_ERANGE, "above 100");
}
END_TEST

START_TEST(test_sizes_that_overflow_are_rejected) {
    ck_assert_uint_eq(budget_bytes("18446744073709551615"), UINT64_MAX);
    ck_assert_uint_eq(budget_bytes("16777215T"), 16777215 * OOC_TiB);
    expect_bad("OOC_BUDGET", "18446744073709551616", OOC_ERANGE, "too large");
    expect_bad("OOC_BUDGET", "16777216T", OOC_ERANGE, "too large");
    expect_bad("OOC_BUDGET", "17179869184G", OOC_ERANGE, "too large");
    ck_assert_uint_eq(budget_bytes("16777215.999999T"),
                      16777215 * OOC_TiB + 999999 * OOC_TiB / 1000000);
    expect_bad("OOC_BUDGET", "16777216.5T", OOC_ERANGE, "too large");
    expect_bad("OOC_BUDGET", "99999999999999999999999999999999G", OOC_ERANGE, "too large");
    expect_bad("OOC_WINDOW", "18446744073709551616", OOC_ERANGE, "too large");
    expect_bad("OOC_RESERVE", "16777216T", OOC_ERANGE, "too large");
    /* A huge number followed by garbage is malformed first. */
    expect_bad("OOC_BUDGET", "99999999999999999999999X", OOC_EINVAL, "not a size");
}
END_TEST

START_TEST(test_parse_size_is_usable_alone) {
    uint64_t b = 0;
    ck_assert_int_eq(ooc_options_parse_size("64K", &b), 0);
    ck_assert_uint_eq(b, 64 * OOC_KiB);
    ck_assert_int_eq(ooc_options_parse_size("64Q", &b), OOC_EINVAL);
    ck_assert_int_eq(ooc_options_parse_size("", &b), OOC_EINVAL);
    ck_assert_int_eq(ooc_options_parse_size("16777216T", &b), OOC_ERANGE);
    char longs[200];
    memset(longs, '1', sizeof longs - 1);
    longs[sizeof longs - 1] = '\0';
    ck_assert_int_lt(ooc_options_parse_size(longs, &b), 0);
}
END_TEST

START_TEST(test_budget_smaller_than_a_chunk_is_rejected) {
    ck_assert_int_eq(PARSE("OOC_BUDGET=1M", "OOC_CHUNK=2M"), OOC_ERANGE);
    ck_assert_ptr_nonnull(strstr(err, "OOC_BUDGET=1M: smaller than one chunk (OOC_CHUNK is 2M)"));
    /* With OOC_CHUNK=auto the chunk follows the budget; only the device's granularity can
     * still exceed it, which start-up reports. */
    ck_assert_int_eq(PARSE("OOC_BUDGET=1M"), 0);
    ck_assert_int_eq(PARSE("OOC_BUDGET=64K", "OOC_CHUNK=64K"), 0);
    ck_assert_uint_eq(opts.budget.bytes, 64 * OOC_KiB);
}
END_TEST

START_TEST(test_reserve_accepts_size_and_percentage) {
    ck_assert_int_eq(parse1("OOC_RESERVE", "0"), 0);
    ck_assert_uint_eq(opts.reserve.bytes, 0);
    ck_assert_int_eq(parse1("OOC_RESERVE", "512M"), 0);
    ck_assert_uint_eq(opts.reserve.bytes, 512 * OOC_MiB);
    ck_assert_int_eq(parse1("OOC_RESERVE", "5%"), 0);
    ck_assert_int_eq(opts.reserve.kind, OOC_SIZE_PERCENT);
    ck_assert_uint_eq(opts.reserve.pct_x100, 500);
    expect_bad("OOC_RESERVE", "lots", OOC_EINVAL, "not a size");
    expect_bad("OOC_RESERVE", "120%", OOC_ERANGE, "a percentage above 100");
}
END_TEST

START_TEST(test_chunk_must_be_a_power_of_two_from_64k_to_1g) {
    ck_assert_int_eq(parse1("OOC_CHUNK", "64K"), 0);
    ck_assert_uint_eq(opts.chunk.bytes, 64 * OOC_KiB);
    ck_assert_int_eq(parse1("OOC_CHUNK", "2M"), 0);
    ck_assert_uint_eq(opts.chunk.bytes, 2 * OOC_MiB);
    ck_assert_int_eq(parse1("OOC_CHUNK", "20m"), OOC_EINVAL);
    ck_assert_int_eq(parse1("OOC_CHUNK", "1G"), 0);
    ck_assert_uint_eq(opts.chunk.bytes, OOC_GiB);
    ck_assert_int_eq(parse1("OOC_CHUNK", "131072"), 0);
    expect_bad("OOC_CHUNK", "3M", OOC_EINVAL, "not a power of two");
    expect_bad("OOC_CHUNK", "32K", OOC_ERANGE, "below the minimum of 64K");
    expect_bad("OOC_CHUNK", "0", OOC_ERANGE, "below the minimum of 64K");
    expect_bad("OOC_CHUNK", "2G", OOC_ERANGE, "above the maximum of 1G");
    expect_bad("OOC_CHUNK", "50%", OOC_EINVAL, "not a size");
    expect_bad("OOC_CHUNK", "autox", OOC_EINVAL, "not a size");
}
END_TEST

START_TEST(test_window_accepts_auto_or_a_size) {
    ck_assert_int_eq(parse1("OOC_WINDOW", "4G"), 0);
    ck_assert_int_eq(opts.window.kind, OOC_SIZE_BYTES);
    ck_assert_uint_eq(opts.window.bytes, 4 * OOC_GiB);
    ck_assert_int_eq(parse1("OOC_WINDOW", "AUTO"), 0);
    ck_assert_int_eq(opts.window.kind, OOC_SIZE_AUTO);
    expect_bad("OOC_WINDOW", "0", OOC_ERANGE, "must be more than 0");
    expect_bad("OOC_WINDOW", "80%", OOC_EINVAL, "not a size");
    expect_bad("OOC_WINDOW", "automatic", OOC_EINVAL, "not a size");
}
END_TEST

/* ---- words, integers, booleans, paths -------------------------------------------------------- */

START_TEST(test_mode_accepts_each_word) {
    expect_choice("OOC_MODE", "off", OOC_MODE_OFF, &opts.mode);
    expect_choice("OOC_MODE", "demand", OOC_MODE_DEMAND, &opts.mode);
    expect_choice("OOC_MODE", "record", OOC_MODE_RECORD, &opts.mode);
    expect_choice("OOC_MODE", "auto", OOC_MODE_AUTO, &opts.mode);
    expect_choice("OOC_MODE", "Demand", OOC_MODE_DEMAND, &opts.mode);
    ck_assert_int_eq(parse1("OOC_MODE", "fast"), OOC_EINVAL);
    ck_assert_str_eq(err,
                     "OOC_MODE=fast: unknown value; expected one of off, demand, record, auto");
    expect_bad("OOC_MODE", "off,demand", OOC_EINVAL, "unknown value");
}
END_TEST

START_TEST(test_policy_accepts_each_word) {
    expect_choice("OOC_POLICY", "swapall", OOC_POLICY_SWAPALL, &opts.policy);
    expect_choice("OOC_POLICY", "lms", OOC_POLICY_LMS, &opts.policy);
    expect_choice("OOC_POLICY", "superneurons", OOC_POLICY_SUPERNEURONS, &opts.policy);
    expect_choice("OOC_POLICY", "window", OOC_POLICY_WINDOW, &opts.policy);
    expect_choice("OOC_POLICY", "pooch", OOC_POLICY_POOCH, &opts.policy);
    expect_choice("OOC_POLICY", "belady", OOC_POLICY_BELADY, &opts.policy);
    expect_choice("OOC_POLICY", "auto", OOC_POLICY_AUTO, &opts.policy);
    expect_bad("OOC_POLICY", "vdnn", OOC_EINVAL, "unknown value");
}
END_TEST

START_TEST(test_safe_accepts_each_word) {
    expect_choice("OOC_SAFE", "auto", OOC_SAFE_AUTO, &opts.safe);
    expect_choice("OOC_SAFE", "on", OOC_SAFE_ON, &opts.safe);
    expect_choice("OOC_SAFE", "off", OOC_SAFE_OFF, &opts.safe);
    expect_bad("OOC_SAFE", "1", OOC_EINVAL, "unknown value");
}
END_TEST

START_TEST(test_log_accepts_each_level) {
    expect_choice("OOC_LOG", "error", OOC_LOG_ERROR, &opts.log_level);
    expect_choice("OOC_LOG", "warn", OOC_LOG_WARN, &opts.log_level);
    expect_choice("OOC_LOG", "info", OOC_LOG_INFO, &opts.log_level);
    expect_choice("OOC_LOG", "debug", OOC_LOG_DEBUG, &opts.log_level);
    expect_bad("OOC_LOG", "verbose", OOC_EINVAL, "unknown value");
    expect_bad("OOC_LOG", "3", OOC_EINVAL, "unknown value");
}
END_TEST

START_TEST(test_stats_accepts_0_and_1) {
    expect_choice("OOC_STATS", "1", 1, &opts.stats);
    expect_choice("OOC_STATS", "0", 0, &opts.stats);
    expect_choice("OOC_STATS", "yes", 1, &opts.stats);
    expect_choice("OOC_STATS", "OFF", 0, &opts.stats);
    expect_bad("OOC_STATS", "2", OOC_EINVAL, "not 0 or 1");
    expect_bad("OOC_STATS", "maybe", OOC_EINVAL, "not 0 or 1");
}
END_TEST

START_TEST(test_profile_iters_is_an_integer_from_1_to_1000) {
    expect_choice("OOC_PROFILE_ITERS", "1", 1, &opts.profile_iters);
    expect_choice("OOC_PROFILE_ITERS", "1000", 1000, &opts.profile_iters);
    expect_choice("OOC_PROFILE_ITERS", " 7 ", 7, &opts.profile_iters);
    expect_bad("OOC_PROFILE_ITERS", "0", OOC_ERANGE, "out of range");
    expect_bad("OOC_PROFILE_ITERS", "1001", OOC_ERANGE, "out of range");
    expect_bad("OOC_PROFILE_ITERS", "99999999999999999999", OOC_ERANGE, "out of range");
    expect_bad("OOC_PROFILE_ITERS", "-1", OOC_EINVAL, "not an integer");
    expect_bad("OOC_PROFILE_ITERS", "3.5", OOC_EINVAL, "not an integer");
    expect_bad("OOC_PROFILE_ITERS", "three", OOC_EINVAL, "not an integer");
    expect_bad("OOC_PROFILE_ITERS", "3K", OOC_EINVAL, "not an integer");
}
END_TEST

START_TEST(test_paths_are_kept_verbatim) {
    ck_assert_int_eq(PARSE("OOC_PROFILE_DIR=/tmp/my profiles/run 1", "OOC_PLAN=plans/a.tsv",
                           "OOC_LOG_FILE=/tmp/ooc.log"),
                     0);
    ck_assert_str_eq(opts.profile_dir, "/tmp/my profiles/run 1");
    ck_assert_str_eq(opts.plan, "plans/a.tsv");
    ck_assert_str_eq(opts.log_file, "/tmp/ooc.log");
    ck_assert_int_eq(parse1("OOC_LOG_FILE", "stderr"), 0);
    ck_assert_str_eq(opts.log_file, "");
}
END_TEST

START_TEST(test_too_long_path_is_rejected_and_cut_in_the_message) {
    static char path[OOC_PATH_MAX + 10];
    memset(path, 'p', sizeof path - 1);
    ck_assert_int_eq(parse1("OOC_PLAN", path), OOC_ERANGE);
    ck_assert_ptr_nonnull(strstr(err, "OOC_PLAN=pppp"));
    ck_assert_ptr_nonnull(strstr(err, "...: longer than 4095 bytes; expected a path"));
    ck_assert_uint_lt(strlen(err), 300);
    path[OOC_PATH_MAX - 1] = '\0';
    ck_assert_int_eq(parse1("OOC_PLAN", path), 0);
    ck_assert_uint_eq(strlen(opts.plan), OOC_PATH_MAX - 1);
}
END_TEST

START_TEST(test_control_characters_in_a_value_are_masked) {
    ck_assert_int_eq(parse1("OOC_MODE", "de\033[2Jmand"), OOC_EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "OOC_MODE=de?[2Jmand: unknown value"));
}
END_TEST

START_TEST(test_first_bad_value_is_reported_and_good_ones_kept) {
    ck_assert_int_eq(PARSE("OOC_STATS=1", "OOC_MODE=bogus", "OOC_CHUNK=3M", "OOC_POLICY=lms"),
                     OOC_EINVAL);
    /* Table order: OOC_CHUNK comes before OOC_MODE. */
    ck_assert_int_eq(strncmp(err, "OOC_CHUNK=3M: ", 14), 0);
    ck_assert_int_eq(opts.stats, 1);
    ck_assert_int_eq(opts.policy, OOC_POLICY_LMS);
}
END_TEST

START_TEST(test_error_message_fits_a_small_buffer) {
    char small[16];
    memset(small, 'z', sizeof small);
    const char *const kv[] = {"OOC_BUDGET=12X", NULL};
    ck_assert_int_eq(ooc_options_parse(list_get, (void *)kv, &opts, small, sizeof small),
                     OOC_EINVAL);
    ck_assert_str_eq(small, "OOC_BUDGET=12X:");
    ck_assert_int_eq(ooc_options_parse(list_get, (void *)kv, &opts, NULL, 0), OOC_EINVAL);
}
END_TEST

/* ---- resolution against a device ----------------------------------------------------------- */

START_TEST(test_budget_resolves_bytes_percentage_and_default) {
    const uint64_t total = 80 * OOC_GiB, free_bytes = 79 * OOC_GiB;
    ck_assert_int_eq(PARSE("OOC_BUDGET=16G"), 0);
    ck_assert_uint_eq(ooc_options_budget_bytes(&opts, total, free_bytes), 16 * OOC_GiB);
    ck_assert_int_eq(PARSE("OOC_BUDGET=80%"), 0);
    ck_assert_uint_eq(ooc_options_budget_bytes(&opts, total, free_bytes), 64 * OOC_GiB);
    ck_assert_int_eq(PARSE("OOC_BUDGET=100%"), 0);
    ck_assert_uint_eq(ooc_options_budget_bytes(&opts, UINT64_MAX, 0), UINT64_MAX);
    ck_assert_int_eq(PARSE("OOC_BUDGET=12.5%"), 0);
    ck_assert_uint_eq(ooc_options_budget_bytes(&opts, 1000, 0), 125);
    /* Unset: what is free less the reserve. */
    ck_assert_int_eq(PARSE("OOC_MODE=auto"), 0);
    ck_assert_uint_eq(ooc_options_budget_bytes(&opts, total, free_bytes), 78 * OOC_GiB);
    ck_assert_int_eq(PARSE("OOC_RESERVE=10%"), 0);
    ck_assert_uint_eq(ooc_options_reserve_bytes(&opts, total), 8 * OOC_GiB);
    ck_assert_uint_eq(ooc_options_budget_bytes(&opts, total, free_bytes), 71 * OOC_GiB);
    ck_assert_int_eq(PARSE("OOC_RESERVE=2G"), 0);
    ck_assert_uint_eq(ooc_options_budget_bytes(&opts, total, OOC_GiB), 0);
}
END_TEST

START_TEST(test_chunk_rounds_up_to_the_device_granularity) {
    ck_assert_int_eq(PARSE("OOC_CHUNK=64K"), 0);
    ck_assert_uint_eq(ooc_options_chunk_bytes(&opts, 2 * OOC_MiB, OOC_GiB), 2 * OOC_MiB);
    ck_assert_uint_eq(ooc_options_chunk_bytes(&opts, 0, OOC_GiB), 64 * OOC_KiB);
    ck_assert_int_eq(PARSE("OOC_CHUNK=16M"), 0);
    ck_assert_uint_eq(ooc_options_chunk_bytes(&opts, 2 * OOC_MiB, 8 * OOC_GiB), 16 * OOC_MiB);
}
END_TEST

/* auto: the largest power of two leaving 256 chunks in the budget, 32 MiB at most, never below
 * the granularity (nor 64K). */
START_TEST(test_chunk_auto_follows_the_budget) {
    ck_assert_int_eq(PARSE("OOC_CHUNK=auto"), 0);
    ck_assert_int_eq(opts.chunk.kind, OOC_SIZE_AUTO);
    ck_assert_uint_eq(ooc_options_chunk_bytes(&opts, 2 * OOC_MiB, 8 * OOC_GiB), 32 * OOC_MiB);
    ck_assert_uint_eq(ooc_options_chunk_bytes(&opts, 2 * OOC_MiB, 80 * OOC_GiB), 32 * OOC_MiB);
    ck_assert_uint_eq(ooc_options_chunk_bytes(&opts, 2 * OOC_MiB, 4 * OOC_GiB), 16 * OOC_MiB);
    ck_assert_uint_eq(ooc_options_chunk_bytes(&opts, 2 * OOC_MiB, 3 * OOC_GiB - 1), 8 * OOC_MiB);
    ck_assert_uint_eq(ooc_options_chunk_bytes(&opts, 2 * OOC_MiB, OOC_GiB), 4 * OOC_MiB);
    ck_assert_uint_eq(ooc_options_chunk_bytes(&opts, 2 * OOC_MiB, 64 * OOC_MiB), 2 * OOC_MiB);
    ck_assert_uint_eq(ooc_options_chunk_bytes(&opts, 64 * OOC_KiB, 64 * OOC_MiB), 256 * OOC_KiB);
    ck_assert_uint_eq(ooc_options_chunk_bytes(&opts, 0, OOC_MiB), 64 * OOC_KiB);
    ck_assert_int_eq(PARSE(NULL), 0);
    ck_assert_uint_eq(ooc_options_chunk_bytes(&opts, 2 * OOC_MiB, 8 * OOC_GiB), 32 * OOC_MiB);
    /* With auto, a budget below the granularity is init's error, not the parser's. */
    ck_assert_int_eq(PARSE("OOC_BUDGET=64K"), 0);
}
END_TEST

START_TEST(test_window_auto_resolves_to_zero) {
    ck_assert_int_eq(PARSE("OOC_MODE=auto"), 0);
    ck_assert_uint_eq(ooc_options_window_bytes(&opts), 0);
    ck_assert_int_eq(PARSE("OOC_WINDOW=512M"), 0);
    ck_assert_uint_eq(ooc_options_window_bytes(&opts), 512 * OOC_MiB);
}
END_TEST

START_TEST(test_profile_dir_defaults_to_program_and_pid) {
    char dir[256], want[256];
    ck_assert_int_eq(PARSE("OOC_MODE=auto"), 0);
    ck_assert_int_eq(ooc_options_profile_dir(&opts, dir, sizeof dir), 0);
    snprintf(want, sizeof want, "./ooc-profiles/%s-%ld", program_invocation_short_name,
             (long)getpid());
    ck_assert_str_eq(dir, want);
    ck_assert_int_eq(ooc_options_profile_dir(&opts, dir, 10), OOC_ERANGE);
    ck_assert_int_eq(PARSE("OOC_PROFILE_DIR=/data/prof"), 0);
    ck_assert_int_eq(ooc_options_profile_dir(&opts, dir, sizeof dir), 0);
    ck_assert_str_eq(dir, "/data/prof");
}
END_TEST

START_TEST(test_choice_names_match_the_table) {
    ck_assert_str_eq(ooc_mode_name(OOC_MODE_RECORD), "record");
    ck_assert_str_eq(ooc_policy_name(OOC_POLICY_SUPERNEURONS), "superneurons");
    ck_assert_str_eq(ooc_safe_name(OOC_SAFE_OFF), "off");
    ck_assert_str_eq(ooc_mode_name(42), "?");
    ck_assert_str_eq(ooc_policy_name(-1), "?");
}
END_TEST

/* ---- the table, unknown names, README.md ----------------------------------------------------- */

START_TEST(test_table_rows_are_complete_and_unique) {
    size_t n;
    const ooc_option_desc_t *t = ooc_options_table(&n);
    ck_assert_uint_ge(n, 13);
    for (size_t i = 0; i < n; i++) {
        ck_assert_int_eq(strncmp(t[i].name, "OOC_", 4), 0);
        ck_assert_ptr_eq(ooc_options_find(t[i].name), &t[i]);
        ck_assert_msg(t[i].def && *t[i].def, "%s has no default", t[i].name);
        ck_assert_msg(t[i].accepted && *t[i].accepted, "%s has no accepted form", t[i].name);
        ck_assert_msg(t[i].doc && *t[i].doc, "%s has no documentation", t[i].name);
        ck_assert_msg(!strchr(t[i].def, '|') && !strchr(t[i].accepted, '|') &&
                          !strchr(t[i].doc, '|'),
                      "%s: a '|' would break README.md's table", t[i].name);
        for (size_t j = 0; t[i].choices && t[i].choices[j]; j++)
            ck_assert_msg(strstr(t[i].accepted, t[i].choices[j]), "%s: '%s' not in '%s'", t[i].name,
                          t[i].choices[j], t[i].accepted);
    }
    static const char *const required[] = {
        "OOC_BUDGET", "OOC_RESERVE",     "OOC_CHUNK",         "OOC_WINDOW", "OOC_MODE",
        "OOC_POLICY", "OOC_PROFILE_DIR", "OOC_PROFILE_ITERS", "OOC_PLAN",   "OOC_LOG",
        "OOC_STATS",  "OOC_SAFE",        "OOC_LOG_FILE"};
    for (size_t i = 0; i < sizeof required / sizeof required[0]; i++)
        ck_assert_msg(ooc_options_find(required[i]), "%s missing", required[i]);
    ck_assert_ptr_null(ooc_options_find("OOC_BUDGE"));
}
END_TEST

static int log_pipe[2] = {-1, -1};

static void log_setup(void) {
    ck_assert_int_eq(pipe2(log_pipe, O_NONBLOCK | O_CLOEXEC), 0);
    ooc_log_set_fd(log_pipe[1]);
}

static void log_teardown(void) {
    ooc_log_set_fd(STDERR_FILENO);
    ooc_log_set_level(OOC_LOG_WARN);
    close(log_pipe[0]);
    close(log_pipe[1]);
}

static const char *log_text(void) {
    static char buf[8192];
    ssize_t r = read(log_pipe[0], buf, sizeof buf - 1);
    buf[r > 0 ? r : 0] = '\0';
    return buf;
}

START_TEST(test_unknown_ooc_variable_is_warned_by_name) {
    const char *env[] = {"PATH=/bin",        "OOC_BUGDET=16G",  "OOC_BUDGET=8G",
                         "OOC_TEST_SEED=42", "OOC_BUILD=build", "OOC_ZZZZZZZZ=1",
                         "OOC_MODE",         "OOC_LOG_FILES=x", NULL};
    ck_assert_uint_eq(ooc_options_warn_unknown(env), 3);
    const char *out = log_text();
    ck_assert_msg(strstr(out, "OOC_BUGDET is not an ooc-shim option and is ignored; did you mean "
                              "OOC_BUDGET?"),
                  "got:\n%s", out);
    ck_assert_msg(strstr(out, "OOC_LOG_FILES is not an ooc-shim option and is ignored; did you "
                              "mean OOC_LOG_FILE?"),
                  "got:\n%s", out);
    ck_assert_ptr_nonnull(strstr(out, "OOC_ZZZZZZZZ is not an ooc-shim option and is ignored; "
                                      "see README.md"));
    ck_assert_ptr_null(strstr(out, "OOC_TEST_SEED"));
    ck_assert_ptr_null(strstr(out, "OOC_BUILD"));
    ck_assert_ptr_nonnull(strstr(out, "] W options.c:"));
    ck_assert_uint_eq(ooc_options_warn_unknown(NULL), 0);
}
END_TEST

/* The load tests read the real environment once per process: they need a fresh (forked) child. */
static int forked(void) {
    const char *f = getenv("CK_FORK");
    return !(f && strcmp(f, "no") == 0);
}

START_TEST(test_load_reads_the_environment_once) {
    if (!forked())
        return;
    setenv("OOC_MODE", "demand", 1);
    setenv("OOC_LOG", "debug", 1);
    setenv("OOC_BUDGT", "1G", 1);
    ck_assert_int_eq(ooc_options_load(), 0);
    ck_assert_str_eq(ooc_options_error(), "");
    ck_assert_int_eq(ooc_options()->mode, OOC_MODE_DEMAND);
    ck_assert_int_eq(ooc_log_level(), OOC_LOG_DEBUG);
    ck_assert_ptr_nonnull(strstr(log_text(), "OOC_BUDGT is not an ooc-shim option"));
    setenv("OOC_MODE", "off", 1);
    ck_assert_int_eq(ooc_options_load(), 0);
    ck_assert_int_eq(ooc_options()->mode, OOC_MODE_DEMAND);
}
END_TEST

START_TEST(test_load_reports_a_bad_value_and_keeps_defaults) {
    if (!forked())
        return;
    setenv("OOC_BUDGET", "12X", 1);
    setenv("OOC_MODE", "demand", 1);
    ck_assert_int_eq(ooc_options_load(), OOC_EINVAL);
    ck_assert_int_eq(strncmp(ooc_options_error(), "OOC_BUDGET=12X: not a size", 26), 0);
    ck_assert_int_eq(ooc_options()->mode, OOC_MODE_AUTO);
    const char *out = log_text();
    ck_assert_msg(strstr(out, "] E options.c:") && strstr(out, ": OOC_BUDGET=12X: not a size;"),
                  "got:\n%s", out);
}
END_TEST

START_TEST(test_load_sends_the_log_to_OOC_LOG_FILE) {
    if (!forked())
        return;
    char path[] = "/tmp/ooc-log-XXXXXX";
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    setenv("OOC_LOG_FILE", path, 1);
    setenv("OOC_TYPO_HERE", "1", 1);
    ck_assert_int_eq(ooc_options_load(), 0);
    char buf[1024] = {0};
    ssize_t r = read(fd, buf, sizeof buf - 1);
    unlink(path);
    close(fd);
    ck_assert_int_gt(r, 0);
    ck_assert_ptr_nonnull(strstr(buf, "OOC_TYPO_HERE is not an ooc-shim option"));
}
END_TEST

START_TEST(test_load_rejects_an_unwritable_OOC_LOG_FILE) {
    if (!forked())
        return;
    setenv("OOC_LOG_FILE", "/nonexistent-dir/ooc.log", 1);
    ck_assert_int_eq(ooc_options_load(), OOC_EIO);
    ck_assert_ptr_nonnull(strstr(ooc_options_error(), "OOC_LOG_FILE=/nonexistent-dir/ooc.log: "
                                                      "cannot open for appending ("));
}
END_TEST

/* Checks that path has one "| `OOC_NAME` | default |" row per option of the table, whose default
 * cell (backticks removed) is the table's default, and no row for an option the table lacks. */
static void check_doc(const char *path) {
    FILE *f = fopen(path, "r");
    ck_assert_msg(f != NULL, "cannot open %s (tests run from the repository root)", path);
    size_t n;
    const ooc_option_desc_t *t = ooc_options_table(&n);
    int seen[64] = {0};
    char line[4096];
    int lineno = 0;
    while (fgets(line, sizeof line, f)) {
        lineno++;
        if (strncmp(line, "| `OOC_", 7) != 0)
            continue;
        char *name = line + 3;
        char *tick = strchr(name, '`');
        ck_assert_msg(tick != NULL, "%s:%d: unterminated name", path, lineno);
        *tick = '\0';
        const ooc_option_desc_t *d = ooc_options_find(name);
        ck_assert_msg(d != NULL, "%s:%d: documents %s, which is no option", path, lineno, name);
        size_t i = (size_t)(d - t);
        ck_assert_msg(!seen[i], "%s:%d: documents %s twice", path, lineno, name);
        seen[i] = 1;
        /* The default cell: between the second and third '|', without backticks and spaces. */
        char *cell = strchr(tick + 1, '|');
        ck_assert_msg(cell != NULL, "%s:%d: no default cell", path, lineno);
        cell++;
        char *end = strchr(cell, '|');
        ck_assert_msg(end != NULL, "%s:%d: no cell after the default", path, lineno);
        char def[512];
        size_t k = 0;
        for (char *p = cell; p < end && k < sizeof def - 1; p++)
            if (*p != '`')
                def[k++] = *p;
        while (k > 0 && def[k - 1] == ' ')
            k--;
        def[k] = '\0';
        char *d0 = def;
        while (*d0 == ' ')
            d0++;
        ck_assert_msg(strcmp(d0, d->def) == 0, "%s:%d: %s's default is '%s', the table says '%s'",
                      path, lineno, name, d0, d->def);
    }
    fclose(f);
    for (size_t i = 0; i < n; i++)
        ck_assert_msg(seen[i], "%s has no row \"| `%s` |\"", path, t[i].name);
}

START_TEST(test_readme_documents_every_option) {
    check_doc("README.md");
}
END_TEST

Suite *suite_options(void) {
    Suite *s = suite_create("options");

    TCase *tc = tcase_create("parse");
    tcase_set_timeout(tc, 10);
    tcase_add_test(tc, test_defaults_when_unset);
    tcase_add_test(tc, test_documented_defaults_parse_to_the_defaults);
    tcase_add_test(tc, test_empty_value_counts_as_unset);
    tcase_add_test(tc, test_set_mask_marks_options_given);
    tcase_add_test(tc, test_budget_accepts_suffixes);
    tcase_add_test(tc, test_budget_accepts_fractions_with_a_suffix);
    tcase_add_test(tc, test_budget_accepts_percentages);
    tcase_add_test(tc, test_bad_budget_names_variable_value_and_form);
    tcase_add_test(tc, test_budget_rejects_malformed_sizes);
    tcase_add_test(tc, test_budget_rejects_zero_and_more_than_all_memory);
    tcase_add_test(tc, test_sizes_that_overflow_are_rejected);
    tcase_add_test(tc, test_parse_size_is_usable_alone);
    tcase_add_test(tc, test_budget_smaller_than_a_chunk_is_rejected);
    tcase_add_test(tc, test_reserve_accepts_size_and_percentage);
    tcase_add_test(tc, test_chunk_must_be_a_power_of_two_from_64k_to_1g);
    tcase_add_test(tc, test_window_accepts_auto_or_a_size);
    tcase_add_test(tc, test_mode_accepts_each_word);
    tcase_add_test(tc, test_policy_accepts_each_word);
    tcase_add_test(tc, test_safe_accepts_each_word);
    tcase_add_test(tc, test_log_accepts_each_level);
    tcase_add_test(tc, test_stats_accepts_0_and_1);
    tcase_add_test(tc, test_profile_iters_is_an_integer_from_1_to_1000);
    tcase_add_test(tc, test_paths_are_kept_verbatim);
    tcase_add_test(tc, test_too_long_path_is_rejected_and_cut_in_the_message);
    tcase_add_test(tc, test_control_characters_in_a_value_are_masked);
    tcase_add_test(tc, test_first_bad_value_is_reported_and_good_ones_kept);
    tcase_add_test(tc, test_error_message_fits_a_small_buffer);
    suite_add_tcase(s, tc);

    tc = tcase_create("resolve");
    tcase_set_timeout(tc, 10);
    tcase_add_test(tc, test_budget_resolves_bytes_percentage_and_default);
    tcase_add_test(tc, test_chunk_rounds_up_to_the_device_granularity);
    tcase_add_test(tc, test_chunk_auto_follows_the_budget);
    tcase_add_test(tc, test_window_auto_resolves_to_zero);
    tcase_add_test(tc, test_profile_dir_defaults_to_program_and_pid);
    tcase_add_test(tc, test_choice_names_match_the_table);
    suite_add_tcase(s, tc);

    tc = tcase_create("environment");
    tcase_set_timeout(tc, 10);
    tcase_add_checked_fixture(tc, log_setup, log_teardown);
    tcase_add_test(tc, test_table_rows_are_complete_and_unique);
    tcase_add_test(tc, test_unknown_ooc_variable_is_warned_by_name);
    tcase_add_test(tc, test_load_reads_the_environment_once);
    tcase_add_test(tc, test_load_reports_a_bad_value_and_keeps_defaults);
    tcase_add_test(tc, test_load_sends_the_log_to_OOC_LOG_FILE);
    tcase_add_test(tc, test_load_rejects_an_unwritable_OOC_LOG_FILE);
    tcase_add_test(tc, test_readme_documents_every_option);
    suite_add_tcase(s, tc);
    return s;
}
