/* SPDX-License-Identifier: MIT */
/* kernels_nccl.c: the one kernel (module "nccl", nccl_work) that the simulated libnccl.so.2
 * launches for every collective and Send/Recv.
 *
 * nccl_work(items, count, token) reads `count` work items (fc_nccl.h) from device memory at
 * `items`, then each item's user buffers, all through fakecuda_access, and moves the data
 * through the comm's shared-memory segment that `token` (a host pointer to the comm's
 * fc_nccl_kstate_t) maps. Launches of one comm run one at a time in launch_seq order, whatever
 * streams they were queued on. Items run in order, except that a run of consecutive Send/Recv
 * items progresses together without blocking (a ring exchange cannot deadlock; messages on one
 * (sender, receiver) channel still go in call order); a collective is a point of order. Collectives
 * go in pieces of at most FC_NCCL_SLOT_BYTES per rank: each rank stages its piece in its slot, a
 * barrier, each rank combines the slots in rank order
 * ((in0 op in1) op in2 ...) into its output, a barrier. Every rank runs the same code on the same
 * bytes, so results are bit-identical everywhere. Every wait gives up after the comm's timeout;
 * a timeout, a refused access or a peer's abort marks the segment aborted and fails the kernel
 * (-1: the driver makes CUDA_ERROR_ILLEGAL_ADDRESS sticky), with one line on stderr. */
#include "fc_ktab.h"
#include "fc_nccl.h"

#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef struct run {
    fakecuda_launch_t *l;
    fc_nccl_kstate_t *k;
    const char *what; /* the running operation's name, for messages */
} run_t;

static const char *kind_name(uint32_t kind) {
    static const char *const names[] = {"?",         "AllReduce",     "Reduce", "Broadcast",
                                        "AllGather", "ReduceScatter", "Send",   "Recv"};
    return kind < sizeof names / sizeof names[0] ? names[kind] : "?";
}

static void say(const run_t *r, const char *fmt, ...) {
    char buf[512];
    int n = snprintf(buf, sizeof buf, "fakenccl: rank %d: ", r->k->rank);
    va_list ap;
    va_start(ap, fmt);
    n += vsnprintf(buf + n, sizeof buf - (size_t)n, fmt, ap);
    va_end(ap);
    if (n > (int)sizeof buf - 2)
        n = (int)sizeof buf - 2;
    buf[n++] = '\n';
    ssize_t w = write(2, buf, (size_t)n);
    (void)w;
}

/* Marks the segment aborted by this rank (the first abort wins) and this comm failed. */
static int fail(run_t *r) {
    uint32_t zero = 0;
    __atomic_compare_exchange_n(&r->k->shm->aborted, &zero, (uint32_t)r->k->rank + 1, 0,
                                __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
    __atomic_store_n(&r->k->failed, 1, __ATOMIC_RELEASE);
    return -1;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* One pass of a wait loop: returns 0 to go on, -1 (after the message and marking the abort)
 * when a peer aborted or the deadline passed. `waiting_for` names the ranks awaited. */
static int wait_tick(run_t *r, double deadline, unsigned *spins, const char *waiting_for) {
    uint32_t ab = __atomic_load_n(&r->k->shm->aborted, __ATOMIC_ACQUIRE);
    if (ab && (int)ab - 1 != r->k->rank) {
        say(r, "rank %u aborted", ab - 1);
        __atomic_store_n(&r->k->failed, 1, __ATOMIC_RELEASE);
        return -1;
    }
    if (ab) { /* this rank aborted: ncclCommAbort, or an earlier launch failed */
        say(r, "this rank aborted the communicator; %s not run", r->what);
        return fail(r);
    }
    if (now_s() > deadline) {
        say(r, "timed out after %u s in %s waiting for rank(s) %s", r->k->timeout_s, r->what,
            waiting_for);
        return fail(r);
    }
    double t0 = now_s();
    if (++*spins < 64)
        sched_yield();
    else
        usleep(*spins < 1000 ? 20 : 200);
    fakecuda_waited(r->l, (uint64_t)((now_s() - t0) * 1e9)); /* the engine is held meanwhile */
    return 0;
}

/* Enters the next barrier and waits until every rank has entered it. */
static int barrier(run_t *r) {
    fc_nccl_kstate_t *k = r->k;
    uint64_t my = ++k->step;
    __atomic_store_n(&k->shm->step[k->rank * 8], my, __ATOMIC_RELEASE);
    double deadline = now_s() + k->timeout_s;
    unsigned spins = 0;
    for (;;) {
        char late[256];
        size_t n = 0;
        late[0] = 0;
        for (int q = 0; q < k->nranks; q++)
            if (__atomic_load_n(&k->shm->step[q * 8], __ATOMIC_ACQUIRE) < my && n < 200)
                n += (size_t)snprintf(late + n, sizeof late - n, "%s%d", n ? "," : "", q);
        if (!n)
            return 0;
        if (wait_tick(r, deadline, &spins, late))
            return -1;
    }
}

/* ---- element arithmetic ------------------------------------------------------------------- */

static size_t type_size(int32_t t) {
    switch (t) {
    case ncclInt8:
    case ncclUint8:
        return 1;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32:
        return 4;
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64:
        return 8;
    }
    return 0;
}

#define COMBINE(T)                                                                                 \
    static void combine_##T(T *acc, const T *in, size_t n, int op) {                               \
        for (size_t i = 0; i < n; i++) {                                                           \
            T a = acc[i], b = in[i];                                                               \
            switch (op) {                                                                          \
            case ncclProd:                                                                         \
                acc[i] = (T)(a * b);                                                               \
                break;                                                                             \
            case ncclMax:                                                                          \
                acc[i] = b > a ? b : a;                                                            \
                break;                                                                             \
            case ncclMin:                                                                          \
                acc[i] = b < a ? b : a;                                                            \
                break;                                                                             \
            default: /* ncclSum, ncclAvg */                                                        \
                acc[i] = (T)(a + b);                                                               \
            }                                                                                      \
        }                                                                                          \
    }                                                                                              \
    static void divide_##T(T *acc, size_t n, int by) {                                             \
        for (size_t i = 0; i < n; i++)                                                             \
            acc[i] = (T)(acc[i] / (T)by);                                                          \
    }

