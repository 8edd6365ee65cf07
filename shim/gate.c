/* SPDX-License-Identifier: MIT */
/* gate.c: remapping behind the device (OOC_REMAP_GATE=1).
 *
 * A planned swap-in of a chunk whose own swap-out still copies out, its memory taken by another
 * chunk, needs its address remapped, which only the host can do and only once the device has
 * copied it out. Instead of holding the program's thread until then (wait_op_swapouts), the
 * copy in is queued behind a gate on the host-to-device stream, a cuStreamWaitValue32 on a word
 * of pinned host memory, and a job goes to the mapping thread here: it waits for the copy out
 * (without mem_lock), unmaps the address, maps the new memory there, and writes the job's ticket
 * to the word, which opens the gate. The work the program queued behind the copy reads the
 * address only after that. This relies on what scripts/gpu-first-contact's probe remapgate asks
 * of the real driver (that cuMemUnmap and cuMemMap return while a stream waits on a host word,
 * and that work queued before a remap and run after it reads the new memory): off by default.
 * In safe mode the same job moves a swapped chunk's address from its host alias to device memory
 * (retire.c's swapins_behind_gate): its `after` event then follows the work issued so far on
 * every stream that may reach the address unseen, and every op issued after the job waits for
 * the copy in behind the gate (streams.c's fill_set, FILL_GATE).
 *
 * Invariants: jobs are done in the order pushed, tickets in order (no deadlock: a job's `after`
 * was recorded before its gate, so it can only wait for gates of earlier jobs, done before it);
 * the jobs of one gate (gate_push_batch) share its ticket and the last opens it; until a job is
 * done, its address keeps its old mapping, and no other mapping call may touch it: vmm_unmap,
 * vmm_map_rw and vmm_protect (vmm.c) wait for it first (gate_settle). The mapping thread never
 * takes mem_lock, so a holder of mem_lock may wait for it. Locking: G.lock guards the ring and the
 * counters; the events' references are dropped under mem_lock (gate_reap). A job may also only
 * unmap an address (a staged chunk's spare one, stagegate.c's stages_behind_gate). A watchdog
 * thread (gate_watch) stops the program when a mapping call behind a gate does not return in
 * OOC_GATE_TIMEOUT seconds (a driver that waits for the device would deadlock here). Callers: mem.c
 * (start, stop), worker.c (start), transfer.c (gate_push), retire.c and stagegate.c (the jobs),
 * vmm.c (gate_settle), stage.c (gate_after_at, gate_map_ro). */
#include "mem_int.h"

#include <stdlib.h>
#include <time.h>

typedef struct gjob {
    CUdeviceptr va;
    CUmemGenericAllocationHandle h;
    evref_t *after; /* the copy out: holds a reference, dropped by gate_reap */
    uint32_t ticket;
    int open;  /* the last job of its gate: opens it once done (gate_push_batch) */
    int unmap; /* only unmaps va: a staged chunk's spare address (gate_push_unmap) */
    int ro;    /* maps h read-only for the device: a staged chunk's alias (gate_map_ro) */
} gjob_t;

static struct {
    pthread_mutex_t lock;
    pthread_cond_t cv;      /* a job was pushed, or stop */
    pthread_cond_t done_cv; /* a job was done */
    gjob_t *ring;
    size_t cap, first, next, end; /* [first, next): done, not reaped; [next, end): to do */
    uint32_t issued;              /* the last ticket given */
    uint32_t *word;               /* pinned host memory the gates wait on */
    CUdeviceptr dword;
    CUstream stream; /* the gated copies': a closed gate holds back no other copy */
    pthread_t thread;
    int on, stop;
    /* The watchdog (gate_watch): what the mapping thread does and since when, under lock. */
    pthread_t watch;
    pthread_cond_t watch_cv; /* watch_stop (CLOCK_MONOTONIC) */
    int watch_on, watch_stop;
    unsigned timeout_s;   /* OOC_GATE_TIMEOUT */
    const char *doing;    /* the driver call under way ("cuMemUnmap"), or NULL when idle */
    int mapping;          /* doing is a mapping call (not the wait for a copy out) */
    uint64_t doing_ns;    /* since when (mem_clock_ns) */
    CUdeviceptr doing_va; /* the job's address */
    uint32_t doing_ticket;
    int warned;           /* the current wait or idle stretch was reported */
    uint32_t idle_issued; /* idle, a gate issued and not opened: the ticket issued then */
    uint64_t idle_ns;     /* since when */
} G = {.lock = PTHREAD_MUTEX_INITIALIZER, .timeout_s = 60};

