/* SPDX-License-Identifier: MIT */
/* options.h: the shim's configuration: one table of OOC_* variables, parsed once.
 *
 * Every option is one row of the table in options.c (name, type, default, accepted form, one
 * line of documentation), and README.md documents each row; a test keeps the two in agreement.
 * ooc_options_parse is pure (it reads values through a callback, so tests never touch the real
 * environment); ooc_options_load reads the environment once per process (pthread_once), applies
 * OOC_LOG and OOC_LOG_FILE to the log and warns about unknown OOC_* names. Values that depend on
 * the device (the budget, the reserve, the chunk size) are stored as written and resolved by the
 * ooc_options_*_bytes functions once the device is known. */
#ifndef OOC_OPTIONS_H
#define OOC_OPTIONS_H

#include <stddef.h>
#include <stdint.h>

#include "ooc.h"

/* Longest path an option may hold, NUL included. */
#define OOC_PATH_MAX 4096

typedef enum ooc_mode {
    OOC_MODE_OFF,    /* pass-through: measures the cost of the hooks */
    OOC_MODE_DEMAND, /* make resident on demand, evict least recently used */
    OOC_MODE_RECORD, /* demand + record the profile, then stop there */
    OOC_MODE_AUTO,   /* record, plan, replay */
} ooc_mode_t;

typedef enum ooc_policy {
    OOC_POLICY_SWAPALL,
    OOC_POLICY_LMS,
    OOC_POLICY_SUPERNEURONS,
    OOC_POLICY_WINDOW,
    OOC_POLICY_POOCH,
    OOC_POLICY_BELADY,
    OOC_POLICY_AUTO,
} ooc_policy_t;

typedef enum ooc_safe {
    OOC_SAFE_AUTO, /* on when the device supports host-located VMM memory */
    OOC_SAFE_ON,   /* required: start-up fails without host-located VMM memory */
    OOC_SAFE_OFF,
} ooc_safe_t;

/* How a size option was given. */
typedef enum ooc_size_kind {
    OOC_SIZE_DEFAULT, /* not set: the option's documented default applies */
    OOC_SIZE_BYTES,   /* an absolute size in .bytes */
    OOC_SIZE_PERCENT, /* a share of device memory in .pct_x100 (8050 = 80.5%) */
    OOC_SIZE_AUTO,    /* the word `auto` */
} ooc_size_kind_t;

typedef struct ooc_size_spec {
    ooc_size_kind_t kind;
    uint32_t pct_x100;
    uint64_t bytes;
} ooc_size_spec_t;

/* The parsed configuration. Plain data: copy it freely. Empty strings mean "the default". */
typedef struct ooc_options {
    ooc_size_spec_t budget;         /* OOC_BUDGET: DEFAULT, BYTES or PERCENT */
    ooc_size_spec_t reserve;        /* OOC_RESERVE: BYTES or PERCENT */
    ooc_size_spec_t chunk;          /* OOC_CHUNK: AUTO or BYTES (a power of two, 64K..1G) */
    ooc_size_spec_t window;         /* OOC_WINDOW: AUTO or BYTES */
    int mode;                       /* OOC_MODE: ooc_mode_t */
    int policy;                     /* OOC_POLICY: ooc_policy_t */
    int profile_iters;              /* OOC_PROFILE_ITERS: 1..1000 */
    int log_level;                  /* OOC_LOG: ooc_log_level_t */
    int stats;                      /* OOC_STATS: 0 or 1 */
    int safe;                       /* OOC_SAFE: ooc_safe_t */
    int reuse;                      /* OOC_REUSE: 0 or 1 */
    int safe_stage;                 /* OOC_SAFE_STAGE: 0 or 1 */
    int remap_gate;                 /* OOC_REMAP_GATE: 0 or 1 */
    int gate_timeout;               /* OOC_GATE_TIMEOUT: 1..86400 seconds */
    char profile_dir[OOC_PATH_MAX]; /* OOC_PROFILE_DIR; "" = ./ooc-profiles/<program>-<pid> */
    char plan[OOC_PATH_MAX];        /* OOC_PLAN; "" = none */
    char log_file[OOC_PATH_MAX];    /* OOC_LOG_FILE; "" = stderr */
    uint32_t set_mask;              /* bit i: table row i was set in the environment */
} ooc_options_t;

/* The value types of the table's rows. */
typedef enum ooc_option_type {
    OOC_OPT_SIZE,      /* bytes with an optional K/M/G/T suffix */
    OOC_OPT_SIZE_PCT,  /* a size, or a percentage of device memory */
    OOC_OPT_SIZE_AUTO, /* a size, or `auto` */
    OOC_OPT_CHOICE,    /* one word of a fixed list */
    OOC_OPT_INT,       /* a decimal integer in [min, max] */
    OOC_OPT_BOOL,      /* 0 or 1 */
    OOC_OPT_PATH,      /* a file or directory path */
} ooc_option_type_t;

/* One row of the table. Everything a reader (or README.md) needs to know about an option. */
typedef struct ooc_option_desc {
    const char *name; /* "OOC_BUDGET" */
    ooc_option_type_t type;
    const char *def;            /* the default, as documented ("1G", "auto", "stderr") */
    const char *accepted;       /* the accepted form, as printed in errors and README.md */
    const char *doc;            /* one line: what the option does */
    size_t offset;              /* where the value lives in ooc_options_t */
    const char *const *choices; /* OOC_OPT_CHOICE: the words, in enum order, NULL-terminated */
    int64_t min, max;           /* OOC_OPT_INT and size bounds; 0, 0 = none */
    int pow2;                   /* 1: a size must be a power of two */
    int dynamic;                /* 1: def describes a value computed at run time */
} ooc_option_desc_t;