COMBINE(int8_t)
COMBINE(uint8_t)
COMBINE(int32_t)
COMBINE(uint32_t)
COMBINE(int64_t)
COMBINE(uint64_t)
COMBINE(float)
COMBINE(double)

/* Unsigned arithmetic wraps as on the GPU; signed products and sums are done unsigned so that
 * overflow wraps too (no undefined behaviour), then read back. */
static void combine(void *acc, const void *in, size_t n, int32_t t, int op) {
    switch (t) {
    case ncclInt8:
        if (op == ncclSum || op == ncclProd || op == ncclAvg)
            combine_uint8_t(acc, in, n, op);
        else
            combine_int8_t(acc, in, n, op);
        break;
    case ncclUint8:
        combine_uint8_t(acc, in, n, op);
        break;
    case ncclInt32:
        if (op == ncclSum || op == ncclProd || op == ncclAvg)
            combine_uint32_t(acc, in, n, op);
        else
            combine_int32_t(acc, in, n, op);
        break;
    case ncclUint32:
        combine_uint32_t(acc, in, n, op);
        break;
    case ncclInt64:
        if (op == ncclSum || op == ncclProd || op == ncclAvg)
            combine_uint64_t(acc, in, n, op);
        else
            combine_int64_t(acc, in, n, op);
        break;
    case ncclUint64:
        combine_uint64_t(acc, in, n, op);
        break;
    case ncclFloat32:
        combine_float(acc, in, n, op);
        break;
    case ncclFloat64:
        combine_double(acc, in, n, op);
        break;
    }
}

static void divide(void *acc, size_t n, int32_t t, int by) {
    switch (t) {
    case ncclInt8:
        divide_int8_t(acc, n, by);
        break;
    case ncclUint8:
        divide_uint8_t(acc, n, by);
        break;
    case ncclInt32:
        divide_int32_t(acc, n, by);
        break;
    case ncclUint32:
        divide_uint32_t(acc, n, by);
        break;
    case ncclInt64:
        divide_int64_t(acc, n, by);
        break;
    case ncclUint64:
        divide_uint64_t(acc, n, by);
        break;
    case ncclFloat32:
        divide_float(acc, n, by);
        break;
    case ncclFloat64:
        divide_double(acc, n, by);
        break;
    }
}

/* out = slot[0] op slot[1] op ... (rank order) over `bytes` at offset `off` of each slot;
 * ncclAvg then divides by nranks. out may not alias a slot. */