void gate_set_timeout(unsigned s) {
    pthread_mutex_lock(&G.lock);
    G.timeout_s = s ? s : 1;
    pthread_mutex_unlock(&G.lock);
}

/* What the mapping thread starts doing for job j (`call` NULL: nothing, it is done). */
static void doing(const char *call, int mapping, const gjob_t *j) {
    pthread_mutex_lock(&G.lock);
    G.doing = call;
    G.mapping = mapping;
    G.doing_ns = mem_clock_ns();
    G.doing_va = j->va;
    G.doing_ticket = j->ticket;
    G.warned = 0;
    pthread_mutex_unlock(&G.lock);
}

int gate_on(void) {
    return G.on;
}

CUstream gate_stream(void) {
    return G.stream;
}

/* Unmaps and maps one job's address, then opens its gate. A failure is fatal: the copy behind
 * the gate would write the chunk's bytes into another chunk's memory (unmap failed) or fault. */
static void gate_do(const gjob_t *j) {
    doing("cuEventSynchronize", 0, j);
    CUresult r = ooc_real.cuEventSynchronize(j->after->e);
    if ((!j->h && !j->unmap) || r != CUDA_SUCCESS) {
        /* Nothing behind the gate needs the remap; or the device failed (a sticky error: no
         * work behind the gate will run, and the program sees the error on its next call). */
        if (r != CUDA_SUCCESS)
            OOC_LOG_E("remapping behind the device: waiting for the copy out of the chunk at "
                      "%#llx failed (%s)",
                      (unsigned long long)j->va, ooc_real_errname(r));
        if (j->open)
            __atomic_store_n(G.word, j->ticket, __ATOMIC_RELEASE);
        return;
    }
    uint64_t t0 = mem_clock_ns();
    doing("cuMemUnmap", 1, j);
    r = ooc_real.cuMemUnmap(j->va, M.chunk);
    if (r == CUDA_SUCCESS && !j->unmap) {
        doing("cuMemMap", 1, j);
        r = ooc_real.cuMemMap(j->va, M.chunk, 0, j->h, 0);
    }
    if (r == CUDA_SUCCESS && !j->unmap) {
        CUmemAccessDesc d = chunk_access(j->ro);
        doing("cuMemSetAccess", 1, j);
        r = ooc_real.cuMemSetAccess(j->va, M.chunk, &d, 1);
    }
    if (r != CUDA_SUCCESS) {
        OOC_LOG_E("remapping behind the device: the chunk at %#llx could not be moved to its new "
                  "memory (%s); stopping rather than corrupt data",
                  (unsigned long long)j->va, ooc_real_errname(r));
        abort();
    }
    ooc_stats_add(OOC_STAT_vmm_calls, j->unmap ? 1 : 3);
    ooc_stats_add(OOC_STAT_vmm_ns, mem_clock_ns() - t0);
    if (j->open)
        __atomic_store_n(G.word, j->ticket, __ATOMIC_RELEASE);
}

static void *gate_main(void *arg) {
    (void)arg;
    ooc_real.cuCtxSetCurrent(M.ctx);
    pthread_mutex_lock(&G.lock);
    for (;;) {
        if (G.next == G.end) {
            if (G.stop)
                break;
            pthread_cond_wait(&G.cv, &G.lock);
            continue;
        }
        gjob_t j = G.ring[G.next % G.cap];
        pthread_mutex_unlock(&G.lock);
        gate_do(&j);
        pthread_mutex_lock(&G.lock);
        G.doing = NULL;
        G.next++;
        pthread_cond_broadcast(&G.done_cv);
    }
    pthread_mutex_unlock(&G.lock);
    return NULL;
}

/* Whether gate ticket a comes after b (tickets wrap). */
static int ticket_after(uint32_t a, uint32_t b) {
    return (int32_t)(a - b) > 0;
}

/* The watchdog: once a second, looks at the mapping thread. A mapping call that has not returned
 * in OOC_GATE_TIMEOUT seconds is a driver that waits for the device before it remaps: the device
 * waits for the gate the call would open, so nothing would ever move; the shim stops with what
 * it saw rather than hang. A copy out waited for that long, or a gate the device waits behind
 * with no job to open it, is reported once (the first is a slow device, or work that cannot
 * end; the second a bug). The watchdog never touches the device. */
