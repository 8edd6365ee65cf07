/* SPDX-License-Identifier: MIT */
/* fc_kernel.c: simulated modules, libraries and kernel launches.
 *
 * Kernels are C functions in tables (fc_ktab.h) gathered at cuInit, plus any a test registers.
 * A module image is "FAKECUDA-MODULE:<name>"; cuModuleGetFunction finds a kernel of that module
 * by name. A library (cuLibraryLoadData) is a module whose kernels also have CUkernel handles of
 * their own, distinct from their functions; a function is loaded lazily (cuFuncIsLoaded) until
 * cuFuncLoad, its first launch, or cuModuleGetFunction. A parameter's alignment is min(size, 8)
 * unless its table entry asks for more (FAKECUDA_PARAM_ALIGNED: a CUtensorMap by value).
 * A launch copies the parameters (from kernelParams or the packed `extra` buffer), notes
 * for strict mode every device range a parameter word points into, and queues the kernel on its
 * stream. Kernels reach memory only through fakecuda_access, which refuses unmapped ranges.
 * A launch on a capturing stream is captured with its parameter bytes; each launch of the graph
 * runs a copy of them, and finds its strict-mode references again then.
 *
 * Locking: the registry has its own mutex; modules and functions are immutable once created,
 * except for a module's lazily filled function table and a function's kernel handle (guarded by
 * the registry mutex) and its loaded flag (atomic). */
#include "fc_internal.h"
#include "fc_ktab.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FC_MAX_KERNELS 1024

static const fakecuda_kernel_t *registry[FC_MAX_KERNELS];
static size_t nregistry;
static pthread_mutex_t reg_lock = PTHREAD_MUTEX_INITIALIZER;

extern const fc_ktab_t __start_fc_ktabs[] __attribute__((weak, visibility("hidden")));
extern const fc_ktab_t __stop_fc_ktabs[] __attribute__((weak, visibility("hidden")));

/* Caller holds reg_lock. */
static const fakecuda_kernel_t *find_kernel(const char *module, const char *name) {
    for (size_t i = 0; i < nregistry; i++)
        if (strcmp(registry[i]->module, module) == 0 && strcmp(registry[i]->name, name) == 0)
            return registry[i];
    return NULL;
}

static int register_locked(const fakecuda_kernel_t *k, size_t n) {
    for (size_t i = 0; i < n; i++) {
        if (k[i].nparams > FAKECUDA_MAX_PARAMS || !k[i].fn || !k[i].module || !k[i].name)
            return -1;
        if (find_kernel(k[i].module, k[i].name) || nregistry == FC_MAX_KERNELS)
            return -1;
    }
    for (size_t i = 0; i < n; i++)
        registry[nregistry++] = &k[i];
    return 0;
}

FAKECUDA_API int fakecuda_register_kernels(const fakecuda_kernel_t *k, size_t n) {
    pthread_mutex_lock(&reg_lock);
    int rc = register_locked(k, n);
    pthread_mutex_unlock(&reg_lock);
    return rc;
}

void fc_kernels_init(void) {
    if (!__start_fc_ktabs)
        return;
    pthread_mutex_lock(&reg_lock);
    for (const fc_ktab_t *t = __start_fc_ktabs; t < __stop_fc_ktabs; t++)
        if (register_locked(t->kernels, t->count) != 0)
            fc_fatal("built-in kernel table starting with %s/%s is malformed or duplicated",
                     t->kernels[0].module, t->kernels[0].name);
    pthread_mutex_unlock(&reg_lock);
}

/* ---- modules, libraries, functions ----------------------------------------------------------- */

struct CUfunc_st {
    uint32_t magic;
    const fakecuda_kernel_t *k;
    unsigned offset[FAKECUDA_MAX_PARAMS];
    unsigned size[FAKECUDA_MAX_PARAMS];
    size_t total_bytes;
    atomic_int loaded;            /* CU_FUNCTION_LOADING_STATE_LOADED once loaded */
    struct CUkern_st *kernel;     /* its library kernel handle, made by cuLibraryGetKernel */
    struct CUfunc_st *spare_next; /* on spare_funcs */
};

/* A library's kernel (CUkernel): a handle of its own, distinct from the function it yields. */
struct CUkern_st {
    uint32_t magic;
    struct CUfunc_st *f;
};

