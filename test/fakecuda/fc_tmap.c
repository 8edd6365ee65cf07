/* SPDX-License-Identifier: MIT */
/* fc_tmap.c: simulated TMA descriptors: cuTensorMapEncodeTiled, cuTensorMapEncodeIm2col,
 * cuTensorMapEncodeIm2colWide and cuTensorMapReplaceAddress, and the decoder kernels use.
 *
 * A CUtensorMap is opaque (cuda.h: 16 64-bit words) and the driver does not document where the
 * global address sits in it. So that nothing can rely on finding it by scanning for an aligned
 * 64-bit word, this encoding scrambles it: the address is XORed with a key derived from the rest
 * of the descriptor and split in two 32-bit halves stored at unaligned byte offsets (5 and 77),
 * so it is never stored as a plain word (a scan of the aligned words finds it only by chance;
 * the suite checks that it does not). A check byte (the last) makes a descriptor that was not
 * encoded here, or was altered, undecodable: a kernel given one faults. Kernels take the descriptor
 * by value (a
 * __grid_constant__ parameter, FAKECUDA_PARAM_ALIGNED(128, 64)) and reach the tensor only
 * through fakecuda_tensor_map_decode and fakecuda_access.
 *
 * Encoding checks every rule the reference manual states for its arguments (descriptor aligned to
 * 64 bytes, a known data type, rank, address alignment, dimensions, strides, box, element
 * strides, interleave, swizzle, L2 promotion, OOB fill, and the im2col corners, channels and
 * pixels) and fails with CUDA_ERROR_INVALID_VALUE; it does not require the address to be
 * allocated (the driver does not say it checks, and the memory is checked when a kernel reaches
 * it). No locks: descriptors are plain values. */
#include "fc_internal.h"

#include <string.h>

#define TM_KIND_TILED  1
#define TM_KIND_IM2COL 2
#define TM_KIND_WIDE   3

#define OFF_ADDR_LO 5  /* u32, unaligned */
#define OFF_ADDR_HI 77 /* u32, unaligned */
#define OFF_CHECK   127

/* Bits per element of each CUtensorMapDataType, 0 for an unknown one. */
static unsigned elem_bits(unsigned t) {
    static const unsigned char bits[] = {8,  16, 32, 32, 64, 64, 16, 32,
                                         64, 16, 32, 32, 32, 4,  4,  6};
    return t < sizeof bits ? bits[t] : 0;
}

static int packed16(unsigned t) {
    return t == CU_TENSOR_MAP_DATA_TYPE_16U4_ALIGN16B || t == CU_TENSOR_MAP_DATA_TYPE_16U6_ALIGN16B;
}

static uint32_t key(const unsigned char *b, int hi) {
    uint32_t h = hi ? 0x9e3779b9u : 0x85ebca6bu;
    for (int i = 0; i < 64; i++)
        if (i < OFF_ADDR_LO || i >= OFF_ADDR_LO + 4)
            h = (h ^ b[i]) * 0x01000193u;
    return h;
}

static unsigned char check_byte(const unsigned char *b) {
    unsigned char c = 0x5a;
    for (int i = 0; i < OFF_CHECK; i++)
        c = (unsigned char)((c << 1 | c >> 7) ^ b[i]);
    return c;
}

static void put_addr(unsigned char *b, uint64_t a) {
    uint32_t lo = (uint32_t)a ^ key(b, 0), hi = (uint32_t)(a >> 32) ^ key(b, 1);
    memcpy(b + OFF_ADDR_LO, &lo, 4);
    memcpy(b + OFF_ADDR_HI, &hi, 4);
    b[OFF_CHECK] = check_byte(b);
}

/* Layout of the rest (bytes 64.. are the address's high half and padding): 0 kind, 1 data type,
 * 2 rank, 3 interleave, 4 swizzle, 9 L2 promotion, 10 OOB fill, 12.. five u32 dims minus one,
 * 32.. four 40-bit strides, 52.. five u8 box sizes minus one, 57.. five element strides. */
