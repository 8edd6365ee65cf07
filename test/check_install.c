/* SPDX-License-Identifier: MIT */
/* check_install.c: `make install`, `make uninstall` and the installed launcher, ooc-run.
 *
 * The suite installs the build once (an unchecked fixture, in the runner's process) into a
 * temporary DESTDIR with PREFIX=/usr, as a packager would, and the tests use what is there:
 * the files are exactly the documented ones; $DESTDIR/usr/bin/ooc-run trains the large workload
 * on the simulated device at a 32 MiB budget (a device of 32 MiB: without the shim it runs out
 * of memory) with the checksum of the run without the shim, writes a profile and a plan and
 * says where, and draws the pictures with --report; bad flags and OOC_* values are refused
 * before the program starts, naming the flag, the value and the shim's accepted form; --help
 * documents every flag and every OOC_* variable; the program's exit status and the signal that
 * killed it come through, and TERM sent to ooc-run reaches the program; the public header
 * compiles and its marker helper finds the shim only when it is loaded; `make uninstall` leaves
 * no file behind. make runs with B= the runner's build directory, after that build is complete
 * (make check-run builds it first), so it only copies. */
#include <check.h>
#include <ftw.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "options.h"
#include "testutil.h"

Suite *suite_install(void);

/* Everything make install writes, relative to PREFIX (the Makefile's INSTALLED). */
static const char *const installed[] = {"bin/ooc-run",
                                        "bin/ooc-plan",
                                        "bin/ooc-report",
                                        "lib/libooc_shim.so",
                                        "include/ooc_shim.h",
                                        "libexec/ooc-shim/ooc-options",
                                        "share/man/man1/ooc-run.1",
                                        "share/man/man1/ooc-plan.1",
                                        "share/man/man1/ooc-report.1"};
#define N_INSTALLED (sizeof installed / sizeof installed[0])

static char destdir[64]; /* the suite's install, made once by the fixture */
static tu_proc_t inst;   /* make install's run */
static int inst_ran;

static int timeout_s(int normal) {
    return tu_under_valgrind() ? 20 * normal : normal;
}

/* Runs make `target` with DESTDIR=dir PREFIX=/usr for the runner's build directory; the
 * environment of an outer make (a jobserver) is not passed on. */
static int run_make(const char *target, const char *dir, tu_proc_t *p) {
    char b[PATH_MAX + 8], d[PATH_MAX + 16];
    snprintf(b, sizeof b, "B=%s", tu_build_dir());
    snprintf(d, sizeof d, "DESTDIR=%s", dir);
    const char *const argv[] = {"/usr/bin/env", "make", "--no-print-directory", b, d, "PREFIX=/usr",
                                target,         NULL};
    static const char *const env[] = {"MAKEFLAGS=", "MFLAGS=", "MAKELEVEL=", NULL};
    return tu_run(argv, env, timeout_s(300), p);
}

static void install_once(void) {
    snprintf(destdir, sizeof destdir, "/tmp/ooc-install-XXXXXX");
    if (!mkdtemp(destdir)) {
        destdir[0] = '\0';
        return;
    }
    inst_ran = run_make("install", destdir, &inst) == 0;
}

static void remove_tree(const char *dir) {
    char cmd[PATH_MAX + 16];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "check_install: could not remove %s\n", dir);
}

static void uninstall_at_end(void) {
    if (destdir[0])
        remove_tree(destdir);
    if (inst_ran)
        tu_proc_free(&inst);
    inst_ran = 0;
    destdir[0] = '\0';
}

/* Fails the test unless the fixture's make install succeeded. */
static void assert_installed(void) {
    ck_assert_msg(destdir[0], "no temporary DESTDIR");
    ck_assert_msg(inst_ran, "make install could not start");
    ck_assert_msg(inst.status == 0, "make install: status %d\n%s\n%s", inst.status,
                  tu_tail(inst.out, 1500), tu_tail(inst.err, 1500));
}

