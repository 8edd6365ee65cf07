/* SPDX-License-Identifier: MIT */
/* check_log.c: the log's line format, level gating, per-site caps and single-write lines. */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "log.h"

Suite *suite_log(void);

static int pipe_fd[2] = {-1, -1};

/* Every test logs into a non-blocking pipe and reads back what was written. */
static void setup(void) {
    ck_assert_int_eq(pipe2(pipe_fd, O_NONBLOCK | O_CLOEXEC), 0);
    ooc_log_set_fd(pipe_fd[1]);
    ooc_log_set_level(OOC_LOG_WARN);
}

static void teardown(void) {
    ooc_log_set_fd(STDERR_FILENO);
    ooc_log_set_level(OOC_LOG_WARN);
    close(pipe_fd[0]);
    close(pipe_fd[1]);
}

/* Everything written so far, NUL-terminated, in a static buffer. */
static const char *drain(void) {
    static char buf[1 << 16];
    size_t n = 0;
    for (;;) {
        ssize_t r = read(pipe_fd[0], buf + n, sizeof buf - 1 - n);
        if (r <= 0)
            break;
        n += (size_t)r;
    }
    buf[n] = '\0';
    return buf;
}

static int count_lines(const char *s) {
    int n = 0;
    for (; *s; s++)
        n += *s == '\n';
    return n;
}

static int count_of(const char *s, const char *needle) {
    int n = 0;
    for (const char *p = s; (p = strstr(p, needle)) != NULL; p++)
        n++;
    return n;
}

START_TEST(test_line_has_pid_level_file_line_and_message) {
    int line = __LINE__ + 1;
    OOC_LOG_W("hello %d %s", 42, "world");
    char want[128];
    snprintf(want, sizeof want, "ooc[%ld] W check_log.c:%d: hello 42 world\n", (long)getpid(),
             line);
    ck_assert_str_eq(drain(), want);
}
END_TEST

START_TEST(test_each_level_has_its_letter) {
    ooc_log_set_level(OOC_LOG_DEBUG);
    OOC_LOG_E("e");
    OOC_LOG_W("w");
    OOC_LOG_I("i");
    OOC_LOG_D("d");
    const char *out = drain();
    ck_assert_int_eq(count_lines(out), 4);
    char tag[32];
    const char letters[] = "EWID";
    for (int i = 0; i < 4; i++) {
        snprintf(tag, sizeof tag, "] %c check_log.c:", letters[i]);
        ck_assert_msg(strstr(out, tag), "no line tagged %c in:\n%s", letters[i], out);
    }
    ck_assert_int_eq(ooc_log_letter(OOC_LOG_INFO), 'I');
    ck_assert_int_eq(ooc_log_letter(7), '?');
}
END_TEST

START_TEST(test_level_gates_less_severe_lines) {
    OOC_LOG_E("e1");
    OOC_LOG_W("w1");
    OOC_LOG_I("i1");
    OOC_LOG_D("d1");
    const char *out = drain();
    ck_assert_int_eq(count_lines(out), 2);
    ck_assert_ptr_nonnull(strstr(out, ": e1\n"));
    ck_assert_ptr_nonnull(strstr(out, ": w1\n"));

    ooc_log_set_level(OOC_LOG_ERROR);
    OOC_LOG_W("w2");
    OOC_LOG_E("e2");
    out = drain();
    ck_assert_int_eq(count_lines(out), 1);
    ck_assert_ptr_nonnull(strstr(out, ": e2\n"));

    ooc_log_set_level(OOC_LOG_INFO);
    OOC_LOG_I("i3");
    OOC_LOG_D("d3");
    out = drain();
    ck_assert_int_eq(count_lines(out), 1);
    ck_assert_ptr_nonnull(strstr(out, ": i3\n"));
}
END_TEST

static int evaluated;
static int side_effect(void) {
    return ++evaluated;
}

START_TEST(test_disabled_level_does_not_evaluate_arguments) {
    evaluated = 0;
    OOC_LOG_D("%d", side_effect());
    OOC_LOG_I("%d", side_effect());
    ck_assert_int_eq(evaluated, 0);
    OOC_LOG_W("%d", side_effect());
    ck_assert_int_eq(evaluated, 1);
    drain();
}
END_TEST

static void warn_from_one_site(int i) {
    OOC_LOG_W("repeated %d", i);
}

START_TEST(test_repeated_warnings_are_capped_per_call_site) {
    for (int i = 0; i < 3 * OOC_LOG_CAP; i++)
        warn_from_one_site(i);
    const char *out = drain();
    ck_assert_int_eq(count_of(out, ": repeated "), OOC_LOG_CAP);
    ck_assert_int_eq(count_of(out, "further warnings from here suppressed\n"), 1);
    ck_assert_int_eq(count_lines(out), OOC_LOG_CAP + 1);
    /* The suppression line comes last, tagged like a warning from the same site. */
    ck_assert_ptr_nonnull(strstr(out, "] W check_log.c:"));
    /* Another call site is not affected. */
    OOC_LOG_W("elsewhere");
    ck_assert_int_eq(count_lines(drain()), 1);
}
END_TEST