static void reduce_slots(run_t *r, const fc_nccl_item_t *it, void *out, size_t off, size_t n) {
    size_t es = type_size(it->datatype);
    memcpy(out, fc_nccl_slot(r->k->shm, 0) + off, n * es);
    for (int q = 1; q < r->k->nranks; q++)
        combine(out, fc_nccl_slot(r->k->shm, q) + off, n, it->datatype, it->op);
    if (it->op == ncclAvg)
        divide(out, n, it->datatype, r->k->nranks);
}

/* ---- collectives ------------------------------------------------------------------------ */

static void *view(run_t *r, CUdeviceptr p, size_t bytes, int write) {
    if (bytes == 0)
        return (void *)"";
    void *h = fakecuda_access(r->l, p, bytes, write);
    if (!h)
        say(r, "%s: %s buffer %#llx (%zu bytes) is not accessible", r->what,
            write ? "receive" : "send", (unsigned long long)p, bytes);
    return h;
}

static int collective(run_t *r, const fc_nccl_item_t *it) {
    fc_nccl_kstate_t *k = r->k;
    int n = k->nranks, me = k->rank;
    size_t es = type_size(it->datatype);
    size_t count = (size_t)it->count, total = count;
    int rooted = it->kind == FC_NCCL_REDUCE || it->kind == FC_NCCL_BROADCAST;
    if (!es || (rooted && (it->peer < 0 || it->peer >= n))) {
        say(r, "%s: bad work item (datatype %d, root %d)", r->what, it->datatype, it->peer);
        return fail(r);
    }
    const unsigned char *src = NULL;
    unsigned char *dst = NULL;
    switch (it->kind) {
    case FC_NCCL_ALLGATHER:
        src = view(r, it->sendbuff, count * es, 0);
        dst = src ? view(r, it->recvbuff, count * es * (size_t)n, 1) : NULL;
        break;
    case FC_NCCL_REDUCESCATTER:
        src = view(r, it->sendbuff, count * es * (size_t)n, 0);
        dst = src ? view(r, it->recvbuff, count * es, 1) : NULL;
        break;
    case FC_NCCL_BROADCAST:
        src = me == it->peer ? view(r, it->sendbuff, count * es, 0) : (const void *)"";
        dst = src ? view(r, it->recvbuff, count * es, 1) : NULL;
        break;
    case FC_NCCL_REDUCE:
        src = view(r, it->sendbuff, count * es, 0);
        dst = !src ? NULL : me == it->peer ? view(r, it->recvbuff, count * es, 1) : (void *)"";
        break;
    default: /* AllReduce */
        src = view(r, it->sendbuff, count * es, 0);
        dst = src ? view(r, it->recvbuff, count * es, 1) : NULL;
    }
    if (!src || !dst)
        return fail(r);
    /* Elements per piece: one slot, or for ReduceScatter one slot split among the ranks. */
    size_t per = FC_NCCL_SLOT_BYTES / es;
    if (it->kind == FC_NCCL_REDUCESCATTER)
        per /= (size_t)n;
    unsigned char *mine = fc_nccl_slot(k->shm, me);
    for (size_t off = 0; off < total; off += per) {
        size_t m = total - off < per ? total - off : per;
        size_t b = m * es, boff = off * es;
        /* Stage. */
        switch (it->kind) {
        case FC_NCCL_BROADCAST:
            if (me == it->peer)
                memcpy(mine, src + boff, b);
            break;
        case FC_NCCL_REDUCESCATTER:
            for (int q = 0; q < n; q++)
                memcpy(mine + (size_t)q * b, src + (size_t)q * count * es + boff, b);
            break;
        default:
            memcpy(mine, src + boff, b);
        }
        if (barrier(r))
            return -1;
        /* Combine or gather. */
        switch (it->kind) {
        case FC_NCCL_ALLREDUCE:
            reduce_slots(r, it, dst + boff, 0, m);
            break;
        case FC_NCCL_REDUCE:
            if (me == it->peer)
                reduce_slots(r, it, dst + boff, 0, m);
            break;
        case FC_NCCL_BROADCAST:
            memmove(dst + boff, fc_nccl_slot(k->shm, it->peer), b);
            break;
        case FC_NCCL_ALLGATHER:
            for (int q = 0; q < n; q++)
                memmove(dst + (size_t)q * count * es + boff, fc_nccl_slot(k->shm, q), b);
            break;
        case FC_NCCL_REDUCESCATTER:
            reduce_slots(r, it, dst + boff, (size_t)me * b, m);
            break;
        }
        if (barrier(r))
            return -1;
    }
    fakecuda_work(r->l, (double)total * (double)n, (double)(total * es) * 2.0);
    return 0;
}