/* $DESTDIR/usr/<rel> in a rotating static buffer. */
static const char *inst_path(const char *rel) {
    static char slots[8][PATH_MAX];
    static unsigned next;
    char *s = slots[next++ % 8];
    snprintf(s, PATH_MAX, "%s/usr/%s", destdir, rel);
    return s;
}

/* An absolute path of a file under the build directory (children run elsewhere). */
static const char *abs_build_path(const char *rel) {
    static char slots[4][PATH_MAX];
    static unsigned next;
    char *s = slots[next++ % 4];
    char cwd[PATH_MAX / 2];
    ck_assert_ptr_nonnull(getcwd(cwd, sizeof cwd));
    const char *b = tu_build_dir();
    if (b[0] == '/')
        snprintf(s, PATH_MAX, "%s/%s", b, rel);
    else
        snprintf(s, PATH_MAX, "%s/%s/%s", cwd, b, rel);
    return s;
}

/* The simulated driver for a child that may run in another directory. */
static const char *abs_fakecuda_libpath(void) {
    static char buf[PATH_MAX + 32];
    snprintf(buf, sizeof buf, "LD_LIBRARY_PATH=%s", abs_build_path("fakecuda"));
    return buf;
}

static tu_proc_t run_ok(const char *const argv[], const char *const env[], int secs) {
    tu_proc_t p;
    ck_assert_msg(tu_run(argv, env, timeout_s(secs), &p) == 0, "%s could not start", argv[0]);
    return p;
}

/* ---- the files ------------------------------------------------------------------------------- */

static int n_files;
static int count_file(const char *path, const struct stat *st, int type, struct FTW *ftw) {
    (void)path, (void)st, (void)ftw;
    if (type == FTW_F || type == FTW_SL)
        n_files++;
    return 0;
}

static int files_under(const char *dir) {
    n_files = 0;
    ck_assert_int_eq(nftw(dir, count_file, 16, FTW_PHYS), 0);
    return n_files;
}

static char *read_text(const char *path) {
    FILE *f = fopen(path, "r");
    ck_assert_msg(f != NULL, "cannot open %s", path);
    static char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = '\0';
    fclose(f);
    return buf;
}

START_TEST(test_install_writes_exactly_the_documented_files) {
    assert_installed();
    for (size_t i = 0; i < N_INSTALLED; i++) {
        struct stat st;
        const char *p = inst_path(installed[i]);
        ck_assert_msg(stat(p, &st) == 0 && S_ISREG(st.st_mode), "%s is not installed", p);
        int exec = strncmp(installed[i], "bin/", 4) == 0 || strncmp(installed[i], "lib", 3) == 0;
        ck_assert_msg(!exec || (st.st_mode & 0111) == 0111, "%s is not executable", p);
        ck_assert_msg(exec || (st.st_mode & 0111) == 0, "%s is executable", p);
    }
    ck_assert_int_eq(files_under(destdir), (int)N_INSTALLED);

    /* The version is filled in; the library is the installed one, not the build's. */
    ck_assert_ptr_null(strstr(read_text(inst_path("bin/ooc-run")), "\nversion=@VERSION@\n"));
    tu_proc_t p = run_ok((const char *[]){inst_path("bin/ooc-run"), "--version", NULL},
                         (const char *[]){"OOC_BUILD=/nonexistent", NULL}, 30);
    char want[PATH_MAX + 16];
    snprintf(want, sizeof want, "library: %s\n", inst_path("lib/libooc_shim.so"));
    ck_assert_msg(p.status == 0 && strstr(p.out, "ooc-run (ooc-shim) ") && strstr(p.out, want) &&
                      !strstr(p.out, "checkout"),
                  "status %d:\n%s%s", p.status, p.out, p.err);
    tu_proc_free(&p);

    /* The man pages: one per command, their --help in them. */
    static const char *const cmds[] = {"ooc-run", "ooc-plan", "ooc-report"};
    for (size_t i = 0; i < 3; i++) {
        char rel[64];
        snprintf(rel, sizeof rel, "share/man/man1/%s.1", cmds[i]);
        const char *t = read_text(inst_path(rel));
        ck_assert_msg(strncmp(t, ".TH ", 4) == 0 && strstr(t, ".SH NAME\n") && strstr(t, cmds[i]) &&
                          strstr(t, "usage: "),
                      "%s:\n%s", rel, tu_tail(t, 1500));
    }
    const char *man = read_text(inst_path("share/man/man1/ooc-run.1"));
    static const char *const flags[] = {"--budget", "--mode",   "--policy", "--profile-dir",
                                        "--plan",   "--stats",  "--log",    "--report",
                                        "--help",   "--version"};
    for (size_t i = 0; i < sizeof flags / sizeof flags[0]; i++)
        ck_assert_msg(strstr(man, flags[i]), "ooc-run.1 does not mention %s", flags[i]);
}
END_TEST