/* The table and its length. Static, constant, thread-safe. */
const ooc_option_desc_t *ooc_options_table(size_t *n);

/* The row of an option by its exact name, or NULL. */
const ooc_option_desc_t *ooc_options_find(const char *name);

/* Returns the value of `name`, or NULL when it is not set. Called once per table row. */
typedef const char *(*ooc_options_get_fn)(const char *name, void *ctx);

/* Fills *out with the defaults, then with every value `get` returns, checking each one. An
 * empty value counts as unset. On a bad value, writes one line to err (when errlen > 0) that
 * names the variable, the value and the accepted form, e.g.
 *   OOC_BUDGET=12X: not a size; expected bytes with an optional K/M/G/T suffix (e.g. 16G) or a
 *   percentage of device memory (e.g. 80%)
 * and returns OOC_EINVAL (malformed) or OOC_ERANGE (out of range, overflow); *out then holds
 * the values parsed so far and defaults elsewhere. Returns 0 on success. Pure and thread-safe:
 * no environment, no log, no allocation. */
int ooc_options_parse(ooc_options_get_fn get, void *ctx, ooc_options_t *out, char *err,
                      size_t errlen);

/* Parses one size the way the size options do ("16G", "1.5G", "512m", "4096"): bytes with an
 * optional K/M/G/T suffix (binary; an optional trailing "B" or "iB"), a fraction only with a
 * suffix. Returns 0, OOC_EINVAL when malformed, OOC_ERANGE when it exceeds 2^64 - 1. */
int ooc_options_parse_size(const char *s, uint64_t *bytes);

/* Warns (log level warn) about each entry of envp (a NULL-terminated "NAME=value" array, such as
 * environ) whose name starts with OOC_ but is no option, suggesting the nearest option name for
 * a likely typo. Names under OOC_TEST_ and OOC_BUILD belong to the test harness and are skipped.
 * Returns the number of unknown names. No allocation. */
size_t ooc_options_warn_unknown(const char *const *envp);

/* Reads the environment once per process (pthread_once; later calls return the first result):
 * parses it, and on success applies OOC_LOG (ooc_log_set_level) and OOC_LOG_FILE (opened for
 * append; the descriptor is kept for the life of the process), then warns about unknown OOC_*
 * names. On a bad configuration logs the one-line message on stderr and returns its negative
 * code; the caller must then refuse to start (the shim never runs on a half-understood
 * configuration). Thread-safe. */
int ooc_options_load(void);

/* The options loaded by ooc_options_load (which it calls if needed). After a failed load it
 * returns the defaults. The pointer stays valid for the life of the process. Thread-safe. */
const ooc_options_t *ooc_options(void);

/* The message of a failed ooc_options_load, or "" after a successful one. */
const char *ooc_options_error(void);

/* The device memory the shim may use, in bytes: OOC_BUDGET as bytes; as a percentage, that
 * share of device_total; unset, device_free less the reserve (0 when the reserve exceeds what
 * is free). The caller clamps to what the device can hold and warns. */
uint64_t ooc_options_budget_bytes(const ooc_options_t *o, uint64_t device_total,
                                  uint64_t device_free);

/* The reserve in bytes: OOC_RESERVE as bytes, or its percentage of device_total. */
uint64_t ooc_options_reserve_bytes(const ooc_options_t *o, uint64_t device_total);

/* `OOC_CHUNK=auto` picks the largest power of two that leaves at least OOC_CHUNK_AUTO_COUNT
 * chunks in the budget, at most OOC_CHUNK_AUTO_MAX: a real driver's cost is per mapping, not per
 * byte (an H200 with driver 580: about 45 us to set access and unmap 2 MiB, 66 us for 32 MiB), so 2
 * MiB chunks spend as long mapping as a 50 GB/s link spends copying them. */
#define OOC_CHUNK_AUTO_COUNT 256
#define OOC_CHUNK_AUTO_MAX   (UINT64_C(32) << 20)

/* The chunk size: OOC_CHUNK's, or auto's for this budget (bytes), rounded up to a multiple of
 * the device's allocation granularity (a power of two; 0 means "no constraint"). */
uint64_t ooc_options_chunk_bytes(const ooc_options_t *o, uint64_t granularity, uint64_t budget);

/* b as an option value reads it back: the largest exact K/M/G/T unit ("2M", "1536K", "100"). */
char *ooc_options_fmt_size(uint64_t b, char *buf, size_t len);

/* The window in bytes, or 0 for `auto` (the planner tunes it). */
uint64_t ooc_options_window_bytes(const ooc_options_t *o);

/* Writes the profile directory to buf: OOC_PROFILE_DIR, or ./ooc-profiles/<program>-<pid> with
 * the program's short name and the calling process's pid. Returns 0, or OOC_ERANGE when buf is
 * too small. */
int ooc_options_profile_dir(const ooc_options_t *o, char *buf, size_t len);

/* The names of the choice values, for start-up lines ("auto", "swapall", "on"); "?" when out of
 * range. */
const char *ooc_mode_name(int mode);
const char *ooc_policy_name(int policy);
const char *ooc_safe_name(int safe);

#endif
