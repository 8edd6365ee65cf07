/* SPDX-License-Identifier: MIT */
/* streams.c: which streams used each chunk, and waiting for their work before a chunk
 * is unmapped.
 *
 * Invariants: a chunk's user list only grows while it is hot (chunk_add_user publishes an entry
 * before its count); a user that cannot be named (another thread's per-thread stream, or more
 * than MAX_USERS) makes users_unknown set, and only a context synchronisation then will do. In
 * safe mode every stream that issued an op since a chunk was mapped counts as its user (a hidden
 * access may come from any). Locking: caller holds mem_lock. Callers: vmm.c, retire.c,
 * resident.c, transfer.c, worker.c, buffer.c. */
#include "mem_int.h"

/* ---- waiting for a chunk's users --------------------------------------------------------------
 */

/* Safe mode: the last completed wait for streams' work, good while no op was issued since
 * (fc_epoch unchanged): a wait for the same streams, or fewer, would wait for nothing, yet each
 * costs an event through every stream and a wake-up, once per chunk of a swap-in. */
static struct {
    int valid, all; /* all: the whole context was waited for */
    uint64_t epoch;
    unsigned n;
    CUstream s[MAX_USERS + MAX_STREAMS];
} waited;

/* fc_epoch, with the fast path's issues so far counted (a writer section from here on, so none
 * can follow until the lock is let go). Caller holds mem_lock. */
uint64_t issue_epoch(void) {
    quiesce();
    if (atomic_exchange_explicit(&M.fc_dirty, 0, memory_order_relaxed))
        M.fc_epoch++;
    return M.fc_epoch;
}

/* Notes that the work issued on `users` (all streams when `all`) up to issue_epoch() == epoch
 * has completed. Caller holds mem_lock. */
void note_waited(uint64_t epoch, const CUstream *users, unsigned n, int all) {
    if (!M.safe || n > MAX_USERS + MAX_STREAMS)
        return;
    waited.valid = 1;
    waited.all = all;
    waited.epoch = epoch;
    waited.n = all ? 0 : n;
    for (unsigned i = 0; i < waited.n; i++)
        waited.s[i] = users[i];
}

/* Whether the work of `users` is known to have completed: waited for, nothing issued since. */
static int waited_for(const CUstream *users, unsigned n, int unknown) {
    if (!M.safe || !waited.valid || waited.epoch != issue_epoch())
        return 0;
    if (waited.all)
        return 1;
    if (unknown)
        return 0;
    for (unsigned i = 0; i < n; i++) {
        unsigned k = 0;
        while (k < waited.n && waited.s[k] != users[i])
            k++;
        if (k == waited.n)
            return 0;
    }
    return 1;
}

/* wait_users' waits: an event through each stream, or the context. */
static CUresult users_sync(CUstream *users, unsigned n, int unknown) {
    uint64_t epoch = M.safe ? issue_epoch() : 0;
    CUresult r = CUDA_SUCCESS;
    for (unsigned i = 0; i < n && !unknown; i++) {
        evref_t *v = ev_take();
        r = v ? ooc_real.cuEventRecord(v->e, users[i]) : CUDA_ERROR_OUT_OF_MEMORY;
        if (r == CUDA_SUCCESS)
            r = sync_event(v->e);
        ev_drop(v);
        if (r != CUDA_SUCCESS) /* e.g. the stream was destroyed: wait for everything */
            break;
    }
    if (unknown || r != CUDA_SUCCESS) {
        r = sync_ctx();
        if (r == CUDA_SUCCESS)
            note_waited(epoch, NULL, 0, 1);
        return r;
    }
    note_waited(epoch, users, n, 0);
    return CUDA_SUCCESS;
}

/* Waits until the work of every stream in `users` has completed; the context when unknown (a wait
 * already made with nothing issued since is skipped). */
static CUresult wait_users(CUstream *users, unsigned n, int unknown) {
    if (waited_for(users, n, unknown)) {
        ooc_stats_add(OOC_STAT_waits_skipped, 1);
        return CUDA_SUCCESS;
    }
    unsigned why = wait_for(WAIT_STREAMS);
    CUresult r = users_sync(users, n, unknown);
    wait_for(why);
    return r;
}

