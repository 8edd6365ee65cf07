/* SPDX-License-Identifier: MIT */
/* mode.c: the shim's mode now: the configuration in force (loaded once, before the real driver
 * is used), the configured mode, whether the recorder logs ops, and whether a plan is followed.
 *
 * The one owner of the mode's state, at the bottom of the shim, so that every file may read it
 * (the hooks, the op sequence, the memory layer's fast path) without calling up into record.c or
 * replay.c. The configured mode is set here when the configuration is loaded (ooc_real_load
 * calls ooc_config_init before it opens the driver), and turned off in a forked child; the
 * recorder's state is driven by record.c (off -> recording -> done, and recording again), the
 * replay's by replay.c (a plan followed or not). Each is a relaxed atomic: a transition to
 * "recording" or "replaying" is followed by a writer section of the memory layer (ooc_mem_quiesce),
 * so no fast-path op that read "off" is still running after it. Thread-safe; no lock. */
#include "shim.h"

#include <stdlib.h>
#include <unistd.h>

_Atomic int ooc_mode_now = OOC_MODE_OFF;
_Atomic int ooc_rec_state = OOC_REC_OFF;
_Atomic int ooc_rp_on;

static pthread_once_t config_once = PTHREAD_ONCE_INIT;

static void on_fork_child(void) {
    atomic_store(&ooc_mode_now, OOC_MODE_OFF);
}

static void config_once_fn(void) {
    if (ooc_options_load() != 0) {
        /* ooc_options_load printed the one line that names the variable, value and form. */
        static const char msg[] = "ooc: stopping: fix the configuration above (see README.md)\n";
        ssize_t w = write(2, msg, sizeof msg - 1);
        (void)w;
        exit(1);
    }
    const ooc_options_t *o = ooc_options();
    int mode = o->mode;
    if (o->plan[0] && mode != OOC_MODE_AUTO) {
        OOC_LOG_W("OOC_PLAN=%s is ignored: plans are replayed in OOC_MODE=auto, not %s", o->plan,
                  ooc_mode_name(mode));
    }
    pthread_atfork(NULL, NULL, on_fork_child);
    atomic_store(&ooc_mode_now, mode);
}

void ooc_config_init(void) {
    pthread_once(&config_once, config_once_fn);
}

const ooc_options_t *ooc_opts(void) {
    return ooc_options();
}

int ooc_record_on(void) {
    return atomic_load_explicit(&ooc_rec_state, memory_order_relaxed) == OOC_REC_ON;
}

int ooc_replay_on(void) {
    return atomic_load_explicit(&ooc_rp_on, memory_order_relaxed);
}