/* ---- the launcher on the simulated device ---------------------------------------------------- */

/* The directory named on stderr's line "ooc-run: <what>: <dir>" (the text up to the line's end,
 * or up to " (" for the pictures), into buf; NULL when there is no such line. */
static char *said(const char *err, const char *what, char *buf, size_t len) {
    char key[64];
    snprintf(key, sizeof key, "ooc-run: %s", what);
    const char *l = strstr(err, key);
    if (!l)
        return NULL;
    l += strlen(key);
    l += strspn(l, " ");
    size_t n = strcspn(l, "\n");
    const char *paren = strstr(l, " (");
    if (paren && (size_t)(paren - l) < n)
        n = (size_t)(paren - l);
    if (n >= len)
        return NULL;
    memcpy(buf, l, n);
    buf[n] = '\0';
    return buf;
}

static void assert_file(const char *dir, const char *rel, const char *name) {
    char p[PATH_MAX * 2 + 8];
    snprintf(p, sizeof p, "%s/%s%s%s", dir, rel, *name ? "/" : "", name);
    struct stat st;
    ck_assert_msg(stat(p, &st) == 0 && st.st_size > 0, "%s is missing or empty", p);
}

START_TEST(test_installed_ooc_run_trains_large_under_a_32M_budget) {
    assert_installed();
    static const char *const args[] = {"--iters", "4", NULL};
    tu_result_t oracle = tu_run_prog("workloads/large", args, 0, NULL, timeout_s(120));
    ck_assert_msg(oracle.status == 0 && oracle.checksum[0], "oracle: status %d\n%s", oracle.status,
                  tu_tail(oracle.err, 1500));
    /* The device of 32 MiB is too small without the shim. */
    static const char *const small[] = {"FAKECUDA_MEM_BYTES=32M", NULL};
    tu_result_t oom = tu_run_prog("workloads/large", args, 0, small, timeout_s(120));
    ck_assert_msg(oom.status == 2 && strstr(oom.err, "CUDA_ERROR_OUT_OF_MEMORY"),
                  "without the shim at 32 MiB: status %d\n%s", oom.status, tu_tail(oom.err, 1500));

    /* In a fresh directory, as a user would: the profile goes to ./ooc-profiles/. */
    char work[] = "/tmp/ooc-install-run-XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(work));
    const char *const argv[] = {"/bin/sh",  "-c",  "cd \"$1\" && shift && exec \"$@\"",
                                "sh",       work,  inst_path("bin/ooc-run"),
                                "--budget", "32M", "--stats",
                                "--report", "--",  abs_build_path("workloads/large"),
                                "--iters",  "4",   NULL};
    /* OOC_BUILD points nowhere: the installed ooc-run must not need the build. Two recorded
     * iterations after the warm-up, then the plan is replayed in the fourth. */
    const char *const env[] = {abs_fakecuda_libpath(), "FAKECUDA_MEM_BYTES=32M",
                               "OOC_BUILD=/nonexistent", "OOC_PROFILE_ITERS=2", NULL};
    tu_proc_t p = run_ok(argv, env, 300);
    ck_assert_msg(p.status == 0, "status %d\n%s\n%s", p.status, tu_tail(p.out, 1000),
                  tu_tail(p.err, 2500));
    char sum[64];
    ck_assert_ptr_nonnull(tu_field(p.out, "checksum", sum, sizeof sum));
    ck_assert_msg(strcmp(sum, oracle.checksum) == 0, "checksum %s, the oracle's %s\n%s", sum,
                  oracle.checksum, tu_tail(p.err, 2500));
    ck_assert_msg(tu_stat_row(p.err, "operations run as planned") > 0, "no plan replayed:\n%s",
                  tu_tail(p.err, 2500));

    char prof[PATH_MAX], plan[PATH_MAX], pics[PATH_MAX];
    ck_assert_msg(said(p.err, "profile:", prof, sizeof prof), "no profile line:\n%s",
                  tu_tail(p.err, 2500));
    ck_assert_msg(strncmp(prof, "./ooc-profiles/large-", 21) == 0, "profile %s", prof);
    static const char *const files[] = {"meta.tsv", "buffers.tsv", "ops.tsv", "trace.json"};
    for (size_t i = 0; i < 4; i++)
        assert_file(work, prof, files[i]);
    ck_assert_msg(said(p.err, "plan:", plan, sizeof plan), "no plan line:\n%s",
                  tu_tail(p.err, 2500));
    char want[PATH_MAX + 16];
    snprintf(want, sizeof want, "%s/plan.tsv", prof);
    ck_assert_str_eq(plan, want);
    assert_file(work, plan, "");
    ck_assert_msg(said(p.err, "pictures:", pics, sizeof pics), "no pictures line:\n%s",
                  tu_tail(p.err, 2500));
    snprintf(want, sizeof want, "%s/report/", prof);
    ck_assert_str_eq(pics, want);
    static const char *const pngs[] = {"memory.png", "gantt.png", "sizes.png", "buffers.png"};
    for (size_t i = 0; i < 4; i++)
        assert_file(work, pics, pngs[i]);

    tu_proc_free(&p);
    tu_result_free(&oom);
    tu_result_free(&oracle);
    remove_tree(work);
}
END_TEST