void add_user(CUstream *users, unsigned *n, int *unknown, CUstream s) {
    if (s == CU_STREAM_PER_THREAD) {
        *unknown = 1; /* another thread's per-thread stream cannot be named from ours */
        return;
    }
    for (unsigned i = 0; i < *n; i++)
        if (users[i] == s)
            return;
    if (*n == MAX_USERS)
        *unknown = 1;
    else
        users[(*n)++] = s;
}

/* add_user for a chunk's own list, which the fast path reads without the lock: the entry is
 * written before the count that publishes it, and entries are never changed, only appended (the
 * list is emptied only when the chunk is unmapped, which cools it first). */
void chunk_add_user(chunk_t *c, CUstream s) {
    unsigned n = atomic_load_explicit(&c->nusers, memory_order_relaxed);
    if (s == CU_STREAM_PER_THREAD) {
        c->users_unknown = 1;
        return;
    }
    for (unsigned i = 0; i < n; i++)
        if (atomic_load_explicit(&c->users[i], memory_order_relaxed) == s)
            return;
    if (n == MAX_USERS) {
        c->users_unknown = 1;
        return;
    }
    atomic_store_explicit(&c->users[n], s, memory_order_relaxed);
    atomic_store_explicit(&c->nusers, n + 1, memory_order_release);
}

/* Notes that an op was issued on s. Caller holds mem_lock. */
void stream_issued(CUstream s) {
    if (s == CU_STREAM_PER_THREAD) {
        raise_to(&M.streams_lost, M.serial);
        return;
    }
    for (unsigned i = 0; i < M.nstreams; i++) {
        if (M.streams[i].s == s) {
            raise_to(&M.streams[i].last, M.serial);
            return;
        }
    }
    if (M.nstreams == MAX_STREAMS) {
        raise_to(&M.streams_lost, M.serial);
        return;
    }
    M.streams[M.nstreams].s = s;
    M.streams[M.nstreams].last = M.serial;
    atomic_store_explicit(&M.nstreams, M.nstreams + 1, memory_order_release);
}

/* The streams whose work must complete before the chunks can be unmapped (users, at most
 * MAX_USERS + MAX_STREAMS of them): see wait_chunks. Returns 1 when some cannot be named (then
 * only a context synchronisation will do). Caller holds mem_lock. */
int gather_streams(chunk_t *const *cs, size_t n, CUstream *users, unsigned *nu_out) {
    unsigned nu = 0;
    int unknown = 0;
    uint64_t since = UINT64_MAX;
    /* The chunks are about to be waited for: no fast-path op may add work on them from now on,
     * and in safe mode every fast-path issue so far must be seen in M.streams (a hidden access
     * may come from any of them). */
    if (M.safe)
        quiesce();
    for (size_t i = 0; i < n; i++)
        cool(cs[i]);
    for (size_t i = 0; i < n; i++) {
        unknown |= cs[i]->users_unknown;
        for (unsigned u = 0; u < cs[i]->nusers; u++)
            add_user(users, &nu, &unknown, cs[i]->users[u]);
        if (cs[i]->since < since)
            since = cs[i]->since;
    }
    if (M.safe && n) {
        if (M.streams_lost > since)
            unknown = 1;
        for (unsigned i = 0; i < M.nstreams && !unknown; i++) {
            if (M.streams[i].last <= since)
                continue;
            unsigned k = 0;
            while (k < nu && users[k] != M.streams[i].s)
                k++;
            if (k == nu)
                users[nu++] = M.streams[i].s;
        }
    }
    *nu_out = nu;
    return unknown;
}

/* Waits until the chunks can be unmapped: the work of their known users has completed and, in
 * safe mode, the work of every stream that issued an op since the oldest of them was mapped
 * (an access the shim could not see, through a pointer stored in device memory, may be in
 * flight on any of them). Caller holds mem_lock. */
CUresult wait_chunks(chunk_t *const *cs, size_t n) {
    CUstream users[MAX_USERS + MAX_STREAMS];
    unsigned nu = 0;
    int unknown = gather_streams(cs, n, users, &nu);
    return wait_users(users, nu, unknown);
}

/* An event after the work issued so far on s (shared by the chunks freed between two ops). The
 * cache is valid while no op was issued: locked ops advance fc_epoch, fast-path ops set
 * fc_dirty, which is read here inside a writer section (all of them are seen). */
