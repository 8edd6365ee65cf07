/* SPDX-License-Identifier: MIT */
/* runner.c: the one test runner. Every test/check_<area>.c exports `Suite *suite_<area>(void)`;
 * the Makefile lists them in suites.h. Arguments name suites to run (default: all). Exits
 * non-zero when any test fails, and ends with the line "N passed, N failed".
 *
 * Suites run in OOC_TEST_JOBS worker processes at once (default: the processors online, at most
 * 4; 1 runs them one after the other in this process). Each worker takes the next lane from a
 * queue: a lane is one suite, or suites that share something outside the process and so never
 * run beside each other (LANES below). A lane's output is printed whole once it ends, with its
 * time. A worker that dies leaves its lane counted as failed. Each failure is written once more
 * at the very end (file:line, test case, message), so that the tail of a long log names it. */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define SUITE(name) Suite *suite_##name(void);
#include "suites.h"
#undef SUITE

typedef struct {
    const char *name;
    Suite *(*make)(void);
} entry_t;

static const entry_t suites[] = {
#define SUITE(name) {#name, suite_##name},
#include "suites.h"
#undef SUITE
};
#define NSUITES (sizeof suites / sizeof suites[0])

/* Lanes, longest first (measured by the serial runner on 2 cores: framework 810 s, replay 408 s,
 * library and shim 160 s each, the rest under 80 s): the queue hands them out in this
 * order so that the long ones do not start last. The suites of one string run one after the other:
 * dp, nccl and nccl_shim count the simulated NCCL's shared segments (/dev/shm/fakenccl-*) and
 * the processes of their ranks, which the others' ranks would add to. A suite named nowhere is a
 * lane of its own, queued after these. */
static const char *const LANES[] = {
    "framework",         "replay",      "library",   "shim",       "userprogs",
    "dp nccl nccl_shim", "planner_sim", "workloads", "trace_json", "record",
    "gpuprep",           "recompute",   "fastpath",
};
#define NLANES_MAX (NSUITES + 1)

typedef struct {
    size_t suite[NSUITES]; /* indices into suites[] */
    size_t n;
} lane_t;

typedef struct {
    int lane;
    int run, failed; /* -1, -1: the lane started */
} result_t;

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static int jobs(void) {
    const char *v = getenv("OOC_TEST_JOBS");
    if (v && *v) {
        char *end;
        errno = 0;
        long j = strtol(v, &end, 10);
        if (errno || *end || j < 1 || j > 64) {
            fprintf(stderr, "runner: OOC_TEST_JOBS=%s: expected a number of workers, 1 to 64\n", v);
            exit(2);
        }
        return (int)j;
    }
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : n > 4 ? 4 : (int)n;
}

/* The failures of every lane, a line each, appended by whichever process ran the lane (the file
 * is opened O_APPEND before the workers fork, so their lines do not overwrite each other). */
static int g_fails = -1;