struct CUmod_st {
    uint32_t magic;
    struct CUmod_st *next, *prev; /* the live modules, for teardown */
    char name[64];
    size_t nfuncs;
    struct CUfunc_st **funcs;
};

typedef struct CUfunc_st fc_func_t;
typedef struct CUmod_st fc_module_t;

static fc_module_t *live_modules; /* guarded by reg_lock */

/* Functions of unloaded modules, reused (last freed, first reused) for the next functions made,
 * so that a new module's function can have the handle value an unloaded one had, as with the
 * real driver. Guarded by reg_lock. */
static fc_func_t *spare_funcs;

static unsigned param_align(unsigned size, unsigned want) {
    if (want)
        return want;
    unsigned a = 1;
    while (a < 8 && size % (a * 2) == 0)
        a *= 2;
    return a;
}

/* Caller holds reg_lock. */
static fc_func_t *func_new(const fakecuda_kernel_t *k) {
    fc_func_t *f = spare_funcs;
    if (f) {
        spare_funcs = f->spare_next;
        memset(f, 0, sizeof *f);
    } else if (!(f = calloc(1, sizeof *f))) {
        return NULL;
    }
    f->magic = FC_MAGIC_FUNC;
    f->k = k;
    size_t off = 0;
    for (unsigned i = 0; i < k->nparams; i++) {
        f->size[i] = FAKECUDA_PARAM_SIZE(k->param_bytes[i]);
        unsigned a = param_align(f->size[i], FAKECUDA_PARAM_ALIGN(k->param_bytes[i]));
        off = (off + a - 1) / a * a;
        f->offset[i] = (unsigned)off;
        off += f->size[i];
    }
    f->total_bytes = off;
    return f;
}

static CUresult module_load(fc_module_t **out, const void *image) {
    static const char prefix[] = FAKECUDA_IMAGE_PREFIX;
    if (!out || !image)
        return CUDA_ERROR_INVALID_VALUE;
    if (strncmp(image, prefix, sizeof prefix - 1) != 0)
        return CUDA_ERROR_INVALID_IMAGE;
    const char *name = (const char *)image + sizeof prefix - 1;
    if (strlen(name) >= 64)
        return CUDA_ERROR_INVALID_IMAGE;
    fc_module_t *m = calloc(1, sizeof *m);
    if (!m)
        return CUDA_ERROR_OUT_OF_MEMORY;
    m->magic = FC_MAGIC_MODULE;
    snprintf(m->name, sizeof m->name, "%s", name);
    pthread_mutex_lock(&reg_lock);
    size_t count = 0;
    for (size_t i = 0; i < nregistry; i++)
        if (strcmp(registry[i]->module, name) == 0)
            count++;
    if (count == 0) {
        pthread_mutex_unlock(&reg_lock);
        free(m);
        return CUDA_ERROR_NO_BINARY_FOR_GPU;
    }
    m->next = live_modules;
    if (live_modules)
        live_modules->prev = m;
    live_modules = m;
    pthread_mutex_unlock(&reg_lock);
    FC_STAT(modules_live, 1);
    *out = m;
    return CUDA_SUCCESS;
}