static void *gate_watch(void *arg) {
    (void)arg;
    pthread_mutex_lock(&G.lock);
    while (!G.watch_stop) {
        struct timespec until;
        clock_gettime(CLOCK_MONOTONIC, &until);
        until.tv_sec += 1;
        pthread_cond_timedwait(&G.watch_cv, &G.lock, &until);
        if (G.watch_stop)
            break;
        uint64_t now = mem_clock_ns(), lim = (uint64_t)G.timeout_s * 1000000000u;
        uint32_t word = __atomic_load_n(G.word, __ATOMIC_ACQUIRE);
        if (G.doing && G.mapping && now - G.doing_ns >= lim) {
            OOC_LOG_E("remapping behind the device (OOC_REMAP_GATE=1): %s of the chunk at %#llx "
                      "has not returned in %u s (OOC_GATE_TIMEOUT) while the device waits for "
                      "the gate it would open (ticket %u; opened up to %u): this driver waits "
                      "for the device before it remaps, which remapping behind the device cannot "
                      "work with; stopping rather than hang. Run with OOC_REMAP_GATE=0.",
                      G.doing, (unsigned long long)G.doing_va, G.timeout_s, G.doing_ticket, word);
            abort();
        }
        if (G.doing && !G.mapping && now - G.doing_ns >= lim && !G.warned) {
            G.warned = 1;
            OOC_LOG_W("remapping behind the device: waited %u s (OOC_GATE_TIMEOUT) for the "
                      "device to finish the copy out of the chunk at %#llx (gate ticket %u; "
                      "gates issued up to %u, opened up to %u; %zu jobs to do)",
                      G.timeout_s, (unsigned long long)G.doing_va, G.doing_ticket, G.issued, word,
                      G.end - G.next);
        }
        if (G.doing || G.next != G.end || !ticket_after(G.issued, word)) {
            G.idle_ns = 0;
            continue;
        }
        if (!G.idle_ns || G.idle_issued != G.issued) {
            G.idle_ns = now;
            G.idle_issued = G.issued;
            G.warned = 0;
        } else if (now - G.idle_ns >= lim && !G.warned) {
            G.warned = 1;
            OOC_LOG_E("remapping behind the device: gate %u was queued on the device %u s ago "
                      "(OOC_GATE_TIMEOUT) with no remap to open it (gates opened up to %u): "
                      "the work behind it cannot run (a bug in the shim; OOC_REMAP_GATE=0 "
                      "avoids it)",
                      G.issued, G.timeout_s, word);
        }
    }
    pthread_mutex_unlock(&G.lock);
    return NULL;
}

/* Starts the watchdog (caller holds mem_lock, the mapping thread runs). A failure leaves it off:
 * the gates work without it. */
static void watch_start(void) {
    pthread_condattr_t ca;
    if (pthread_condattr_init(&ca) != 0)
        return;
    int ok = pthread_condattr_setclock(&ca, CLOCK_MONOTONIC) == 0 &&
             pthread_cond_init(&G.watch_cv, &ca) == 0;
    pthread_condattr_destroy(&ca);
    if (!ok)
        return;
    G.watch_stop = 0;
    G.idle_ns = 0;
    if (pthread_create(&G.watch, NULL, gate_watch, NULL) != 0) {
        pthread_cond_destroy(&G.watch_cv);
        OOC_LOG_W("remapping behind the device: no watchdog thread; a driver that waits for "
                  "the device before it remaps would hang the program");
        return;
    }
    G.watch_on = 1;
}

/* Stops the watchdog, after the mapping thread (which it watches until it ends). */
static void watch_stop(void) {
    if (!G.watch_on)
        return;
    pthread_mutex_lock(&G.lock);
    G.watch_stop = 1;
    pthread_cond_signal(&G.watch_cv);
    pthread_mutex_unlock(&G.lock);
    pthread_join(G.watch, NULL);
    pthread_cond_destroy(&G.watch_cv);
    G.watch_on = 0;
}

/* Starts the mapping thread (caller holds mem_lock, the context is current). 0, or -1 when the
 * driver cannot give a word both sides see (the gate stays off). */