/* ---- Send/Recv ------------------------------------------------------------------------------ */

/* Progress of one p2p item: bytes of the 8-byte length header, then of the payload. */
typedef struct p2p {
    const fc_nccl_item_t *it;
    unsigned char *buf;
    uint64_t bytes, done; /* done counts the header too: the item ends at bytes + 8 */
    long prev;            /* the launch's previous item on the same channel, or -1 */
    unsigned char hdr[8];
} p2p_t;

/* Copies between a channel's ring and a linear buffer, wrapping at the ring's end. */
static void ring_io(unsigned char *ring, uint64_t pos, unsigned char *lin, uint64_t n, int put) {
    uint64_t at = pos % FC_NCCL_CHAN_BYTES;
    uint64_t first = FC_NCCL_CHAN_BYTES - at < n ? FC_NCCL_CHAN_BYTES - at : n;
    if (put) {
        memcpy(ring + at, lin, first);
        memcpy(ring, lin + first, n - first);
    } else {
        memcpy(lin, ring + at, first);
        memcpy(lin + first, ring, n - first);
    }
}

/* Moves what the channel allows for one item; returns bytes moved, or -1 on a length mismatch. */
static int64_t p2p_step(run_t *r, p2p_t *p) {
    fc_nccl_kstate_t *k = r->k;
    int send = p->it->kind == FC_NCCL_SEND;
    fc_nccl_chan_t *ch = send ? fc_nccl_chan(k->shm, k->rank, p->it->peer)
                              : fc_nccl_chan(k->shm, p->it->peer, k->rank);
    unsigned char *ring = (unsigned char *)(ch + 1);
    uint64_t head = __atomic_load_n(&ch->head, __ATOMIC_ACQUIRE);
    uint64_t tail = __atomic_load_n(&ch->tail, __ATOMIC_ACQUIRE);
    uint64_t end = p->bytes + 8, moved = 0;
    uint64_t avail = send ? FC_NCCL_CHAN_BYTES - (head - tail) : head - tail;
    uint64_t pos = send ? head : tail;
    while (avail && p->done < end) {
        uint64_t n;
        if (p->done < 8) {
            n = 8 - p->done < avail ? 8 - p->done : avail;
            ring_io(ring, pos, p->hdr + p->done, n, send);
            if (!send && p->done + n == 8) {
                uint64_t len;
                memcpy(&len, p->hdr, 8);
                if (len != p->bytes) {
                    say(r, "Recv from rank %d: message of %llu bytes, receive buffer of %llu",
                        p->it->peer, (unsigned long long)len, (unsigned long long)p->bytes);
                    return -1;
                }
            }
        } else {
            n = end - p->done < avail ? end - p->done : avail;
            ring_io(ring, pos, p->buf + (p->done - 8), n, send);
        }
        p->done += n, pos += n, avail -= n, moved += n;
    }
    if (moved)
        __atomic_store_n(send ? &ch->head : &ch->tail, pos, __ATOMIC_RELEASE);
    return (int64_t)moved;
}

/* Runs items[0..n) (all Send/Recv) together until all are done, with ps[] their progress. */
static int p2p_loop(run_t *r, const fc_nccl_item_t *items, size_t n, p2p_t *ps) {
    char peers[256];
    long last[2][FC_NCCL_MAX_RANKS]; /* per direction and peer: the last item seen */
    memset(last, 0xff, sizeof last);
    for (size_t i = 0; i < n; i++) {
        const fc_nccl_item_t *it = &items[i];
        int send = it->kind == FC_NCCL_SEND;
        r->what = kind_name(it->kind);
        if (it->peer < 0 || it->peer >= r->k->nranks) {
            say(r, "%s: peer %d out of range", r->what, it->peer);
            return fail(r);
        }
        ps[i] = (p2p_t){
            .it = it, .bytes = it->count * type_size(it->datatype), .prev = last[send][it->peer]};
        last[send][it->peer] = (long)i;
        if (send)
            memcpy(ps[i].hdr, &ps[i].bytes, 8);
        ps[i].buf = view(r, send ? it->sendbuff : it->recvbuff, ps[i].bytes, !send);
        if (!ps[i].buf)
            return fail(r);
    }
    r->what = n == 1 ? kind_name(items[0].kind) : "Send/Recv";
    double deadline = now_s() + r->k->timeout_s;
    unsigned spins = 0;
    for (;;) {
        int pending = 0;
        size_t len = 0;
        uint64_t moved = 0;
        peers[0] = 0;
        for (size_t i = 0; i < n; i++) {
            if (ps[i].done == ps[i].bytes + 8)
                continue;
            /* Messages on one channel go in call order: this one waits for the one before. */
            const p2p_t *pv = ps[i].prev >= 0 ? &ps[ps[i].prev] : NULL;
            if (pv && pv->done < pv->bytes + 8) {
                pending = 1;
                continue;
            }
            int64_t m = p2p_step(r, &ps[i]);
            if (m < 0)
                return fail(r);
            moved += (uint64_t)m;
            if (ps[i].done < ps[i].bytes + 8) {
                pending = 1;
                if (len < 200)
                    len += (size_t)snprintf(peers + len, sizeof peers - len, "%s%d", len ? "," : "",
                                            ps[i].it->peer);
            }
        }
        if (!pending)
            return 0;
        if (moved) {
            deadline = now_s() + r->k->timeout_s;
            spins = 0;
            continue;
        }
        if (wait_tick(r, deadline, &spins, peers))
            return -1;
    }
}