static CUresult module_get(fc_func_t **out, fc_module_t *m, const char *name) {
    if (!out || !name)
        return CUDA_ERROR_INVALID_VALUE;
    if (!m || m->magic != FC_MAGIC_MODULE)
        return CUDA_ERROR_INVALID_HANDLE;
    pthread_mutex_lock(&reg_lock);
    for (size_t i = 0; i < m->nfuncs; i++) {
        if (strcmp(m->funcs[i]->k->name, name) == 0) {
            *out = m->funcs[i];
            pthread_mutex_unlock(&reg_lock);
            return CUDA_SUCCESS;
        }
    }
    const fakecuda_kernel_t *k = find_kernel(m->name, name);
    fc_func_t *f = k ? func_new(k) : NULL;
    fc_func_t **nf = f ? realloc(m->funcs, (m->nfuncs + 1) * sizeof *nf) : NULL;
    if (nf) {
        m->funcs = nf;
        m->funcs[m->nfuncs++] = f;
    }
    pthread_mutex_unlock(&reg_lock);
    if (!k)
        return CUDA_ERROR_NOT_FOUND;
    if (!nf) {
        free(f);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *out = f;
    return CUDA_SUCCESS;
}

/* Frees a module and its functions. Caller holds reg_lock. */
static void module_free(fc_module_t *m) {
    if (m->prev)
        m->prev->next = m->next;
    else
        live_modules = m->next;
    if (m->next)
        m->next->prev = m->prev;
    for (size_t i = 0; i < m->nfuncs; i++) {
        if (m->funcs[i]->kernel) {
            m->funcs[i]->kernel->magic = 0;
            free(m->funcs[i]->kernel);
        }
        fc_func_t *f = m->funcs[i];
        memset(f, 0, sizeof *f); /* magic 0: a stale handle is invalid until reused */
        f->spare_next = spare_funcs;
        spare_funcs = f;
    }
    free(m->funcs);
    m->magic = 0;
    free(m);
}

static CUresult module_unload(fc_module_t *m) {
    if (!m || m->magic != FC_MAGIC_MODULE)
        return CUDA_ERROR_INVALID_HANDLE;
    /* Launches already queued keep their function: wait for them, as unloading on a GPU does. */
    CUresult r = fc_sync_all();
    pthread_mutex_lock(&reg_lock);
    module_free(m);
    pthread_mutex_unlock(&reg_lock);
    FC_STAT(modules_live, -1);
    return r;
}

/* Process teardown releases the modules the program left loaded, as the driver does. */
void fc_kernels_shutdown(void) {
    pthread_mutex_lock(&reg_lock);
    while (live_modules)
        module_free(live_modules);
    while (spare_funcs) {
        fc_func_t *f = spare_funcs;
        spare_funcs = f->spare_next;
        free(f);
    }
    pthread_mutex_unlock(&reg_lock);
}

static CUresult fc_module_load_data(CUmodule *out, const void *image) {
    FC_ENTER("cuModuleLoadData");
    return module_load((fc_module_t **)out, image);
}
FC_EXPORT(cuModuleLoadData, PFN_cuModuleLoadData_v2000, fc_module_load_data);

static CUresult fc_module_load_data_ex(CUmodule *out, const void *image, unsigned int n,
                                       CUjit_option *opts, void **vals) {
    FC_ENTER("cuModuleLoadDataEx");
    (void)n;
    (void)opts;
    (void)vals;
    return module_load((fc_module_t **)out, image);
}
FC_EXPORT(cuModuleLoadDataEx, PFN_cuModuleLoadDataEx_v2010, fc_module_load_data_ex);

static CUresult fc_module_unload(CUmodule m) {
    FC_ENTER("cuModuleUnload");
    return module_unload(m);
}
FC_EXPORT(cuModuleUnload, PFN_cuModuleUnload_v2000, fc_module_unload);

static CUresult fc_module_get_function(CUfunction *out, CUmodule m, const char *name) {
    FC_ENTER("cuModuleGetFunction");
    fc_func_t *f = NULL;
    CUresult r = module_get(&f, m, name);
    if (r != CUDA_SUCCESS)
        return r;
    /* Lazy loading loads a module's function when it is first obtained this way. */
    atomic_store(&f->loaded, 1);
    *out = f;
    return CUDA_SUCCESS;
}
FC_EXPORT(cuModuleGetFunction, PFN_cuModuleGetFunction_v2000, fc_module_get_function);

/* A library is a module. Its CUkernel handles are objects of their own: cuKernelGetFunction
 * yields the (not yet loaded) function; cuLaunchKernel accepts the kernel handle cast to a
 * function, but cuFuncGetParamInfo, cuFuncLoad and cuFuncIsLoaded do not (the driver documents
 * them for functions only): cuKernelGetParamInfo answers for a kernel. */
static CUresult fc_library_load_data(CUlibrary *out, const void *code, CUjit_option *jo, void **jv,
                                     unsigned int nj, CUlibraryOption *lo, void **lv,
                                     unsigned int nl) {
    FC_ENTER("cuLibraryLoadData");
    (void)jo;
    (void)jv;
    (void)lo;
    (void)lv;
    if ((nj && (!jo || !jv)) || (nl && (!lo || !lv)))
        return CUDA_ERROR_INVALID_VALUE;
    fc_module_t *m = NULL;
    CUresult r = module_load(&m, code);
    if (r == CUDA_SUCCESS)
        *out = (CUlibrary)(void *)m;
    return r;
}
FC_EXPORT(cuLibraryLoadData, PFN_cuLibraryLoadData_v12000, fc_library_load_data);

static CUresult fc_library_unload(CUlibrary lib) {
    FC_ENTER("cuLibraryUnload");
    return module_unload((fc_module_t *)(void *)lib);
}
FC_EXPORT(cuLibraryUnload, PFN_cuLibraryUnload_v12000, fc_library_unload);

static CUresult fc_library_get_kernel(CUkernel *out, CUlibrary lib, const char *name) {
    FC_ENTER("cuLibraryGetKernel");
    fc_func_t *f = NULL;
    CUresult r = module_get(&f, (fc_module_t *)(void *)lib, name);
    if (r != CUDA_SUCCESS)
        return r;
    pthread_mutex_lock(&reg_lock);
    if (!f->kernel) {
        f->kernel = calloc(1, sizeof *f->kernel);
        if (f->kernel) {
            f->kernel->magic = FC_MAGIC_KERNEL;
            f->kernel->f = f;
        }
    }
    struct CUkern_st *k = f->kernel;
    pthread_mutex_unlock(&reg_lock);
    if (!k)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *out = k;
    return CUDA_SUCCESS;
}
FC_EXPORT(cuLibraryGetKernel, PFN_cuLibraryGetKernel_v12000, fc_library_get_kernel);

static fc_func_t *func_of(const void *p) {
    const fc_func_t *f = p;
    return (f && f->magic == FC_MAGIC_FUNC) ? (fc_func_t *)f : NULL;
}

static fc_func_t *kernel_of(const void *p) {
    const struct CUkern_st *k = p;
    return (k && k->magic == FC_MAGIC_KERNEL) ? k->f : NULL;
}

static CUresult fc_kernel_get_function(CUfunction *out, CUkernel k) {
    FC_ENTER("cuKernelGetFunction");
    fc_func_t *f = kernel_of(k);
    if (!out)
        return CUDA_ERROR_INVALID_VALUE;
    if (!f)
        return CUDA_ERROR_INVALID_HANDLE;
    *out = f;
    return CUDA_SUCCESS;
}
FC_EXPORT(cuKernelGetFunction, PFN_cuKernelGetFunction_v12000, fc_kernel_get_function);

static CUresult param_info(const fc_func_t *f, size_t index, size_t *offset, size_t *size) {
    if (index >= f->k->nparams || !offset)
        return CUDA_ERROR_INVALID_VALUE;
    *offset = f->offset[index];
    if (size)
        *size = f->size[index];
    return CUDA_SUCCESS;
}

/* A CUkernel cast to CUfunction is not a function here: CUDA_ERROR_INVALID_HANDLE. */
static CUresult fc_func_param_info(CUfunction func, size_t index, size_t *offset, size_t *size) {
    FC_ENTER("cuFuncGetParamInfo");
    fc_func_t *f = func_of(func);
    if (!f)
        return CUDA_ERROR_INVALID_HANDLE;
    return param_info(f, index, offset, size);
}
FC_EXPORT(cuFuncGetParamInfo, PFN_cuFuncGetParamInfo_v12040, fc_func_param_info);

/* The documentation lists only CUDA_ERROR_INVALID_VALUE, for a function handle as well. */
static CUresult fc_kernel_param_info(CUkernel kern, size_t index, size_t *offset, size_t *size) {
    FC_ENTER("cuKernelGetParamInfo");
    fc_func_t *f = kernel_of(kern);
    if (!f)
        return CUDA_ERROR_INVALID_VALUE;
    return param_info(f, index, offset, size);
}
FC_EXPORT(cuKernelGetParamInfo, PFN_cuKernelGetParamInfo_v12040, fc_kernel_param_info);

static CUresult fc_func_name(const char **name, CUfunction func) {
    FC_ENTER("cuFuncGetName");
    fc_func_t *f = func_of(func);
    if (!name)
        return CUDA_ERROR_INVALID_VALUE;
    if (!f)
        return CUDA_ERROR_INVALID_HANDLE;
    *name = f->k->name;
    return CUDA_SUCCESS;
}
FC_EXPORT(cuFuncGetName, PFN_cuFuncGetName_v12030, fc_func_name);

static CUresult fc_kernel_name(const char **name, CUkernel kern) {
    FC_ENTER("cuKernelGetName");
    fc_func_t *f = kernel_of(kern);
    if (!name || !kern)
        return CUDA_ERROR_INVALID_VALUE;
    if (!f)
        return CUDA_ERROR_INVALID_HANDLE;
    *name = f->k->name;
    return CUDA_SUCCESS;
}
FC_EXPORT(cuKernelGetName, PFN_cuKernelGetName_v12030, fc_kernel_name);

static CUresult fc_func_load(CUfunction func) {
    FC_ENTER("cuFuncLoad");
    fc_func_t *f = func_of(func);
    if (!func)
        return CUDA_ERROR_INVALID_VALUE;
    if (!f)
        return CUDA_ERROR_INVALID_HANDLE;
    atomic_store(&f->loaded, 1);
    return CUDA_SUCCESS;
}
FC_EXPORT(cuFuncLoad, PFN_cuFuncLoad_v12040, fc_func_load);

static CUresult fc_func_is_loaded(CUfunctionLoadingState *state, CUfunction func) {
    FC_ENTER("cuFuncIsLoaded");
    fc_func_t *f = func_of(func);
    if (!state || !func)
        return CUDA_ERROR_INVALID_VALUE;
    if (!f)
        return CUDA_ERROR_INVALID_HANDLE;
    *state = atomic_load(&f->loaded) ? CU_FUNCTION_LOADING_STATE_LOADED
                                     : CU_FUNCTION_LOADING_STATE_UNLOADED;
    return CUDA_SUCCESS;
}
FC_EXPORT(cuFuncIsLoaded, PFN_cuFuncIsLoaded_v12040, fc_func_is_loaded);

/* ---- launches ---------------------------------------------------------------------------------
 */

typedef struct launch_payload {
    const fakecuda_kernel_t *k;
    fakecuda_launch_t l;
    void *params[FAKECUDA_MAX_PARAMS];
    int illegal;
    size_t alloc_bytes;               /* of this payload, buf included */
    size_t param_bytes;               /* of buf that hold parameters */
    _Alignas(16) unsigned char buf[]; /* the parameter bytes */
} launch_payload_t;

FAKECUDA_API void *fakecuda_access(fakecuda_launch_t *l, CUdeviceptr p, size_t bytes, int write) {
    fc_op_t *op = l->priv;
    launch_payload_t *lp = op->payload;
    int host = 0;
    if (fc_mem_check_loc((uintptr_t)p, bytes, write ? FC_ACC_RW : FC_ACC_READ, &host) == 0) {
        if (host) {
            /* Host-located memory is reached over the link, as on a GPU: the kernel holds the
             * compute engine for the bytes' time at the link's rate as well (a write access at
             * the device-to-host rate, a read at the host-to-device one). */
            FC_STAT(kernel_host_accesses, 1);
            op->model_ns += (double)bytes / (write ? g_fc.cfg.d2h_gbps : g_fc.cfg.h2d_gbps);
        }
        if (g_fc.cfg.threaded && op->running)
            fc_strict_access(op, (uintptr_t)p, bytes, write);
        return (void *)(uintptr_t)p;
    }
    if (!lp->illegal)
        fc_warn("illegal address: kernel %s %s %zu bytes at %#llx, which is not mapped with "
                "that access",
                lp->k->name, write ? "writes" : "reads", bytes, (unsigned long long)p);
    lp->illegal = 1;
    FC_STAT(illegal_accesses, 1);
    return NULL;
}

FAKECUDA_API void fakecuda_work(fakecuda_launch_t *l, double flops, double bytes) {
    fc_op_t *op = l->priv;
    op->model_ns += flops / g_fc.cfg.gflops + bytes / g_fc.cfg.hbm_gbps;
}

FAKECUDA_API void fakecuda_waited(fakecuda_launch_t *l, uint64_t ns) {
    fc_op_t *op = l->priv;
    op->waited_ns += ns;
}

static CUresult run_launch(fc_op_t *op) {
    launch_payload_t *lp = op->payload;
    lp->l.priv = op;
    int rc = lp->k->fn(&lp->l);
    if (rc != 0 || lp->illegal)
        return CUDA_ERROR_ILLEGAL_ADDRESS;
    return CUDA_SUCCESS;
}

static void dispose_launch(fc_op_t *op) {
    free(op->payload);
}

/* Strict mode: every aligned word of the parameters that points into device memory is a
 * reference (the allocation or single mapping it points into, as mapped now). */
static void launch_refs(fc_op_t *op, const launch_payload_t *lp) {
    for (size_t off = 0; off + 8 <= lp->param_bytes; off += 8) {
        uint64_t w;
        uintptr_t lo, hi;
        memcpy(&w, lp->buf + off, 8);
        if (w && fc_mem_extent((uintptr_t)w, &lo, &hi) == 0)
            fc_op_ref(op, lo, hi, 1);
    }
}

static int clone_launch(fc_op_t *dst, const fc_op_t *src) {
    const launch_payload_t *lp = src->payload;
    launch_payload_t *q = malloc(lp->alloc_bytes);
    if (!q)
        return -1;
    memcpy(q, lp, lp->alloc_bytes);
    for (unsigned i = 0; i < FAKECUDA_MAX_PARAMS; i++)
        if (lp->params[i])
            q->params[i] = q->buf + ((const unsigned char *)lp->params[i] - lp->buf);
    q->l.params = q->params;
    q->l.priv = NULL;
    q->illegal = 0;
    dst->payload = q;
    launch_refs(dst, q);
    return 0;
}

/* Reads the packed parameter buffer out of `extra`; returns 0, or -1 when malformed. */
static int parse_extra(void **extra, void **buf, size_t *size) {
    *buf = NULL;
    *size = 0;
    size_t *sizep = NULL;
    for (size_t i = 0; i < 16; i += 2) {
        if (extra[i] == CU_LAUNCH_PARAM_END)
            return (*buf && sizep) ? (*size = *sizep, 0) : -1;
        if (extra[i] == CU_LAUNCH_PARAM_BUFFER_POINTER)
            *buf = extra[i + 1];
        else if (extra[i] == CU_LAUNCH_PARAM_BUFFER_SIZE)
            sizep = extra[i + 1];
        else
            return -1;
    }
    return -1;
}

CUresult fc_launch_op(CUfunction func, const unsigned grid[3], const unsigned block[3],
                      unsigned shared, void **kparams, void **extra, fc_op_t **out) {
    fc_func_t *f = func_of(func);
    if (!f)
        f = kernel_of(func); /* a CUkernel cast to CUfunction launches, as on the driver */
    if (!f)
        return CUDA_ERROR_INVALID_HANDLE;
    unsigned gx = grid[0], gy = grid[1], gz = grid[2], bx = block[0], by = block[1], bz = block[2];
    if (!gx || !gy || !gz || !bx || !by || !bz || bz > 64 || gy > 65535 || gz > 65535 ||
        (uint64_t)bx * by * bz > 1024)
        return CUDA_ERROR_INVALID_VALUE;
    if (shared > 227 * 1024)
        return CUDA_ERROR_INVALID_VALUE;
    if (kparams && extra)
        return CUDA_ERROR_INVALID_VALUE;
    const fakecuda_kernel_t *k = f->k;
    launch_payload_t *lp = calloc(1, sizeof *lp + f->total_bytes + 8);
    if (!lp)
        return CUDA_ERROR_OUT_OF_MEMORY;
    lp->alloc_bytes = sizeof *lp + f->total_bytes + 8;
    lp->param_bytes = f->total_bytes;
    if (extra) {
        void *buf;
        size_t size;
        if (parse_extra(extra, &buf, &size) != 0 || size < f->total_bytes) {
            free(lp);
            return CUDA_ERROR_INVALID_VALUE;
        }
        memcpy(lp->buf, buf, f->total_bytes);
    } else if (k->nparams) {
        if (!kparams) {
            free(lp);
            return CUDA_ERROR_INVALID_VALUE;
        }
        for (unsigned i = 0; i < k->nparams; i++)
            memcpy(lp->buf + f->offset[i], kparams[i], f->size[i]);
    }
    lp->k = k;
    for (unsigned i = 0; i < k->nparams; i++)
        lp->params[i] = lp->buf + f->offset[i];
    lp->l = (fakecuda_launch_t){{gx, gy, gz}, {bx, by, bz}, shared, lp->params, NULL};
    fc_op_t *op = fc_op_new(k->name, run_launch, lp, dispose_launch);
    if (!op) {
        free(lp);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    atomic_store(&f->loaded, 1); /* a launch finishes loading a lazily loaded function */
    op->engine = FC_ENG_COMPUTE;
    op->model_ns = g_fc.cfg.launch_us * 1000.0;
    launch_refs(op, lp);
    op->n_kernels = 1;
    op->clone = clone_launch;
    *out = op;
    return CUDA_SUCCESS;
}

static CUresult launch(CUfunction func, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                       unsigned by, unsigned bz, unsigned shared, CUstream h, void **kparams,
                       void **extra, int ptds) {
    if (!func_of(func) && !kernel_of(func))
        return CUDA_ERROR_INVALID_HANDLE;
    fc_stream_t *s = fc_stream_resolve(h, ptds);
    if (!s)
        return CUDA_ERROR_INVALID_HANDLE;
    const unsigned grid[3] = {gx, gy, gz}, block[3] = {bx, by, bz};
    fc_op_t *op;
    CUresult r = fc_launch_op(func, grid, block, shared, kparams, extra, &op);
    if (r != CUDA_SUCCESS)
        return r;
    return fc_submit(s, op, NULL);
}

static CUresult fc_launch(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                          unsigned by, unsigned bz, unsigned shared, CUstream h, void **kp,
                          void **extra) {
    FC_ENTER("cuLaunchKernel");
    return launch(f, gx, gy, gz, bx, by, bz, shared, h, kp, extra, 0);
}
FC_EXPORT(cuLaunchKernel, PFN_cuLaunchKernel_v4000, fc_launch);

static CUresult fc_launch_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                               unsigned by, unsigned bz, unsigned shared, CUstream h, void **kp,
                               void **extra) {
    FC_ENTER("cuLaunchKernel");
    return launch(f, gx, gy, gz, bx, by, bz, shared, h, kp, extra, 1);
}
FC_EXPORT(cuLaunchKernel_ptsz, PFN_cuLaunchKernel_v7000_ptsz, fc_launch_ptsz);

static CUresult launch_ex(const CUlaunchConfig *c, CUfunction f, void **kp, void **extra,
                          int ptds) {
    if (!c)
        return CUDA_ERROR_INVALID_VALUE;
    if (c->numAttrs && !c->attrs)
        return CUDA_ERROR_INVALID_VALUE;
    return launch(f, c->gridDimX, c->gridDimY, c->gridDimZ, c->blockDimX, c->blockDimY,
                  c->blockDimZ, c->sharedMemBytes, c->hStream, kp, extra, ptds);
}

static CUresult fc_launch_ex(const CUlaunchConfig *c, CUfunction f, void **kp, void **extra) {
    FC_ENTER("cuLaunchKernelEx");
    return launch_ex(c, f, kp, extra, 0);
}
FC_EXPORT(cuLaunchKernelEx, PFN_cuLaunchKernelEx_v11060, fc_launch_ex);

static CUresult fc_launch_ex_ptsz(const CUlaunchConfig *c, CUfunction f, void **kp, void **extra) {
    FC_ENTER("cuLaunchKernelEx");
    return launch_ex(c, f, kp, extra, 1);
}
FC_EXPORT(cuLaunchKernelEx_ptsz, PFN_cuLaunchKernelEx_v11060_ptsz, fc_launch_ex_ptsz);

static CUresult fc_launch_coop(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                               unsigned by, unsigned bz, unsigned shared, CUstream h, void **kp) {
    FC_ENTER("cuLaunchCooperativeKernel");
    return launch(f, gx, gy, gz, bx, by, bz, shared, h, kp, NULL, 0);
}
FC_EXPORT(cuLaunchCooperativeKernel, PFN_cuLaunchCooperativeKernel_v9000, fc_launch_coop);

static CUresult fc_launch_coop_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz,
                                    unsigned bx, unsigned by, unsigned bz, unsigned shared,
                                    CUstream h, void **kp) {
    FC_ENTER("cuLaunchCooperativeKernel");
    return launch(f, gx, gy, gz, bx, by, bz, shared, h, kp, NULL, 1);
}
FC_EXPORT(cuLaunchCooperativeKernel_ptsz, PFN_cuLaunchCooperativeKernel_v9000_ptsz,
          fc_launch_coop_ptsz);
