/* SPDX-License-Identifier: MIT */
/* testutil.c: helpers shared by the Check suites: child processes with captured output, paths
 * under the build directory, and printed seeds. Used only by tests, single-threaded. */
#include "testutil.h"

#include <check.h>

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

const char *tu_build_dir(void) {
    const char *b = getenv("OOC_BUILD");
    return (b && *b) ? b : "build";
}

const char *tu_build_path(const char *rel) {
    static char slots[8][4096];
    static unsigned next;
    char *s = slots[next++ % 8];
    snprintf(s, sizeof slots[0], "%s/%s", tu_build_dir(), rel);
    return s;
}

uint64_t tu_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

uint64_t tu_seed(const char *test_name) {
    const char *e = getenv("OOC_TEST_SEED");
    uint64_t seed;
    if (e && *e) {
        seed = strtoull(e, NULL, 0);
    } else {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        seed = (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 20) ^ (uint64_t)getpid();
    }
    fprintf(stderr, "%s: seed %llu (replay with OOC_TEST_SEED=%llu)\n", test_name,
            (unsigned long long)seed, (unsigned long long)seed);
    return seed;
}

/* Builds the child's environment: ours, with `env` entries replacing or removing ours. */
static char **child_env(const char *const env[]) {
    size_t n = 0, m = 0;
    while (environ[n])
        n++;
    while (env && env[m])
        m++;
    char **out = calloc(n + m + 1, sizeof *out);
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        const char *eq = strchr(environ[i], '=');
        size_t klen = eq ? (size_t)(eq - environ[i]) : strlen(environ[i]);
        int overridden = 0;
        for (size_t j = 0; j < m; j++)
            if (strncmp(env[j], environ[i], klen) == 0 && env[j][klen] == '=')
                overridden = 1;
        if (!overridden)
            out[k++] = environ[i];
    }
    for (size_t j = 0; j < m; j++)
        if (strchr(env[j], '=')[1] != '\0')
            out[k++] = (char *)env[j];
    out[k] = NULL;
    return out;
}

static void append(char **buf, size_t *len, size_t *cap, const char *data, size_t n) {
    if (*len + n + 1 > *cap) {
        *cap = (*len + n + 1) * 2;
        *buf = realloc(*buf, *cap);
    }
    memcpy(*buf + *len, data, n);
    *len += n;
    (*buf)[*len] = '\0';
}