evref_t *fence_ev(CUstream s) {
    issue_epoch();
    for (unsigned i = 0; i < 8; i++) {
        if (M.fcache[i].v && M.fcache[i].s == s && M.fcache[i].epoch == M.fc_epoch) {
            M.fcache[i].v->refs++;
            return M.fcache[i].v;
        }
    }
    evref_t *v = ev_take();
    if (!v)
        return NULL;
    if (ooc_real.cuEventRecord(v->e, s) != CUDA_SUCCESS) {
        ev_drop(v);
        return NULL;
    }
    unsigned k = M.fc_next++ % 8;
    ev_drop(M.fcache[k].v);
    M.fcache[k].s = s;
    M.fcache[k].epoch = M.fc_epoch;
    M.fcache[k].v = v;
    v->refs++;
    return v;
}

/* ---- safe mode: memory being filled behind an address ---------------------------------------
 *
 * Once a swapped chunk's host alias is removed and device memory mapped at its address, its
 * copy in fills that memory; an op that reached the address through a pointer the shim cannot
 * see would read it half filled. Every op issued meanwhile, whatever it names, has its stream
 * wait for the copies in (each copy stream runs them in order: its last event covers the ones
 * before). */

/* Safe mode: v (one reference taken) follows the last copy in issued on copy stream k (FILL_*).
 * Caller holds mem_lock. */
void fill_set(unsigned k, evref_t *v) {
    quiesce(); /* no fast-path op passes fill_on unseen from here */
    v->refs++;
    ev_drop(M.fill[k]);
    M.fill[k] = v;
    atomic_store(&M.fill_on, 1);
}

/* Safe mode: as fill_set, for an event that need not follow slot k's (events on streams of the
 * program's): while k's is pending the two are joined on M.join, a stream of the shim's own.
 * CUDA_SUCCESS, or an error with nothing set (the caller waits for v on the host instead).
 * Caller holds mem_lock. */
CUresult fill_join(unsigned k, evref_t *v) {
    evref_t *old = M.fill[k];
    if (!old || ev_done(old)) {
        fill_set(k, v);
        return CUDA_SUCCESS;
    }
    evref_t *j = ev_join(old, v);
    if (!j)
        return CUDA_ERROR_OUT_OF_MEMORY;
    fill_set(k, j);
    ev_drop(j);
    return CUDA_SUCCESS;
}

/* M.join, a stream of the shim's own for joining other streams' events, created at first use;
 * NULL when it cannot be. Caller holds mem_lock. */
CUstream join_stream(void) {
    if (!M.join && ooc_real.cuStreamCreate(&M.join, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS)
        M.join = NULL;
    return M.join;
}

/* An event after both a and b (the caller's reference), recorded on M.join, a stream of the
 * shim's own (created when needed); NULL when out of events or on a driver error. Caller holds
 * mem_lock. */
evref_t *ev_join(evref_t *a, evref_t *b) {
    if (!join_stream())
        return NULL;
    evref_t *j = ev_take();
    CUresult r = j ? ooc_real.cuStreamWaitEvent(M.join, a->e, 0) : CUDA_ERROR_OUT_OF_MEMORY;
    if (r == CUDA_SUCCESS)
        r = ooc_real.cuStreamWaitEvent(M.join, b->e, 0);
    if (r == CUDA_SUCCESS)
        r = ooc_real.cuEventRecord(j->e, M.join);
    if (r != CUDA_SUCCESS) {
        ev_drop(j);
        return NULL;
    }
    return j;
}

/* Safe mode: the op about to be issued on s waits for the copies in that may still be filling
 * memory at addresses it could reach unseen. Caller holds mem_lock. */
CUresult fill_wait(CUstream s) {
    CUresult r = CUDA_SUCCESS;
    int pending = 0;
    for (unsigned k = 0; k < FILL_N && r == CUDA_SUCCESS; k++) {
        if (!M.fill[k])
            continue;
        if (ev_done(M.fill[k])) {
            ev_drop(M.fill[k]);
            M.fill[k] = NULL;
        } else {
            pending = 1;
            r = ooc_real.cuStreamWaitEvent(s, M.fill[k]->e, 0);
        }
    }
    if (!pending && atomic_load_explicit(&M.fill_on, memory_order_relaxed))
        atomic_store(&M.fill_on, 0);
    return r;
}

/* At shutdown. Caller holds mem_lock. */
void fill_drop(void) {
    for (unsigned k = 0; k < FILL_N; k++) {
        ev_drop(M.fill[k]);
        M.fill[k] = NULL;
    }
    atomic_store(&M.fill_on, 0);
}