/* ---- refusals -------------------------------------------------------------------------------- */

typedef struct refusal {
    const char *args[4]; /* ooc-run's flags, NULL-terminated */
    const char *env;     /* one more variable, or NULL */
    const char *option;  /* the OOC_* variable whose accepted form must be quoted, or NULL */
    const char *says;    /* what stderr must say */
} refusal_t;

START_TEST(test_bad_flags_are_refused_before_the_program_starts) {
    assert_installed();
    char ran[] = "/tmp/ooc-install-ran-XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(ran));
    char marker[sizeof ran + 8];
    snprintf(marker, sizeof marker, "%s/ran", ran);
    static const refusal_t cases[] = {
        {{"--budget", "12X"}, NULL, "OOC_BUDGET", "ooc-run: --budget 12X: not a size; expected "},
        {{"--budget=0"}, NULL, "OOC_BUDGET", "ooc-run: --budget 0: "},
        {{"--mode", "fast"}, NULL, "OOC_MODE", "ooc-run: --mode fast: "},
        {{"--policy", "best"}, NULL, "OOC_POLICY", "ooc-run: --policy best: "},
        {{"--log=loud"}, NULL, "OOC_LOG", "ooc-run: --log loud: "},
        {{NULL}, "OOC_CHUNK=3M", "OOC_CHUNK", "ooc-run: OOC_CHUNK=3M: not a power of two"},
        {{"--budget", "8G"},
         "OOC_PROFILE_ITERS=0",
         "OOC_PROFILE_ITERS",
         "ooc-run: OOC_PROFILE_ITERS=0: "},
        {{"--plan", "/nonexistent/plan.tsv"},
         NULL,
         NULL,
         "ooc-run: --plan /nonexistent/plan.tsv: cannot read it; expected a path to a saved plan"},
        {{"--stats=1"}, NULL, NULL, "ooc-run: --stats takes no value"},
        {{"--frobnicate"}, NULL, NULL, "ooc-run: unknown flag '--frobnicate'"},
        {{"--mode"}, NULL, NULL, "ooc-run: --mode needs a value"},
        {{"--profile-dir="}, NULL, NULL, "ooc-run: --profile-dir: an empty value"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const refusal_t *c = &cases[i];
        const char *argv[12];
        size_t n = 0;
        argv[n++] = inst_path("bin/ooc-run");
        for (size_t a = 0; c->args[a]; a++)
            argv[n++] = c->args[a];
        argv[n++] = "--";
        argv[n++] = "/usr/bin/touch";
        argv[n++] = marker;
        argv[n] = NULL;
        const char *env[] = {abs_fakecuda_libpath(), c->env, NULL};
        tu_proc_t p = run_ok(argv, env, 30);
        ck_assert_msg(p.status == 125, "case %zu: status %d\n%s", i, p.status, p.err);
        ck_assert_msg(strstr(p.err, c->says), "case %zu: stderr does not say \"%s\":\n%s", i,
                      c->says, p.err);
        if (c->option) {
            const ooc_option_desc_t *d = ooc_options_find(c->option);
            ck_assert_ptr_nonnull(d);
            ck_assert_msg(strstr(p.err, d->accepted), "case %zu: no accepted form \"%s\":\n%s", i,
                          d->accepted, p.err);
        }
        const char *nl = strchr(p.err, '\n');
        ck_assert_msg(nl && nl[1] == '\0', "case %zu: more than one line:\n%s", i, p.err);
        ck_assert_msg(access(marker, F_OK) != 0, "case %zu: the program ran", i);
        tu_proc_free(&p);
    }
    /* No program at all. */
    tu_proc_t p =
        run_ok((const char *[]){inst_path("bin/ooc-run"), "--budget", "1G", NULL}, NULL, 30);
    ck_assert_msg(p.status == 125 && strstr(p.err, "no program to run"), "status %d\n%s", p.status,
                  p.err);
    tu_proc_free(&p);
    remove_tree(ran);
}
END_TEST

START_TEST(test_help_documents_every_flag_and_variable) {
    assert_installed();
    static const char *const how[] = {"--help", "-h"};
    for (int h = 0; h < 2; h++) {
        tu_proc_t p = run_ok((const char *[]){inst_path("bin/ooc-run"), how[h], NULL}, NULL, 30);
        ck_assert_msg(p.status == 0, "%s: status %d\n%s", how[h], p.status, p.err);
        ck_assert_msg(strncmp(p.out, "usage: ooc-run [flags] [--] program [args...]\n", 46) == 0,
                      "%s", tu_tail(p.out, 1500));
        static const char *const flags[] = {"\n  --budget SIZE ",   "\n  --mode MODE ",
                                            "\n  --policy POLICY ", "\n  --profile-dir DIR ",
                                            "\n  --plan FILE ",     "\n  --stats ",
                                            "\n  --log LEVEL ",     "\n  --report ",
                                            "\n  --help ",          "\n  --version "};
        for (size_t i = 0; i < sizeof flags / sizeof flags[0]; i++)
            ck_assert_msg(strstr(p.out, flags[i]), "--help lacks \"%s\":\n%s", flags[i] + 1,
                          tu_tail(p.out, 3000));
        /* Every OOC_* variable, with its default, from the shim's own table. */
        size_t n;
        const ooc_option_desc_t *t = ooc_options_table(&n);
        for (size_t i = 0; i < n; i++) {
            char row[256];
            snprintf(row, sizeof row, "\n  %-18s %s", t[i].name, t[i].def);
            ck_assert_msg(strstr(p.out, row), "--help lacks the row of %s:\n%s", t[i].name,
                          tu_tail(p.out, 3000));
        }
        ck_assert_msg(strstr(p.out, "torchrun --nproc-per-node=8 --no-python ooc-run"),
                      "no torchrun example:\n%s", tu_tail(p.out, 3000));
        tu_proc_free(&p);
    }
}
END_TEST

/* ---- exit status and signals ----------------------------------------------------------------- */

/* Runs argv under Python's subprocess, which tells an exit status (>= 0) from a signal (< 0):
 * prints the child's output, then "returncode: N". With `term`, sends SIGTERM to the child
 * (ooc-run) once the program has printed its first line. */
static int returncode(const char *const *cmd, int term, tu_proc_t *out) {
    static const char code[] =
        "import signal, subprocess, sys\n"
        "p = subprocess.Popen(sys.argv[2:], stdout=subprocess.PIPE, text=True)\n"
        "if sys.argv[1] == '1':\n"
        "    sys.stdout.write(p.stdout.readline())\n"
        "    p.send_signal(signal.SIGTERM)\n"
        "sys.stdout.write(p.stdout.read())\n"
        "print('returncode: %d' % p.wait())\n";
    const char *argv[16] = {"/usr/bin/python3", "-c", code, term ? "1" : "0"};
    size_t n = 4;
    for (; *cmd && n < 15; cmd++)
        argv[n++] = *cmd;
    argv[n] = NULL;
    *out = run_ok(argv, NULL, 60);
    char rc[32];
    ck_assert_msg(tu_field(out->out, "returncode", rc, sizeof rc), "status %d\n%s\n%s", out->status,
                  out->out, out->err);
    return atoi(rc);
}

START_TEST(test_exit_status_and_signals_pass_through) {
    assert_installed();
    const char *run = inst_path("bin/ooc-run");
    tu_proc_t p;
    ck_assert_int_eq(
        returncode((const char *[]){run, "--", "/bin/sh", "-c", "exit 7", NULL}, 0, &p), 7);
    tu_proc_free(&p);
    ck_assert_int_eq(returncode((const char *[]){run, "/bin/true", NULL}, 0, &p), 0);
    tu_proc_free(&p);
    /* Killed by a signal: ooc-run dies of it too (after saying what it has to say). */
    ck_assert_int_eq(
        returncode((const char *[]){run, "--", "/bin/sh", "-c", "kill -USR1 $$", NULL}, 0, &p),
        -10);
    ck_assert_msg(strstr(p.err, "ooc-run: "), "%s", p.err);
    tu_proc_free(&p);
    ck_assert_int_eq(
        returncode((const char *[]){run, "--", "/bin/sh", "-c", "kill -KILL $$", NULL}, 0, &p), -9);
    tu_proc_free(&p);
    /* TERM sent to ooc-run reaches the program, whose own status then comes back. */
    ck_assert_int_eq(returncode((const char *[]){run, "--", "/bin/sh", "-c",
                                                 "trap 'echo got-term; exit 3' TERM; "
                                                 "echo ready; while :; do sleep 0.05; done",
                                                 NULL},
                                1, &p),
                     3);
    ck_assert_msg(strstr(p.out, "ready\ngot-term\n"), "%s", p.out);
    tu_proc_free(&p);
    /* A program that cannot run: env(1)'s statuses. */
    ck_assert_int_eq(returncode((const char *[]){run, "--", "no-such-program-ooc", NULL}, 0, &p),
                     127);
    ck_assert_msg(strstr(p.err, "no-such-program-ooc: command not found"), "%s", p.err);
    tu_proc_free(&p);
    ck_assert_int_eq(returncode((const char *[]){run, "--", "/etc/passwd", NULL}, 0, &p), 126);
    tu_proc_free(&p);
}
END_TEST

/* The program sees the library after what LD_PRELOAD held, and the flags as OOC_* variables;
 * under torchrun (RANK, WORLD_SIZE) a given profile directory gets the rank's own subdirectory. */
START_TEST(test_environment_the_program_sees) {
    assert_installed();
    static const char show[] = "echo \"preload=$LD_PRELOAD\"; echo \"dir=$OOC_PROFILE_DIR\"; "
                               "echo \"budget=$OOC_BUDGET stats=$OOC_STATS mode=$OOC_MODE "
                               "policy=$OOC_POLICY log=$OOC_LOG\"";
    const char *const argv[] = {inst_path("bin/ooc-run"),
                                "--budget=8G",
                                "--stats",
                                "--mode",
                                "demand",
                                "--policy",
                                "lms",
                                "--log",
                                "info",
                                "--profile-dir",
                                "/tmp/ooc-install-nowhere",
                                "/bin/sh",
                                "-c",
                                show,
                                NULL};
    const char *const env[] = {"LD_PRELOAD=libm.so.6", "OOC_BUDGET=1G", NULL};
    tu_proc_t p = run_ok(argv, env, 30);
    ck_assert_msg(p.status == 0, "status %d\n%s", p.status, p.err);
    char want[PATH_MAX + 32];
    snprintf(want, sizeof want, "libm.so.6:%s\n", inst_path("lib/libooc_shim.so"));
    ck_assert_msg(strstr(p.out, "preload=") && strstr(p.out, want), "%s", p.out);
    ck_assert_msg(strstr(p.out, "\ndir=/tmp/ooc-install-nowhere\n"), "%s", p.out);
    ck_assert_msg(strstr(p.out, "budget=8G stats=1 mode=demand policy=lms log=info\n"), "%s",
                  p.out);
    ck_assert_msg(strstr(p.err, "ooc-run: no profile: OOC_MODE=demand records none"), "%s", p.err);
    tu_proc_free(&p);

    const char *const rank[] = {"RANK=3", "WORLD_SIZE=4", NULL};
    p = run_ok(argv, rank, 30);
    ck_assert_msg(p.status == 0 && strstr(p.out, "\ndir=/tmp/ooc-install-nowhere/rank3\n"),
                  "status %d\n%s%s", p.status, p.out, p.err);
    tu_proc_free(&p);
}
END_TEST

/* ---- the header ------------------------------------------------------------------------------ */

START_TEST(test_header_compiles_and_finds_the_shim_only_when_loaded) {
    assert_installed();
    char dir[] = "/tmp/ooc-install-hdr-XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    char src[PATH_MAX], exe[PATH_MAX], inc[PATH_MAX + 2];
    snprintf(src, sizeof src, "%s/mark.c", dir);
    snprintf(exe, sizeof exe, "%s/mark", dir);
    snprintf(inc, sizeof inc, "-I%s", inst_path("include"));
    FILE *f = fopen(src, "w");
    ck_assert_ptr_nonnull(f);
    fputs("#include <ooc_shim.h>\n#include <stdio.h>\n"
          "_Static_assert(_Generic(&ooc_mark_iteration, void (*)(void): 1, default: 0),\n"
          "               \"ooc_mark_iteration is declared void (void)\");\n"
          "int main(void) {\n"
          "    printf(\"marked: %d\\n\", ooc_mark_iteration_if_loaded());\n"
          "    printf(\"again: %d\\n\", ooc_mark_iteration_if_loaded());\n"
          "    return 0;\n"
          "}\n",
          f);
    fclose(f);
    /* The program is not linked with the shim: the helper finds it under ooc-run only. */
    tu_proc_t p =
        run_ok((const char *[]){"/usr/bin/env", "cc", "-std=c11", "-Wall", "-Wextra", "-Werror",
                                "-pedantic", inc, "-o", exe, src, "-ldl", NULL},
               NULL, 120);
    ck_assert_msg(p.status == 0, "cc: status %d\n%s", p.status, p.err);
    tu_proc_free(&p);
    p = run_ok((const char *[]){exe, NULL}, NULL, 30);
    ck_assert_msg(p.status == 0 && strcmp(p.out, "marked: 0\nagain: 0\n") == 0, "%d\n%s%s",
                  p.status, p.out, p.err);
    tu_proc_free(&p);
    p = run_ok((const char *[]){inst_path("bin/ooc-run"), "--", exe, NULL}, NULL, 30);
    ck_assert_msg(p.status == 0 && strcmp(p.out, "marked: 1\nagain: 1\n") == 0, "%d\n%s%s",
                  p.status, p.out, p.err);
    tu_proc_free(&p);
    remove_tree(dir);
}
END_TEST

/* ---- make uninstall -------------------------------------------------------------------------- */

START_TEST(test_uninstall_removes_everything_it_installed) {
    char dir[] = "/tmp/ooc-uninstall-XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    tu_proc_t p;
    ck_assert_int_eq(run_make("install", dir, &p), 0);
    ck_assert_msg(p.status == 0, "make install: %d\n%s", p.status, tu_tail(p.err, 2000));
    tu_proc_free(&p);
    ck_assert_int_eq(files_under(dir), (int)N_INSTALLED);
    /* Something of the user's beside them stays. */
    char mine[PATH_MAX];
    snprintf(mine, sizeof mine, "%s/usr/bin/users-own-tool", dir);
    FILE *f = fopen(mine, "w");
    ck_assert_ptr_nonnull(f);
    fclose(f);
    ck_assert_int_eq(run_make("uninstall", dir, &p), 0);
    ck_assert_msg(p.status == 0, "make uninstall: %d\n%s", p.status, tu_tail(p.err, 2000));
    tu_proc_free(&p);
    ck_assert_int_eq(files_under(dir), 1);
    ck_assert_int_eq(access(mine, F_OK), 0);
    char libexec[PATH_MAX];
    snprintf(libexec, sizeof libexec, "%s/usr/libexec/ooc-shim", dir);
    ck_assert_msg(access(libexec, F_OK) != 0, "%s is left", libexec);
    /* Again, with nothing to remove: still fine. */
    ck_assert_int_eq(run_make("uninstall", dir, &p), 0);
    ck_assert_msg(p.status == 0, "make uninstall twice: %d\n%s", p.status, tu_tail(p.err, 2000));
    tu_proc_free(&p);
    remove_tree(dir);
}
END_TEST

Suite *suite_install(void) {
    Suite *s = suite_create("install");
    TCase *tc = tcase_create("install");
    tcase_add_unchecked_fixture(tc, install_once, uninstall_at_end);
    tcase_set_timeout(tc, timeout_s(120));
    tcase_add_test(tc, test_install_writes_exactly_the_documented_files);
    tcase_add_test(tc, test_bad_flags_are_refused_before_the_program_starts);
    tcase_add_test(tc, test_help_documents_every_flag_and_variable);
    tcase_add_test(tc, test_exit_status_and_signals_pass_through);
    tcase_add_test(tc, test_environment_the_program_sees);
    tcase_add_test(tc, test_header_compiles_and_finds_the_shim_only_when_loaded);
    tcase_add_test(tc, test_uninstall_removes_everything_it_installed);
    suite_add_tcase(s, tc);

    TCase *run = tcase_create("run");
    tcase_add_unchecked_fixture(run, install_once, uninstall_at_end);
    tcase_set_timeout(run, timeout_s(600));
    tcase_add_test(run, test_installed_ooc_run_trains_large_under_a_32M_budget);
    suite_add_tcase(s, run);
    return s;
}