/* Runs items[0..n) (all Send/Recv) together until all are done. */
static int p2p_run(run_t *r, const fc_nccl_item_t *items, size_t n) {
    p2p_t *ps = calloc(n, sizeof *ps);
    if (!ps) {
        say(r, "out of host memory for %zu Send/Recv items", n);
        return fail(r);
    }
    int rc = p2p_loop(r, items, n, ps);
    free(ps);
    return rc;
}

/* ---- the kernel --------------------------------------------------------------------------- */

/* Waits until the comm's previous launch finished (launches may sit on different streams). */
static int wait_turn(run_t *r, uint64_t seq) {
    double deadline = now_s() + r->k->timeout_s;
    unsigned spins = 0;
    r->what = "launch ordering";
    while (__atomic_load_n(&r->k->done_seq, __ATOMIC_ACQUIRE) + 1 < seq)
        if (wait_tick(r, deadline, &spins, "(this rank's earlier launch)"))
            return -1;
    return 0;
}

static int run_items(run_t *r, const fc_nccl_item_t *items, size_t count) {
    if (__atomic_load_n(&r->k->failed, __ATOMIC_ACQUIRE)) {
        say(r, "communicator failed earlier; %s not run", kind_name(items[0].kind));
        return -1;
    }
    for (size_t i = 0; i < count;) {
        if (items[i].kind == FC_NCCL_SEND || items[i].kind == FC_NCCL_RECV) {
            size_t j = i;
            while (j < count && (items[j].kind == FC_NCCL_SEND || items[j].kind == FC_NCCL_RECV))
                j++;
            if (p2p_run(r, items + i, j - i))
                return -1;
            i = j;
        } else {
            r->what = kind_name(items[i].kind);
            if (collective(r, &items[i]))
                return -1;
            i++;
        }
    }
    return 0;
}

/* nccl_work(items, count, token): see fc_nccl.h. */
static int k_nccl_work(fakecuda_launch_t *l) {
    CUdeviceptr dp = FAKECUDA_ARG(l, 0, CUdeviceptr);
    unsigned count = FAKECUDA_ARG(l, 1, unsigned);
    fc_nccl_kstate_t *k = (fc_nccl_kstate_t *)(uintptr_t)FAKECUDA_ARG(l, 2, uint64_t);
    run_t r = {.l = l, .k = k, .what = "nccl_work"};
    const fc_nccl_item_t *items = fakecuda_access(l, dp, (size_t)count * sizeof *items, 0);
    if (!items || count == 0) {
        say(&r, "work items at %#llx (%u) are not readable", (unsigned long long)dp, count);
        return fail(&r);
    }
    uint64_t seq = items[0].launch_seq;
    int rc = wait_turn(&r, seq);
    if (rc == 0)
        rc = run_items(&r, items, count);
    __atomic_store_n(&k->done_seq, seq, __ATOMIC_RELEASE);
    return rc;
}

static const fakecuda_kernel_t nccl_kernels[] = {
    {"nccl",
     FC_NCCL_KERNEL,
     3,
     {sizeof(CUdeviceptr), sizeof(unsigned), sizeof(uint64_t)},
     k_nccl_work},
};
FC_KERNEL_TABLE(nccl_kernels);