static void write_all(int fd, const void *p, size_t n) {
    const char *c = p;
    while (n) {
        ssize_t w = write(fd, c, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            _exit(3);
        c += w;
        n -= (size_t)w;
    }
}

/* Formats a failure line and appends it to g_fails (to stdout as well when echo is set): every
 * failure is listed once more at the end of the run. */
static void note_failure(int echo, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void note_failure(int echo, const char *fmt, ...) {
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (n <= 0)
        return;
    size_t len = (size_t)n < sizeof line ? (size_t)n : sizeof line - 1;
    if (echo)
        fputs(line, stdout);
    if (g_fails >= 0)
        write_all(g_fails, line, len);
}

/* Runs the suites of lane l in this process; adds to *run and *failed, and writes a line for
 * each failure to g_fails. */
static void run_lane(const lane_t *l, int *run, int *failed) {
    SRunner *sr = srunner_create(suites[l->suite[0]].make());
    for (size_t i = 1; i < l->n; i++)
        srunner_add_suite(sr, suites[l->suite[i]].make());
    srunner_run_all(sr, CK_NORMAL);
    int nf = srunner_ntests_failed(sr);
    *run += srunner_ntests_run(sr);
    *failed += nf;
    TestResult **tr = nf > 0 ? srunner_failures(sr) : NULL;
    for (int i = 0; tr && i < nf; i++)
        note_failure(0, "runner: FAILED %s:%d [%s] %s: %s\n", tr_lfile(tr[i]), tr_lno(tr[i]),
                     tr_tcname(tr[i]), tr_rtype(tr[i]) == CK_ERROR ? "error" : "failure",
                     tr_msg(tr[i]));
    free(tr);
    srunner_free(sr);
}

static int find(const char *name, size_t len) {
    for (size_t i = 0; i < NSUITES; i++)
        if (strlen(suites[i].name) == len && strncmp(suites[i].name, name, len) == 0)
            return (int)i;
    return -1;
}

/* The lanes of the wanted suites, in LANES' order, then the others in suites' order. */
static size_t make_lanes(const int *wanted, lane_t *lanes) {
    int placed[NSUITES] = {0};
    size_t n = 0;
    for (size_t k = 0; k < sizeof LANES / sizeof LANES[0]; k++) {
        lane_t l = {.n = 0};
        for (const char *p = LANES[k]; *p;) {
            size_t len = strcspn(p, " ");
            int s = find(p, len);
            if (s >= 0 && wanted[s] && !placed[s]) {
                placed[s] = 1;
                l.suite[l.n++] = (size_t)s;
            }
            p += len;
            p += strspn(p, " ");
        }
        if (l.n)
            lanes[n++] = l;
    }
    for (size_t s = 0; s < NSUITES; s++)
        if (wanted[s] && !placed[s])
            lanes[n++] = (lane_t){.suite = {s}, .n = 1};
    return n;
}

static void lane_name(const lane_t *l, char *buf, size_t cap) {
    buf[0] = '\0';
    for (size_t i = 0; i < l->n; i++) {
        size_t u = strlen(buf);
        snprintf(buf + u, cap - u, "%s%s", i ? " " : "", suites[l->suite[i]].name);
    }
}

/* A worker: takes lane numbers from `queue` until it is empty, runs each with its output in
 * out[lane], and reports the start and the end of each on `res`. */
static void worker(int queue, int res, const lane_t *lanes, const int *out) {
    int lane;
    while (read(queue, &lane, sizeof lane) == (ssize_t)sizeof lane) {
        result_t r = {lane, -1, -1};
        write_all(res, &r, sizeof r);
        fflush(stdout);
        fflush(stderr);
        dup2(out[lane], STDOUT_FILENO);
        dup2(out[lane], STDERR_FILENO);
        r.run = r.failed = 0;
        run_lane(&lanes[lane], &r.run, &r.failed);
        fflush(stdout);
        fflush(stderr);
        write_all(res, &r, sizeof r);
    }
    _exit(0);
}

/* Copies the file behind fd (from its start) to stdout. */
static void dump(int fd) {
    char buf[1 << 14];
    ssize_t n;
    lseek(fd, 0, SEEK_SET);
    fflush(stdout);
    while ((n = read(fd, buf, sizeof buf)) > 0)
        write_all(STDOUT_FILENO, buf, (size_t)n);
}

static int run_parallel(lane_t *lanes, size_t nl, int nj, int *run, int *failed) {
    int out[NLANES_MAX], q[2], res[2];
    double t0[NLANES_MAX];
    int state[NLANES_MAX] = {0}; /* 0 queued, 1 running, 2 done */
    for (size_t i = 0; i < nl; i++) {
        char path[] = "/tmp/ooc-runner-XXXXXX";
        out[i] = mkstemp(path);
        if (out[i] < 0) {
            perror("runner: mkstemp");
            return -1;
        }
        unlink(path);
    }
    if (pipe(q) != 0 || pipe(res) != 0) {
        perror("runner: pipe");
        return -1;
    }
    for (int i = 0; i < (int)nl; i++)
        write_all(q[1], &i, sizeof i); /* nl * 4 bytes: far below a pipe's capacity */
    close(q[1]);
    if ((size_t)nj > nl)
        nj = (int)nl;
    fflush(stdout);
    fflush(stderr);
    for (int j = 0; j < nj; j++) {
        pid_t pid = fork();
        if (pid < 0) {
            perror("runner: fork");
            return -1;
        }
        if (pid == 0) {
            close(res[0]);
            worker(q[0], res[1], lanes, out);
        }
    }
    close(q[0]);
    close(res[1]);
    printf("runner: %zu lanes in %d workers (OOC_TEST_JOBS)\n", nl, nj);
    fflush(stdout);
    result_t r;
    ssize_t got;
    while ((got = read(res[0], &r, sizeof r)) == (ssize_t)sizeof r || (got < 0 && errno == EINTR)) {
        if (got < 0)
            continue;
        if (r.lane < 0 || (size_t)r.lane >= nl)
            continue;
        char name[512];
        lane_name(&lanes[r.lane], name, sizeof name);
        if (r.run < 0) {
            state[r.lane] = 1;
            t0[r.lane] = now_s();
            printf("runner: [%s] started\n", name);
            fflush(stdout);
            continue;
        }
        state[r.lane] = 2;
        dump(out[r.lane]);
        printf("runner: [%s] %d passed, %d failed, %.1f s\n", name, r.run - r.failed, r.failed,
               now_s() - t0[r.lane]);
        fflush(stdout);
        *run += r.run;
        *failed += r.failed;
    }
    /* A worker ends with 0 once the queue is empty; anything else (valgrind's error exit code,
     * a signal) fails the run, as it would have failed the runner's own process. */
    int st;
    pid_t pid;
    while ((pid = wait(&st)) > 0 || errno == EINTR) {
        if (pid < 0 || (WIFEXITED(st) && WEXITSTATUS(st) == 0))
            continue;
        note_failure(1, "runner: worker %d ended with %s %d: counted as 1 failed\n", (int)pid,
                     WIFEXITED(st) ? "status" : "signal",
                     WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
        *run += 1;
        *failed += 1;
    }
    for (size_t i = 0; i < nl; i++) {
        if (state[i] == 2)
            continue;
        char name[512];
        lane_name(&lanes[i], name, sizeof name);
        dump(out[i]);
        note_failure(1, "runner: [%s] %s: counted as 1 failed\n", name,
                     state[i] ? "its worker died while running it" : "never ran");
        *run += 1;
        *failed += 1;
    }
    for (size_t i = 0; i < nl; i++)
        close(out[i]);
    return 0;
}

int main(int argc, char **argv) {
    int wanted[NSUITES] = {0}, any = 0;
    for (size_t i = 0; i < NSUITES; i++) {
        wanted[i] = argc < 2;
        for (int a = 1; a < argc; a++)
            if (strcmp(argv[a], suites[i].name) == 0)
                wanted[i] = 1;
        any |= wanted[i];
    }
    if (!any) {
        fprintf(stderr, "runner: no suite matches; suites are:");
        for (size_t i = 0; i < NSUITES; i++)
            fprintf(stderr, " %s", suites[i].name);
        fprintf(stderr, "\n");
        return 2;
    }
    static lane_t lanes[NLANES_MAX];
    size_t nl = make_lanes(wanted, lanes);
    int nj = jobs(), run = 0, failed = 0;
    char path[] = "/tmp/ooc-runner-fails-XXXXXX";
    g_fails = mkstemp(path);
    if (g_fails < 0 || fcntl(g_fails, F_SETFL, O_APPEND) != 0) {
        perror("runner: mkstemp");
        return 1;
    }
    unlink(path);
    double t = now_s();
    if (nj == 1 || nl == 1) {
        for (size_t i = 0; i < nl; i++)
            run_lane(&lanes[i], &run, &failed);
    } else if (run_parallel(lanes, nl, nj, &run, &failed) != 0) {
        return 1;
    }
    if (nj > 1 && nl > 1)
        printf("runner: %.1f s in all\n", now_s() - t);
    if (failed > 0)
        dump(g_fails);
    printf("%d passed, %d failed\n", run - failed, failed);
    return failed == 0 && run > 0 ? 0 : 1;
}