int gate_start(void) {
    void *w = NULL;
    if (G.on)
        return 0;
    if (ooc_real.cuMemHostAlloc(&w, 64, CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_PORTABLE) !=
        CUDA_SUCCESS)
        return -1;
    if (ooc_real.cuStreamCreate(&G.stream, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS) {
        ooc_real.cuMemFreeHost(w);
        return -1;
    }
    G.word = w;
    *G.word = 0;
    G.dword = (CUdeviceptr)(uintptr_t)w; /* unified addressing: the same address on the device */
    if (ooc_real.cuMemHostGetDevicePointer_v2 &&
        ooc_real.cuMemHostGetDevicePointer_v2(&G.dword, w, 0) != CUDA_SUCCESS)
        G.dword = (CUdeviceptr)(uintptr_t)w;
    pthread_cond_init(&G.cv, NULL);
    pthread_cond_init(&G.done_cv, NULL);
    G.stop = 0;
    if (pthread_create(&G.thread, NULL, gate_main, NULL) != 0) {
        ooc_real.cuStreamDestroy_v2(G.stream);
        ooc_real.cuMemFreeHost(w);
        G.word = NULL;
        return -1;
    }
    G.on = 1;
    watch_start();
    return 0;
}

/* Stops the mapping thread once its jobs are done, and drops every reference (caller holds
 * mem_lock; the mapping thread never takes it). */
void gate_stop(void) {
    if (!G.on)
        return;
    pthread_mutex_lock(&G.lock);
    G.stop = 1;
    pthread_cond_signal(&G.cv);
    pthread_mutex_unlock(&G.lock);
    pthread_join(G.thread, NULL);
    watch_stop();
    gate_reap();
    free(G.ring);
    G.ring = NULL;
    G.cap = G.first = G.next = G.end = 0;
    pthread_cond_destroy(&G.cv);
    pthread_cond_destroy(&G.done_cv);
    ooc_real.cuStreamDestroy_v2(G.stream); /* its work, if any, still runs */
    G.stream = NULL;
    G.on = 0;
}

/* Frees the pinned word, after the device is idle (shutdown). */
void gate_free_word(void) {
    if (G.word && !G.on) {
        ooc_real.cuMemFreeHost(G.word);
        G.word = NULL;
    }
}

/* Queues on stream s the gate of the next job; its ticket in *ticket. Caller holds mem_lock. */
CUresult gate_wait_on(CUstream s, uint32_t *ticket) {
    pthread_mutex_lock(&G.lock);
    uint32_t t = G.issued + 1;
    pthread_mutex_unlock(&G.lock);
    CUresult r = ooc_real.cuStreamWaitValue32_v2(s, G.dword, t, CU_STREAM_WAIT_VALUE_GEQ);
    if (r == CUDA_SUCCESS) {
        pthread_mutex_lock(&G.lock);
        G.issued = t;
        pthread_mutex_unlock(&G.lock);
        *ticket = t;
        ooc_stats_add(OOC_STAT_gates, 1);
    }
    return r;
}

/* Room for one more job, so that gate_push cannot fail once work is queued behind its gate.
 * Caller holds mem_lock. 0, or -1 without memory. */
int gate_reserve(void) {
    return gate_reserve_n(1);
}

/* Room for `more` more jobs (gate_push_batch). Caller holds mem_lock. 0, or -1 without memory. */
int gate_reserve_n(size_t more) {
    gate_reap();
    pthread_mutex_lock(&G.lock);
    int rc = 0;
    if (G.end - G.first + more > G.cap) {
        size_t nc = G.cap ? G.cap * 2 : 16;
        while (nc < G.end - G.first + more)
            nc *= 2;
        gjob_t *n = malloc(nc * sizeof *n);
        if (n) {
            for (size_t i = G.first; i < G.end; i++)
                n[i % nc] = G.ring[i % G.cap];
            free(G.ring);
            G.ring = n;
            G.cap = nc;
        } else {
            rc = -1;
        }
    }
    pthread_mutex_unlock(&G.lock);
    return rc;
}

/* The job of the gate just queued (gate_wait_on; room made by gate_reserve before it): after
 * the copy out `after` (a reference is taken), map h at va; h 0: only open the gate then.
 * Caller holds mem_lock. */
void gate_push(uint32_t ticket, evref_t *after, CUdeviceptr va, CUmemGenericAllocationHandle h) {
    gate_push_batch(ticket, after, va, h, 1);
}

/* Queues job j (a reference on its `after` taken) and wakes the mapping thread for a gate's last.
 */
static void push(gjob_t j) {
    pthread_mutex_lock(&G.lock);
    j.after->refs++;
    G.ring[G.end % G.cap] = j;
    G.end++;
    if (j.open)
        pthread_cond_signal(&G.cv);
    pthread_mutex_unlock(&G.lock);
}

/* One job of the gate just queued (room made by gate_reserve_n): after `after` (a reference is
 * taken), map h at va; `last`: the gate's last job, which opens it once done (the jobs before it
 * on the same ticket remap only). Caller holds mem_lock. */
void gate_push_batch(uint32_t ticket, evref_t *after, CUdeviceptr va,
                     CUmemGenericAllocationHandle h, int last) {
    push((gjob_t){.va = va, .h = h, .after = after, .ticket = ticket, .open = last});
}

/* A job of the gate just queued (room made by gate_reserve_n) that only unmaps va once `after`
 * is done: a staged chunk's spare address, whose copy `after` follows. The address may be given
 * back at once: a later mapping call there waits for the job (gate_settle). */
void gate_push_unmap(uint32_t ticket, evref_t *after, CUdeviceptr va, int last) {
    push((gjob_t){.va = va, .after = after, .ticket = ticket, .open = last, .unmap = 1});
}

/* Drops the references of the jobs done (caller holds mem_lock). */
void gate_reap(void) {
    if (!G.ring)
        return;
    for (;;) {
        pthread_mutex_lock(&G.lock);
        evref_t *v = G.first < G.next ? G.ring[G.first++ % G.cap].after : NULL;
        pthread_mutex_unlock(&G.lock);
        if (!v)
            return;
        ev_drop(v);
    }
}

/* One past the last job still to do at va, or 0. Caller holds G.lock. */
static size_t last_at(CUdeviceptr va) {
    size_t last = 0;
    for (size_t i = G.next; i < G.end; i++) {
        const gjob_t *j = &G.ring[i % G.cap];
        if (j->va == va && (j->h || j->unmap))
            last = i + 1;
    }
    return last;
}

/* The event that the last job still to come at va waits for (a reference taken: the caller drops
 * it), or NULL when none: for a swap-out's remap to the host copy, it follows that copy out, so
 * work ordered after it may read the host copy before the gate opens. Caller holds mem_lock. */
evref_t *gate_after_at(CUdeviceptr va) {
    if (!G.on)
        return NULL;
    pthread_mutex_lock(&G.lock);
    size_t last = last_at(va);
    evref_t *e = last ? G.ring[(last - 1) % G.cap].after : NULL;
    if (e)
        e->refs++; /* (references change under mem_lock; gate_reap drops them there too) */
    pthread_mutex_unlock(&G.lock);
    return e;
}

/* The last job still to come at va maps memory there and has not started: it will map it
 * read-only for the device, as vmm_protect would once it is done, without waiting for it (a
 * staged chunk whose alias is still to come, stage.c). Returns 1 when so; 0 when no such job
 * (none, or it may have started: the caller protects it with vmm_protect). */
int gate_map_ro(CUdeviceptr va) {
    if (!G.on)
        return 0;
    pthread_mutex_lock(&G.lock);
    size_t last = last_at(va);
    gjob_t *j = last ? &G.ring[(last - 1) % G.cap] : NULL;
    /* (The mapping thread works on a copy of the job at G.next: the ones after it are not read.) */
    int ok = j && last - 1 > G.next && j->h && !j->unmap;
    if (ok)
        j->ro = 1;
    pthread_mutex_unlock(&G.lock);
    return ok;
}

/* Before a mapping call at the chunk-sized address va: waits until no job still has to remap
 * it (caller holds mem_lock; the mapping thread does not need it). */
void gate_settle(CUdeviceptr va) {
    if (!G.on)
        return;
    pthread_mutex_lock(&G.lock);
    size_t last = last_at(va); /* one past the last job still to do there */
    if (last) {
        uint64_t t0 = wait_begin();
        while (G.next < last)
            pthread_cond_wait(&G.done_cv, &G.lock);
        wait_end(t0);
        ooc_stats_add(OOC_STAT_gate_settles, 1);
    }
    pthread_mutex_unlock(&G.lock);
}