static void put_common(unsigned char *b, unsigned kind, unsigned dtype, unsigned rank,
                       const cuuint64_t *dim, const cuuint64_t *stride, const cuuint32_t *box,
                       const cuuint32_t *es, unsigned il, unsigned sw, unsigned l2, unsigned oob) {
    memset(b, 0, 128);
    b[0] = (unsigned char)kind;
    b[1] = (unsigned char)dtype;
    b[2] = (unsigned char)rank;
    b[3] = (unsigned char)il;
    b[4] = (unsigned char)sw;
    b[9] = (unsigned char)l2;
    b[10] = (unsigned char)oob;
    for (unsigned i = 0; i < rank; i++) {
        uint32_t d = (uint32_t)(dim[i] - 1);
        memcpy(b + 12 + 4 * i, &d, 4);
        if (i + 1 < rank)
            for (int k = 0; k < 5; k++)
                b[32 + 5 * i + k] = (unsigned char)(stride[i] >> (8 * k));
        b[52 + i] = (unsigned char)((box ? box[i] : 1) - 1);
        b[57 + i] = (unsigned char)es[i];
    }
}

/* The rules every encode shares (see the header comment). */
static CUresult check_common(const CUtensorMap *tm, unsigned dtype, unsigned rank,
                             unsigned min_rank, const void *addr, const cuuint64_t *dim,
                             const cuuint64_t *stride, const cuuint32_t *es, unsigned il,
                             unsigned sw, unsigned l2, unsigned oob) {
    if (!tm || (uintptr_t)tm % 64 || !elem_bits(dtype) || rank < min_rank || rank > 5 || !dim ||
        (rank > 1 && !stride) || !es)
        return CUDA_ERROR_INVALID_VALUE;
    if (il > CU_TENSOR_MAP_INTERLEAVE_32B || sw > CU_TENSOR_MAP_SWIZZLE_128B_ATOM_64B ||
        l2 > CU_TENSOR_MAP_L2_PROMOTION_L2_256B ||
        oob > CU_TENSOR_MAP_FLOAT_OOB_FILL_NAN_REQUEST_ZERO_FMA)
        return CUDA_ERROR_INVALID_VALUE;
    if (il != CU_TENSOR_MAP_INTERLEAVE_NONE && rank < 3)
        return CUDA_ERROR_INVALID_VALUE;
    if (il == CU_TENSOR_MAP_INTERLEAVE_32B && sw != CU_TENSOR_MAP_SWIZZLE_32B)
        return CUDA_ERROR_INVALID_VALUE;
    unsigned align = (il == CU_TENSOR_MAP_INTERLEAVE_32B || packed16(dtype)) ? 32 : 16;
    if (!addr || (uintptr_t)addr % align)
        return CUDA_ERROR_INVALID_VALUE;
    for (unsigned i = 0; i < rank; i++) {
        if (dim[i] == 0 || dim[i] > (1ull << 32) || es[i] == 0 || es[i] > 8)
            return CUDA_ERROR_INVALID_VALUE;
        if (i + 1 < rank && (stride[i] % align || stride[i] >= (1ull << 40)))
            return CUDA_ERROR_INVALID_VALUE;
    }
    if (packed16(dtype) && dim[0] % 128)
        return CUDA_ERROR_INVALID_VALUE;
    if (dtype == CU_TENSOR_MAP_DATA_TYPE_16U4_ALIGN8B && dim[0] % 2)
        return CUDA_ERROR_INVALID_VALUE;
    int is_float =
        dtype >= CU_TENSOR_MAP_DATA_TYPE_FLOAT16 && dtype <= CU_TENSOR_MAP_DATA_TYPE_TFLOAT32_FTZ;
    if (oob != CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE && !is_float)
        return CUDA_ERROR_INVALID_VALUE;
    return CUDA_SUCCESS;
}

/* The swizzle's span bounds the inner extent (box or channels) in bytes, without interleave. */
static CUresult check_inner(unsigned dtype, unsigned il, unsigned sw, uint64_t inner_elems,
                            int need16) {
    uint64_t bytes = inner_elems * elem_bits(dtype) / 8;
    if (il == CU_TENSOR_MAP_INTERLEAVE_NONE) {
        if (need16 && bytes % 16)
            return CUDA_ERROR_INVALID_VALUE;
        uint64_t span = sw == CU_TENSOR_MAP_SWIZZLE_NONE  ? UINT64_MAX
                        : sw == CU_TENSOR_MAP_SWIZZLE_32B ? 32
                        : sw == CU_TENSOR_MAP_SWIZZLE_64B ? 64
                                                          : 128;
        if (bytes > span)
            return CUDA_ERROR_INVALID_VALUE;
    }
    return CUDA_SUCCESS;
}