int tu_run(const char *const argv[], const char *const env[], int timeout_s, tu_proc_t *p) {
    int out_pipe[2], err_pipe[2];
    memset(p, 0, sizeof *p);
    if (pipe(out_pipe) != 0)
        return -1;
    if (pipe(err_pipe) != 0) {
        close(out_pipe[0]);
        close(out_pipe[1]);
        return -1;
    }
    char **cenv = child_env(env);
    pid_t pid = fork();
    if (pid < 0) {
        free(cenv);
        return -1;
    }
    if (pid == 0) {
        dup2(out_pipe[1], 1);
        dup2(err_pipe[1], 2);
        close(out_pipe[0]);
        close(err_pipe[0]);
        execve(argv[0], (char *const *)argv, cenv);
        fprintf(stderr, "exec %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    free(cenv);
    close(out_pipe[1]);
    close(err_pipe[1]);
    size_t olen = 0, ocap = 0, elen = 0, ecap = 0;
    append(&p->out, &olen, &ocap, "", 0);
    append(&p->err, &elen, &ecap, "", 0);
    struct pollfd fds[2] = {{out_pipe[0], POLLIN, 0}, {err_pipe[0], POLLIN, 0}};
    int open_fds = 2, killed = 0;
    struct timespec start, now;
    clock_gettime(CLOCK_MONOTONIC, &start);
    while (open_fds > 0) {
        clock_gettime(CLOCK_MONOTONIC, &now);
        long left_ms = (long)timeout_s * 1000 - ((now.tv_sec - start.tv_sec) * 1000 +
                                                 (now.tv_nsec - start.tv_nsec) / 1000000);
        if (left_ms <= 0) {
            kill(pid, SIGKILL);
            killed = 1;
            break;
        }
        int r = poll(fds, 2, (int)(left_ms > 1000 ? 1000 : left_ms));
        if (r < 0 && errno != EINTR)
            break;
        for (int i = 0; i < 2; i++) {
            if (fds[i].fd < 0 || !(fds[i].revents & (POLLIN | POLLHUP | POLLERR)))
                continue;
            char chunk[65536];
            ssize_t got = read(fds[i].fd, chunk, sizeof chunk);
            if (got <= 0) {
                close(fds[i].fd);
                fds[i].fd = -1;
                open_fds--;
            } else if (i == 0) {
                append(&p->out, &olen, &ocap, chunk, (size_t)got);
            } else {
                append(&p->err, &elen, &ecap, chunk, (size_t)got);
            }
        }
    }
    for (int i = 0; i < 2; i++)
        if (fds[i].fd >= 0)
            close(fds[i].fd);
    int st = 0;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
        ;
    if (killed)
        p->status = 124;
    else if (WIFEXITED(st))
        p->status = WEXITSTATUS(st);
    else
        p->status = 128 + WTERMSIG(st);
    return 0;
}

void tu_proc_free(tu_proc_t *p) {
    free(p->out);
    free(p->err);
    p->out = p->err = NULL;
}

char *tu_field(const char *text, const char *key, char *buf, size_t len) {
    size_t klen = strlen(key);
    const char *found = NULL;
    for (const char *line = text; line && *line;) {
        if (strncmp(line, key, klen) == 0 && line[klen] == ':' && line[klen + 1] == ' ')
            found = line + klen + 2;
        const char *nl = strchr(line, '\n');
        line = nl ? nl + 1 : NULL;
    }
    if (!found)
        return NULL;
    size_t n = strcspn(found, "\n");
    if (n >= len)
        n = len - 1;
    memcpy(buf, found, n);
    buf[n] = '\0';
    return buf;
}

const char *tu_shim_preload(void) {
    static char buf[8192];
    char asan[4096] = "";
    FILE *f = fopen("/proc/self/maps", "r");
    char line[4096];
    while (f && fgets(line, sizeof line, f)) {
        if (strstr(line, "/libasan.so")) {
            char *start = strchr(line, '/');
            line[strcspn(line, "\n")] = '\0';
            snprintf(asan, sizeof asan, "%s:", start);
            break;
        }
    }
    if (f)
        fclose(f);
    char cwd[2048];
    if (!getcwd(cwd, sizeof cwd))
        cwd[0] = '\0';
    snprintf(buf, sizeof buf, "LD_PRELOAD=%s%s/%s", asan, cwd, tu_build_path("libooc_shim.so"));
    return buf;
}

const char *tu_fakecuda_libpath(void) {
    static char buf[4096];
    snprintf(buf, sizeof buf, "LD_LIBRARY_PATH=%s", tu_build_path("fakecuda"));
    return buf;
}

/* Is this runner built with AddressSanitizer (its runtime mapped)? Cached. */
static int sanitized(void) {
    static int known = -1;
    if (known < 0) {
        known = 0;
        FILE *f = fopen("/proc/self/maps", "r");
        char line[4096];
        while (f && fgets(line, sizeof line, f) && !known)
            known = strstr(line, "/libasan.so") != NULL;
        if (f)
            fclose(f);
    }
    return known;
}

tu_result_t tu_run_prog(const char *prog, const char *const *args, int shim,
                        const char *const *extra, int timeout_s) {
    /* A sanitized program runs two to three times slower: the limit, there to catch a hang,
     * doubles (xfmr's threaded auto runs took 90 s of 120 on a loaded two-core machine even
     * without the sanitizers). */
    if (timeout_s > 0 && sanitized())
        timeout_s *= 2;
    const char *env[64], *argv[32];
    size_t n = 0, a = 0;
    env[n++] = tu_fakecuda_libpath();
    if (shim)
        env[n++] = tu_shim_preload();
    for (; extra && *extra && n < 63; extra++)
        env[n++] = *extra;
    env[n] = NULL;
    argv[a++] = tu_build_path(prog);
    for (; args && *args && a < 31; args++)
        argv[a++] = *args;
    argv[a] = NULL;
    tu_result_t r;
    memset(&r, 0, sizeof r);
    tu_proc_t p;
    ck_assert_msg(tu_run(argv, env, timeout_s, &p) == 0, "%s could not start", argv[0]);
    r.status = p.status;
    r.out = p.out;
    r.err = p.err;
    char buf[64];
    if (!tu_field(p.out, "checksum", r.checksum, sizeof r.checksum))
        r.checksum[0] = '\0';
    if (tu_field(p.out, "peak_device_bytes", buf, sizeof buf))
        r.peak = strtoull(buf, NULL, 10);
    if (tu_field(p.out, "ops_per_iteration", buf, sizeof buf))
        r.ops = strtoull(buf, NULL, 10);
    return r;
}

void tu_result_free(tu_result_t *r) {
    free(r->out);
    free(r->err);
    r->out = r->err = NULL;
}

/* The value of the row named `label` in text: where it starts; fails the test when none. */
static const char *stat_value_at(const char *text, const char *label) {
    size_t ll = strlen(label);
    for (const char *line = text; line && *line;) {
        const char *q = line + strspn(line, " ");
        if (q > line && strncmp(q, label, ll) == 0 && q[ll] == ' ' && q[ll + 1] == ' ')
            return q + ll;
        const char *nl = strchr(line, '\n');
        line = nl ? nl + 1 : NULL;
    }
    ck_abort_msg("no statistics row \"%s\" in:\n%s", label, text ? text : "(nothing)");
    return NULL;
}

long long tu_stat_row(const char *text, const char *label) {
    return atoll(stat_value_at(text, label));
}

double tu_stat_value(const char *text, const char *label) {
    return strtod(stat_value_at(text, label), NULL);
}

long long tu_fc_stat(const char *path, const char *key) {
    FILE *f = fopen(path, "r");
    char line[256];
    long long v = -1;
    size_t kl = strlen(key);
    while (f && fgets(line, sizeof line, f))
        if (strncmp(line, key, kl) == 0 && line[kl] == '\t')
            v = atoll(line + kl + 1);
    if (f)
        fclose(f);
    return v;
}

const char *tu_tail(const char *text, size_t n) {
    if (!text)
        return "";
    size_t len = strlen(text);
    return len > n ? text + len - n : text;
}

int tu_under_valgrind(void) {
    const char *v = getenv("OOC_TEST_VALGRIND");
    return v && *v && strcmp(v, "0") != 0;
}

void tu_assert_fault_outcome(const tu_result_t *r, const char *want, const char *stats,
                             const char *what) {
    ck_assert_msg(r->status == 0 || r->status == 2, "%s: status %d\n%s", what, r->status,
                  tu_tail(r->err, 2000));
    if (r->status == 0)
        ck_assert_msg(strcmp(r->checksum, want) == 0, "%s: checksum %s, oracle %s", what,
                      r->checksum, want);
    static const char *const left[] = {
        "allocs_live",      "vmm_handles_live",    "mappings_live",     "reservations_live",
        "host_allocs_live", "vmm_host_bytes_live", "strict_violations", "illegal_accesses"};
    for (size_t i = 0; i < sizeof left / sizeof left[0]; i++) {
        long long v = tu_fc_stat(stats, left[i]);
        ck_assert_msg(v == 0, "%s: %s = %lld after exit", what, left[i], v);
    }
}
