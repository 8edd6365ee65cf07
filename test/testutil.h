/* SPDX-License-Identifier: MIT */
/* testutil.h: helpers shared by the Check suites (subprocesses, paths, seeds). */
#ifndef OOC_TESTUTIL_H
#define OOC_TESTUTIL_H

#include <stddef.h>
#include <stdint.h>

/* The build directory the runner was built in (OOC_BUILD, default "build"). */
const char *tu_build_dir(void);

/* A path under the build directory, in a static buffer per call site slot (8 slots, rotating). */
const char *tu_build_path(const char *rel);

/* "LD_PRELOAD=<cwd>/<build>/libooc_shim.so" for a child, with the sanitizer runtime the runner
 * itself uses put first (a sanitized shim needs it first in LD_PRELOAD). Static buffer. */
const char *tu_shim_preload(void);

/* "LD_LIBRARY_PATH=<build>/fakecuda": the simulated driver for a child. Static buffer. */
const char *tu_fakecuda_libpath(void);

/* The seed for a random test: OOC_TEST_SEED when set, else a fresh one; printed either way so a
 * failure can be replayed. */
uint64_t tu_seed(const char *test_name);

/* CLOCK_MONOTONIC, in ns. */
uint64_t tu_now_ns(void);

/* Result of a child process: exit status (or 128 + signal), and what it wrote. */
typedef struct tu_proc {
    int status;
    char *out; /* stdout, NUL-terminated, owned by the caller (tu_proc_free) */
    char *err; /* stderr, likewise */
} tu_proc_t;

/* Runs argv[0] (a path) with the current environment plus `env` (NULL-terminated "K=V" list,
 * entries override; "K=" with an empty value unsets K), waits at most timeout_s seconds (then
 * kills it and reports status 124). Returns 0 when the child ran, -1 when it could not start. */
int tu_run(const char *const argv[], const char *const env[], int timeout_s, tu_proc_t *p);
void tu_proc_free(tu_proc_t *p);

/* The value after "key: " on the last line of text that starts with it, copied into buf;
 * returns buf, or NULL when no line has it. */
char *tu_field(const char *text, const char *key, char *buf, size_t len);

/* A program's run under the simulated driver: its exit status, its closing lines, its output. */
typedef struct tu_result {
    int status;
    char checksum[64];       /* "checksum: H", or "" */
    unsigned long long peak; /* "peak_device_bytes: N", or 0 */
    unsigned long long ops;  /* "ops_per_iteration: N", or 0 */
    char *out, *err;         /* owned by the caller (tu_result_free) */
} tu_result_t;

/* Runs build/<prog> with `args` (NULL-terminated, at most 30) and an environment of the
 * simulated driver, the shim preloaded when `shim`, then `extra` (NULL-terminated, at most 60;
 * entries as tu_run's), for at most timeout_s seconds. The test fails when it cannot start. */
tu_result_t tu_run_prog(const char *prog, const char *const *args, int shim,
                        const char *const *extra, int timeout_s);
void tu_result_free(tu_result_t *r);

/* The value of the OOC_STATS row named `label` in text (a row is "  <label>  <value>..."), as an
 * integer (a fraction is cut). The test fails when no row has that name. */
long long tu_stat_row(const char *text, const char *label);
/* The same row's value with its fraction ("1.25 ms" is 1.25). */
double tu_stat_value(const char *text, const char *label);

/* The last `n` bytes of text (all of it when shorter; "" for NULL): failure messages quote a
 * child's output, which can be longer than a test's message may be. */
const char *tu_tail(const char *text, size_t n);

/* Whether the suites run under valgrind (OOC_TEST_VALGRIND set and not "0", as `make valgrind`
 * does): children run many times slower. */
int tu_under_valgrind(void);

/* A fault-injection run (`what`: the call failed, as "cuMemMap@7") ended well: the oracle's
 * checksum `want`, or a clean driver error (exit 2); and its FAKECUDA_STATS file `stats` shows
 * no device memory, host-located memory, mapping, reservation or pinned buffer left behind, no
 * illegal access and no unmap under queued work. The test fails otherwise. */
void tu_assert_fault_outcome(const tu_result_t *r, const char *want, const char *stats,
                             const char *what);

/* The value of `key` in a FAKECUDA_STATS file ("key<TAB>value" lines); -1 when absent. */
long long tu_fc_stat(const char *path, const char *key);

#endif