static CUresult fc_encode_tiled(CUtensorMap *tm, CUtensorMapDataType dtype, cuuint32_t rank,
                                void *addr, const cuuint64_t *dim, const cuuint64_t *stride,
                                const cuuint32_t *box, const cuuint32_t *es,
                                CUtensorMapInterleave il, CUtensorMapSwizzle sw,
                                CUtensorMapL2promotion l2, CUtensorMapFloatOOBfill oob) {
    FC_ENTER("cuTensorMapEncodeTiled");
    CUresult r = check_common(tm, dtype, rank, 1, addr, dim, stride, es, il, sw, l2, oob);
    if (r != CUDA_SUCCESS)
        return r;
    if (!box)
        return CUDA_ERROR_INVALID_VALUE;
    for (unsigned i = 0; i < rank; i++)
        if (box[i] == 0 || box[i] > 256)
            return CUDA_ERROR_INVALID_VALUE;
    if (packed16(dtype) && box[0] != 128)
        return CUDA_ERROR_INVALID_VALUE;
    if ((r = check_inner(dtype, il, sw, box[0], 1)) != CUDA_SUCCESS)
        return r;
    unsigned char b[128];
    put_common(b, TM_KIND_TILED, dtype, rank, dim, stride, box, es, il, sw, l2, oob);
    put_addr(b, (uintptr_t)addr);
    memcpy(tm, b, sizeof b);
    return CUDA_SUCCESS;
}
FC_EXPORT(cuTensorMapEncodeTiled, PFN_cuTensorMapEncodeTiled_v12000, fc_encode_tiled);

static CUresult fc_encode_im2col(CUtensorMap *tm, CUtensorMapDataType dtype, cuuint32_t rank,
                                 void *addr, const cuuint64_t *dim, const cuuint64_t *stride,
                                 const int *lower, const int *upper, cuuint32_t channels,
                                 cuuint32_t pixels, const cuuint32_t *es, CUtensorMapInterleave il,
                                 CUtensorMapSwizzle sw, CUtensorMapL2promotion l2,
                                 CUtensorMapFloatOOBfill oob) {
    FC_ENTER("cuTensorMapEncodeIm2col");
    CUresult r = check_common(tm, dtype, rank, 3, addr, dim, stride, es, il, sw, l2, oob);
    if (r != CUDA_SUCCESS)
        return r;
    if (!lower || !upper || channels == 0 || channels > 256 || pixels == 0 || pixels > 1024)
        return CUDA_ERROR_INVALID_VALUE;
    if (packed16(dtype) && channels != 128)
        return CUDA_ERROR_INVALID_VALUE;
    int lim = rank == 3 ? 32768 : rank == 4 ? 128 : 16;
    for (unsigned i = 0; i + 2 < rank; i++)
        if (lower[i] < -lim || lower[i] >= lim || upper[i] < -lim || upper[i] >= lim)
            return CUDA_ERROR_INVALID_VALUE;
    if ((r = check_inner(dtype, il, sw, channels, 0)) != CUDA_SUCCESS)
        return r;
    unsigned char b[128];
    put_common(b, TM_KIND_IM2COL, dtype, rank, dim, stride, NULL, es, il, sw, l2, oob);
    for (unsigned i = 0; i + 2 < rank; i++) {
        b[90 + 2 * i] = (unsigned char)lower[i];
        b[91 + 2 * i] = (unsigned char)upper[i];
    }
    put_addr(b, (uintptr_t)addr);
    memcpy(tm, b, sizeof b);
    return CUDA_SUCCESS;
}
FC_EXPORT(cuTensorMapEncodeIm2col, PFN_cuTensorMapEncodeIm2col_v12000, fc_encode_im2col);