START_TEST(test_repeated_errors_are_capped_too) {
    for (int i = 0; i < OOC_LOG_CAP + 5; i++)
        OOC_LOG_E("again");
    const char *out = drain();
    ck_assert_int_eq(count_of(out, ": again\n"), OOC_LOG_CAP);
    ck_assert_int_eq(count_of(out, "further errors from here suppressed\n"), 1);
}
END_TEST

START_TEST(test_debug_lines_are_never_capped) {
    ooc_log_set_level(OOC_LOG_DEBUG);
    for (int i = 0; i < 3 * OOC_LOG_CAP; i++)
        OOC_LOG_D("d%d", i);
    ck_assert_int_eq(count_lines(drain()), 3 * OOC_LOG_CAP);
}
END_TEST

START_TEST(test_long_message_is_cut_with_ellipsis) {
    static char big[3 * OOC_LOG_LINE_MAX];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    OOC_LOG_W("%s", big);
    const char *out = drain();
    ck_assert_uint_eq(strlen(out), OOC_LOG_LINE_MAX);
    ck_assert_str_eq(out + OOC_LOG_LINE_MAX - 5, "x...\n");
    ck_assert_int_eq(count_lines(out), 1);
}
END_TEST

START_TEST(test_trailing_newline_is_not_doubled) {
    OOC_LOG_W("ends in newline\n");
    const char *out = drain();
    ck_assert_int_eq(count_lines(out), 1);
    ck_assert_ptr_nonnull(strstr(out, ": ends in newline\n"));
}
END_TEST

START_TEST(test_logging_preserves_errno) {
    errno = ERANGE;
    ooc_log_set_fd(-1); /* the write fails with EBADF, which must not leak out */
    OOC_LOG_W("into a closed descriptor");
    ck_assert_int_eq(errno, ERANGE);
}
END_TEST

START_TEST(test_set_level_clamps_and_returns_previous) {
    ck_assert_int_eq(ooc_log_set_level(OOC_LOG_DEBUG), OOC_LOG_WARN);
    ck_assert_int_eq(ooc_log_level(), OOC_LOG_DEBUG);
    ooc_log_set_level(99);
    ck_assert_int_eq(ooc_log_level(), OOC_LOG_DEBUG);
    ooc_log_set_level(-4);
    ck_assert_int_eq(ooc_log_level(), OOC_LOG_ERROR);
}
END_TEST

START_TEST(test_set_fd_returns_previous) {
    ck_assert_int_eq(ooc_log_set_fd(STDERR_FILENO), pipe_fd[1]);
    ck_assert_int_eq(ooc_log_set_fd(pipe_fd[1]), STDERR_FILENO);
}
END_TEST

enum { THREADS = 4, LINES_PER_THREAD = 100 };

static void *log_many(void *arg) {
    long id = (long)arg;
    for (int i = 0; i < LINES_PER_THREAD; i++)
        OOC_LOG_D("thread %ld line %d with some padding to make it longer", id, i);
    return NULL;
}

START_TEST(test_concurrent_lines_never_interleave) {
    ooc_log_set_level(OOC_LOG_DEBUG);
    pthread_t t[THREADS];
    for (long i = 0; i < THREADS; i++)
        ck_assert_int_eq(pthread_create(&t[i], NULL, log_many, (void *)i), 0);
    for (int i = 0; i < THREADS; i++)
        pthread_join(t[i], NULL);
    const char *out = drain();
    ck_assert_int_eq(count_lines(out), THREADS * LINES_PER_THREAD);
    /* Each line is whole: it starts with the prefix and has exactly one of each part. */
    for (const char *p = out; *p;) {
        const char *nl = strchr(p, '\n');
        ck_assert_ptr_nonnull(nl);
        ck_assert_int_eq(strncmp(p, "ooc[", 4), 0);
        const char *pad = strstr(p, " with some padding to make it longer\n");
        ck_assert_ptr_eq(pad + strlen(" with some padding to make it longer"), nl);
        p = nl + 1;
    }
}
END_TEST

Suite *suite_log(void) {
    Suite *s = suite_create("log");
    TCase *tc = tcase_create("log");
    tcase_set_timeout(tc, 10);
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_line_has_pid_level_file_line_and_message);
    tcase_add_test(tc, test_each_level_has_its_letter);
    tcase_add_test(tc, test_level_gates_less_severe_lines);
    tcase_add_test(tc, test_disabled_level_does_not_evaluate_arguments);
    tcase_add_test(tc, test_repeated_warnings_are_capped_per_call_site);
    tcase_add_test(tc, test_repeated_errors_are_capped_too);
    tcase_add_test(tc, test_debug_lines_are_never_capped);
    tcase_add_test(tc, test_long_message_is_cut_with_ellipsis);
    tcase_add_test(tc, test_trailing_newline_is_not_doubled);
    tcase_add_test(tc, test_logging_preserves_errno);
    tcase_add_test(tc, test_set_level_clamps_and_returns_previous);
    tcase_add_test(tc, test_set_fd_returns_previous);
    tcase_add_test(tc, test_concurrent_lines_never_interleave);
    suite_add_tcase(s, tc);
    return s;
}