static CUresult fc_encode_wide(CUtensorMap *tm, CUtensorMapDataType dtype, cuuint32_t rank,
                               void *addr, const cuuint64_t *dim, const cuuint64_t *stride,
                               int lower_w, int upper_w, cuuint32_t channels, cuuint32_t pixels,
                               const cuuint32_t *es, CUtensorMapInterleave il,
                               CUtensorMapIm2ColWideMode mode, CUtensorMapSwizzle sw,
                               CUtensorMapL2promotion l2, CUtensorMapFloatOOBfill oob) {
    FC_ENTER("cuTensorMapEncodeIm2colWide");
    CUresult r = check_common(tm, dtype, rank, 3, addr, dim, stride, es, il, sw, l2, oob);
    if (r != CUDA_SUCCESS)
        return r;
    if (mode != CU_TENSOR_MAP_IM2COL_WIDE_MODE_W && mode != CU_TENSOR_MAP_IM2COL_WIDE_MODE_W128)
        return CUDA_ERROR_INVALID_VALUE;
    if (lower_w < -32768 || lower_w > 32767 || upper_w < -32768 || upper_w > 32767)
        return CUDA_ERROR_INVALID_VALUE;
    if (channels == 0 || channels > 256 || (packed16(dtype) && channels != 128))
        return CUDA_ERROR_INVALID_VALUE;
    if (mode == CU_TENSOR_MAP_IM2COL_WIDE_MODE_W && (pixels == 0 || pixels > 1024))
        return CUDA_ERROR_INVALID_VALUE;
    if (il != CU_TENSOR_MAP_INTERLEAVE_NONE ||
        (sw != CU_TENSOR_MAP_SWIZZLE_64B && sw != CU_TENSOR_MAP_SWIZZLE_128B &&
         sw != CU_TENSOR_MAP_SWIZZLE_128B_ATOM_32B && sw != CU_TENSOR_MAP_SWIZZLE_128B_ATOM_64B))
        return CUDA_ERROR_INVALID_VALUE;
    if ((r = check_inner(dtype, il, sw, channels, 0)) != CUDA_SUCCESS)
        return r;
    unsigned char b[128];
    put_common(b, TM_KIND_WIDE, dtype, rank, dim, stride, NULL, es, il, sw, l2, oob);
    b[90] = (unsigned char)mode;
    memcpy(b + 92, &lower_w, 4);
    memcpy(b + 96, &upper_w, 4);
    put_addr(b, (uintptr_t)addr);
    memcpy(tm, b, sizeof b);
    return CUDA_SUCCESS;
}
FC_EXPORT(cuTensorMapEncodeIm2colWide, PFN_cuTensorMapEncodeIm2colWide_v12080, fc_encode_wide);

FAKECUDA_API int fakecuda_tensor_map_decode(const void *tmap, fakecuda_tensor_map_t *out) {
    unsigned char b[128];
    memcpy(b, tmap, sizeof b);
    if (b[OFF_CHECK] != check_byte(b) || b[0] < TM_KIND_TILED || b[0] > TM_KIND_WIDE ||
        !elem_bits(b[1]) || b[2] < 1 || b[2] > 5)
        return -1;
    memset(out, 0, sizeof *out);
    uint32_t lo, hi;
    memcpy(&lo, b + OFF_ADDR_LO, 4);
    memcpy(&hi, b + OFF_ADDR_HI, 4);
    out->base = (CUdeviceptr)((uint64_t)(hi ^ key(b, 1)) << 32 | (lo ^ key(b, 0)));
    out->kind = b[0];
    out->dtype = b[1];
    out->rank = b[2];
    out->elem_bits = elem_bits(b[1]);
    for (unsigned i = 0; i < out->rank; i++) {
        uint32_t d;
        memcpy(&d, b + 12 + 4 * i, 4);
        out->dims[i] = (uint64_t)d + 1;
        out->box[i] = out->kind == TM_KIND_TILED ? b[52 + i] + 1u : 0;
        if (i == 0) {
            out->strides[0] = (out->elem_bits + 7) / 8;
        } else {
            uint64_t st = 0;
            for (int k = 0; k < 5; k++)
                st |= (uint64_t)b[32 + 5 * (i - 1) + k] << (8 * k);
            out->strides[i] = st;
        }
    }
    return 0;
}

FAKECUDA_API uint64_t fakecuda_tensor_map_span(const fakecuda_tensor_map_t *t) {
    uint64_t span = t->dims[0] * t->elem_bits / 8;
    for (unsigned i = 1; i < t->rank; i++)
        span += (t->dims[i] - 1) * t->strides[i];
    return span;
}

static CUresult fc_replace_address(CUtensorMap *tm, void *addr) {
    FC_ENTER("cuTensorMapReplaceAddress");
    fakecuda_tensor_map_t t;
    if (!tm || (uintptr_t)tm % 64 || fakecuda_tensor_map_decode(tm, &t) != 0)
        return CUDA_ERROR_INVALID_VALUE;
    unsigned char b[128];
    memcpy(b, tm, sizeof b);
    unsigned align = (b[3] == CU_TENSOR_MAP_INTERLEAVE_32B || packed16(b[1])) ? 32 : 16;
    if (!addr || (uintptr_t)addr % align)
        return CUDA_ERROR_INVALID_VALUE;
    put_addr(b, (uintptr_t)addr);
    memcpy(tm, b, sizeof b);
    return CUDA_SUCCESS;
}
FC_EXPORT(cuTensorMapReplaceAddress, PFN_cuTensorMapReplaceAddress_v12000, fc_replace_address);
