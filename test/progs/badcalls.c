/* SPDX-License-Identifier: MIT */
/* badcalls.c: the error-path rule, over every entry point the shim intercepts (shim/hooks.def).
 *
 * For each hooked symbol, the program fetches the entry point with cuGetProcAddress (the
 * symbol's base name, version and per-thread flag, as a runtime does) and calls it with
 * arguments the driver refuses: a NULL result pointer, a zero size, a freed or unknown pointer, a
 * range past a buffer's end, an unknown handle, a stream that cannot capture. It prints the
 * answer ("symbol: ERROR_NAME"). A symbol with no case in the table below prints "NO CASE" and
 * makes the program fail: a new hook needs a case. The calls are made in every iteration,
 * between launches that keep the buffers moving, and every byte is checked at the end: a call
 * that fails leaves memory and residency as they were (and is neither recorded nor replayed).
 *
 * Buffers: NB of 64 KiB (run with FAKECUDA_GRANULARITY=64K and OOC_CHUNK=64K).
 * Options: --iters N (default 4). Output: the answers of the first iteration, then "answers the
 * same in every iteration: yes" and "checksum: H". Exit status: 0 when every byte is right; 1
 * when one is wrong or a case is missing; 2 when a driver call that must succeed failed. Linked
 * with -lcuda. */
#include <cuda.h>
#include <cudaTypedefs.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "userprog.h"

#define WORDS 16384 /* 64 KiB */
#define NB    24

/* The older forms cudaTypedefs.h keeps to itself unless built as the driver. */
typedef CUresult (*pfn_begin_capture_v1)(CUstream s);
typedef CUresult (*pfn_instantiate_v1)(CUgraphExec *e, CUgraph g, CUgraphNode *err, char *log,
                                       size_t n);

static const fakecuda_kernel_t kernels[] = {UP_MIX_KERNEL("badcalls")};

static CUdeviceptr buf[NB], gone;
static CUstream stream;
static uint32_t host[4 * WORDS]; /* more than any case reads or writes */

#define PAST_END (buf[0] + WORDS * 4 - 8) /* 16 bytes from here run 8 past buf[0]'s end */
#define F(T)     ((T)fn)

static CUresult c_get_proc(void *fn, int ver) {
    void *p = NULL;
    if (ver >= 12000) {
        CUdriverProcAddressQueryResult st;
        return F(PFN_cuGetProcAddress_v12000)(NULL, &p, 12000, 0, &st);
    }
    return F(PFN_cuGetProcAddress_v11030)(NULL, &p, 11030, 0);
}
static CUresult c_mem_get_info(void *fn, int ver) {
    (void)ver;
    return F(PFN_cuMemGetInfo_v3020)(NULL, NULL);
}
static CUresult c_mem_alloc(void *fn, int ver) {
    (void)ver;
    CUdeviceptr p;
    return F(PFN_cuMemAlloc_v3020)(&p, 0);
}
static CUresult c_mem_create(void *fn, int ver) {
    (void)ver;
    CUmemGenericAllocationHandle h;
    return F(PFN_cuMemCreate_v10020)(&h, 65536, NULL, 0);
}
static CUresult c_mem_release(void *fn, int ver) {
    (void)ver;
    return F(PFN_cuMemRelease_v10020)(0);
}
static CUresult c_mem_alloc_pitch(void *fn, int ver) {
    (void)ver;
    size_t pitch;
    return F(PFN_cuMemAllocPitch_v3020)(NULL, &pitch, 64, 64, 4);
}
static CUresult c_mem_free(void *fn, int ver) {
    (void)ver;
    return F(PFN_cuMemFree_v3020)(gone);
}
static CUresult c_address_range(void *fn, int ver) {
    (void)ver;
    CUdeviceptr b;
    size_t n;
    return F(PFN_cuMemGetAddressRange_v3020)(&b, &n, gone);
}
static CUresult c_pointer_attr(void *fn, int ver) {
    (void)ver;
    return F(PFN_cuPointerGetAttribute_v4000)(NULL, CU_POINTER_ATTRIBUTE_BUFFER_ID, buf[1]);
}
static CUresult c_pointer_attrs(void *fn, int ver) {
    (void)ver;
    CUpointer_attribute a = CU_POINTER_ATTRIBUTE_BUFFER_ID;
    void *data = NULL;
    return F(PFN_cuPointerGetAttributes_v7000)(1, &a, &data, buf[1]);
}
static CUresult c_ipc_handle(void *fn, int ver) {
    (void)ver;
    return F(PFN_cuIpcGetMemHandle_v4010)(NULL, buf[1]);
}
static CUresult c_retain_handle(void *fn, int ver) {
    (void)ver;
    return F(PFN_cuMemRetainAllocationHandle_v11000)(NULL, (void *)(uintptr_t)buf[1]);
}
static CUresult c_multicast_bind(void *fn, int ver) {
    (void)ver;
    return F(PFN_cuMulticastBindAddr_v12010)(0, 0, buf[1], 0, 0);
}
static CUresult c_alloc_async(void *fn, int ver) {
    (void)ver;
    return F(PFN_cuMemAllocAsync_v11020)(NULL, 4096, stream);
}
static CUresult c_alloc_pool(void *fn, int ver) {
    (void)ver;
    CUdeviceptr p;
    return F(PFN_cuMemAllocFromPoolAsync_v11020)(&p, 0, NULL, stream);
}
static CUresult c_free_async(void *fn, int ver) {
    (void)ver;
    return F(PFN_cuMemFreeAsync_v11020)(gone, stream);
}
static CUresult c_memcpy(void *fn, int ver) {
    (void)ver;
    return F(PFN_cuMemcpy_v4000)(PAST_END, buf[1], 16);
}
static CUresult c_htod(void *fn, int ver) {
    (void)ver;
    return F(PFN_cuMemcpyHtoD_v3020)(PAST_END, host, 16);
}
static CUresult c_dtoh(void *fn, int ver) {
    (void)ver;
    return F(PFN_cuMemcpyDtoH_v3020)(host, PAST_END, 16);
}
static CUresult c_dtod(void *fn, int ver) {
    (void)ver;
    return F(PFN_cuMemcpyDtoD_v3020)(buf[1], gone, 16);
}
static CUresult c_memcpy_async(void *fn, int ver) {
    (void)ver;
    return F(PFN_cuMemcpyAsync_v4000)(buf[1], PAST_END, 16, stream);
}
static CUresult c_htod_async(void *fn, int ver) {
    (void)ver;
    return F(PFN_cuMemcpyHtoDAsync_v3020)(gone, host, 16, stream);
}
static CUresult c_dtoh_async(void *fn, int ver) {
    (void)ver;
    return F(PFN_cuMemcpyDtoHAsync_v3020)(host, PAST_END, 16, stream);
}
static CUresult c_dtod_async(void *fn, int ver) {
    (void)ver;
    return F(PFN_cuMemcpyDtoDAsync_v3020)(PAST_END, buf[1], 16, stream);
}
static CUresult c_batch(void *fn, int ver) {
    CUdeviceptr d[2] = {buf[1], buf[2]}, s[2] = {buf[3], PAST_END};
    size_t n[2] = {16, 16}, ai = 0, fail;
    CUmemcpyAttributes at;
    memset(&at, 0, sizeof at);
    at.srcAccessOrder = CU_MEMCPY_SRC_ACCESS_ORDER_STREAM;
    if (ver >= 13000)
        return F(PFN_cuMemcpyBatchAsync_v13000)(d, s, n, 2, &at, &ai, 1, stream);
    return F(PFN_cuMemcpyBatchAsync_v12080)(d, s, n, 2, &at, &ai, 1, &fail, stream);
}
static CUresult c_batch3d(void *fn, int ver) {
    /* Two ops of 16 x 2 x 1 bytes, rows 32 apart; the second reads past a buffer's end. */
    CUDA_MEMCPY3D_BATCH_OP ops[2];
    memset(ops, 0, sizeof ops);
    for (int i = 0; i < 2; i++) {
        ops[i].src.type = ops[i].dst.type = CU_MEMCPY_OPERAND_TYPE_POINTER;
        ops[i].src.op.ptr.rowLength = ops[i].dst.op.ptr.rowLength = 32;
        ops[i].extent = (CUextent3D){16, 2, 1};
        ops[i].srcAccessOrder = CU_MEMCPY_SRC_ACCESS_ORDER_STREAM;
    }
    ops[0].src.op.ptr.ptr = buf[3];
    ops[0].dst.op.ptr.ptr = buf[1];
    ops[1].src.op.ptr.ptr = PAST_END - 32;
    ops[1].dst.op.ptr.ptr = buf[2];
    size_t fail;
    if (ver >= 13000)
        return F(PFN_cuMemcpy3DBatchAsync_v13000)(2, ops, 0, stream);
    return F(PFN_cuMemcpy3DBatchAsync_v12080)(2, ops, &fail, 0, stream);
}
static CUresult c_set8(void *fn, int ver) {
    (void)ver;
    return F(PFN_cuMemsetD8_v3020)(PAST_END, 0xEE, 16);
}
static CUresult c_set16(void *fn, int ver) {
    (void)ver;
    return F(PFN_cuMemsetD16_v3020)(PAST_END, 0xEEEE, 8);
}
static CUresult c_set32(void *fn, int ver) {
    (void)ver;
    return F(PFN_cuMemsetD32_v3020)(gone, 0xEEEEEEEEu, 4);
}
static CUresult c_set8_async(void *fn, int ver) {
    (void)ver;
    return F(PFN_cuMemsetD8Async_v3020)(PAST_END, 0xEE, 16, stream);
}
static CUresult c_set16_async(void *fn, int ver) {
    (void)ver;
    return F(PFN_cuMemsetD16Async_v3020)(gone, 0xEEEE, 8, stream);
}
static CUresult c_set32_async(void *fn, int ver) {
    (void)ver;
    return F(PFN_cuMemsetD32Async_v3020)(PAST_END, 0xEEEEEEEEu, 4, stream);
}
static CUresult c_set2d8(void *fn, int ver) {
    (void)ver;
    return F(PFN_cuMemsetD2D8_v3020)(buf[0], 4096, 0xEE, 64, 17);
}
static CUresult c_set2d32(void *fn, int ver) {
    (void)ver;
    return F(PFN_cuMemsetD2D32_v3020)(buf[0] + 4096, 4096, 0xEEEEEEEEu, 16, 16);
}
static CUresult c_set2d8_async(void *fn, int ver) {
    (void)ver;
    return F(PFN_cuMemsetD2D8Async_v3020)(gone, 256, 0xEE, 64, 2, stream);
}
static CUresult c_set2d32_async(void *fn, int ver) {
    (void)ver;
    return F(PFN_cuMemsetD2D32Async_v3020)(buf[0] + 8, 4096, 0xEEEEEEEEu, 1024, 16, stream);
}
/* A 2D copy from the host into buf[0] whose last row runs past its end. */
static CUDA_MEMCPY2D copy_2d_past_end(void) {
    CUDA_MEMCPY2D p;
    memset(&p, 0, sizeof p);
    p.srcMemoryType = CU_MEMORYTYPE_HOST;
    p.srcHost = host;
    p.srcPitch = 256;
    p.dstMemoryType = CU_MEMORYTYPE_DEVICE;
    p.dstDevice = buf[0];
    p.dstPitch = 4096;
    p.WidthInBytes = 256;
    p.Height = 17; /* row 16 starts at 64 KiB: past the end */
    return p;
}
static CUresult c_copy2d(void *fn, int ver) {
    (void)ver;
    CUDA_MEMCPY2D p = copy_2d_past_end();
    return F(PFN_cuMemcpy2D_v3020)(&p);
}
static CUresult c_copy2d_unaligned(void *fn, int ver) {
    (void)ver;
    CUDA_MEMCPY2D p = copy_2d_past_end();
    return F(PFN_cuMemcpy2DUnaligned_v3020)(&p);
}
static CUresult c_copy2d_async(void *fn, int ver) {
    (void)ver;
    CUDA_MEMCPY2D p = copy_2d_past_end();
    p.dstDevice = gone;
    p.Height = 2;
    return F(PFN_cuMemcpy2DAsync_v3020)(&p, stream);
}
static CUresult c_copy3d(void *fn, int ver) {
    (void)ver;
    return F(PFN_cuMemcpy3D_v3020)(NULL);
}
static CUresult c_copy3d_async(void *fn, int ver) {
    (void)ver;
    CUDA_MEMCPY3D p;
    memset(&p, 0, sizeof p);
    p.srcMemoryType = CU_MEMORYTYPE_DEVICE;
    p.srcDevice = gone;
    p.srcPitch = 1024;
    p.srcHeight = 16;
    p.dstMemoryType = CU_MEMORYTYPE_HOST;
    p.dstHost = host;
    p.dstPitch = 1024;
    p.dstHeight = 16;
    p.WidthInBytes = 1024;
    p.Height = 16;
    p.Depth = 2; /* from freed memory */
    return F(PFN_cuMemcpy3DAsync_v3020)(&p, stream);
}
static CUresult c_peer(void *fn, int ver) {
    (void)ver;
    CUcontext c;
    UP_CHECK(cuCtxGetCurrent(&c));
    return F(PFN_cuMemcpyPeer_v4000)(buf[1], c, PAST_END, c, 16);
}
static CUresult c_peer_async(void *fn, int ver) {
    (void)ver;
    CUcontext c;
    UP_CHECK(cuCtxGetCurrent(&c));
    return F(PFN_cuMemcpyPeerAsync_v4000)(gone, c, buf[1], c, 16, stream);
}
static CUresult c_set2d16(void *fn, int ver) {
    (void)ver;
    return F(PFN_cuMemsetD2D16_v3020)(buf[0], 4096, 0xEEEE, 32, 17);
}
static CUresult c_set2d16_async(void *fn, int ver) {
    (void)ver;
    return F(PFN_cuMemsetD2D16Async_v3020)(gone, 256, 0xEEEE, 32, 2, stream);
}
static CUresult c_tmap_tiled(void *fn, int ver) {
    (void)ver;
    cuuint64_t dim[1] = {WORDS}, stride[1] = {4};
    cuuint32_t box[1] = {16}, es[1] = {1};
    return F(PFN_cuTensorMapEncodeTiled_v12000)(
        NULL, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 1, (void *)(uintptr_t)buf[1], dim, stride, box, es,
        CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_NONE,
        CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
}
static CUresult c_tmap_im2col(void *fn, int ver) {
    (void)ver;
    return F(PFN_cuTensorMapEncodeIm2col_v12000)(
        NULL, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 3, (void *)(uintptr_t)buf[1], NULL, NULL, NULL, NULL,
        1, 1, NULL, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE,
        CU_TENSOR_MAP_L2_PROMOTION_NONE, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
}
static CUresult c_tmap_im2col_wide(void *fn, int ver) {
    (void)ver;
    return F(PFN_cuTensorMapEncodeIm2colWide_v12080)(
        NULL, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 3, (void *)(uintptr_t)buf[1], NULL, NULL, 0, 0, 1, 1,
        NULL, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_IM2COL_WIDE_MODE_W,
        CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_NONE,
        CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
}
static CUresult c_tmap_replace(void *fn, int ver) {
    (void)ver;
    return F(PFN_cuTensorMapReplaceAddress_v12000)(NULL, (void *)(uintptr_t)buf[1]);
}
static CUresult c_add_kernel_node(void *fn, int ver) {
    CUgraphNode node;
    CUDA_KERNEL_NODE_PARAMS_v2 p;
    memset(&p, 0, sizeof p);
    p.gridDimX = p.gridDimY = p.gridDimZ = p.blockDimY = p.blockDimZ = 1;
    p.blockDimX = 32;
    if (ver >= 12000)
        return F(PFN_cuGraphAddKernelNode_v12000)(&node, NULL, NULL, 0, &p); /* no graph */
    return F(PFN_cuGraphAddKernelNode_v10000)(&node, NULL, NULL, 0,
                                              (const CUDA_KERNEL_NODE_PARAMS_v1 *)&p);
}
static CUresult c_exec_kernel_params(void *fn, int ver) {
    CUDA_KERNEL_NODE_PARAMS_v2 p;
    memset(&p, 0, sizeof p);
    if (ver >= 12000)
        return F(PFN_cuGraphExecKernelNodeSetParams_v12000)(NULL, NULL, &p);
    return F(PFN_cuGraphExecKernelNodeSetParams_v10010)(NULL, NULL,
                                                        (const CUDA_KERNEL_NODE_PARAMS_v1 *)&p);
}
static CUresult c_add_memcpy_node(void *fn, int ver) {
    (void)ver;
    CUgraphNode node;
    CUcontext c;
    UP_CHECK(cuCtxGetCurrent(&c));
    return F(PFN_cuGraphAddMemcpyNode_v10000)(&node, NULL, NULL, 0, NULL, c);
}
static CUresult c_add_memset_node(void *fn, int ver) {
    (void)ver;
    CUgraphNode node;
    CUcontext c;
    UP_CHECK(cuCtxGetCurrent(&c));
    CUDA_MEMSET_NODE_PARAMS p = {
        .dst = PAST_END, .pitch = 0, .value = 0, .elementSize = 4, .width = 4, .height = 1};
    return F(PFN_cuGraphAddMemsetNode_v10000)(&node, NULL, NULL, 0, &p, c);
}
static CUresult c_add_child_node(void *fn, int ver) {
    (void)ver;
    CUgraphNode node;
    return F(PFN_cuGraphAddChildGraphNode_v10000)(&node, NULL, NULL, 0, NULL);
}
static CUresult c_add_node(void *fn, int ver) {
    CUgraphNode node;
    CUgraphNodeParams p;
    memset(&p, 0, sizeof p);
    p.type = CU_GRAPH_NODE_TYPE_MEMSET;
    p.memset.dst = PAST_END;
    p.memset.elementSize = 4;
    p.memset.width = 4;
    p.memset.height = 1;
    if (ver >= 12030)
        return F(PFN_cuGraphAddNode_v12030)(&node, NULL, NULL, NULL, 0, &p); /* no graph */
    return F(PFN_cuGraphAddNode_v12020)(&node, NULL, NULL, 0, &p);
}
static CUresult c_exec_update(void *fn, int ver) {
    if (ver >= 12000) {
        CUgraphExecUpdateResultInfo info;
        return F(PFN_cuGraphExecUpdate_v12000)(NULL, NULL, &info);
    }
    CUgraphNode err;
    CUgraphExecUpdateResult res;
    return F(PFN_cuGraphExecUpdate_v10020)(NULL, NULL, &err, &res);
}
static CUresult c_kernel_node_params(void *fn, int ver) {
    CUDA_KERNEL_NODE_PARAMS_v2 p;
    memset(&p, 0, sizeof p);
    if (ver >= 12000)
        return F(PFN_cuGraphKernelNodeSetParams_v12000)(NULL, &p); /* no node */
    return F(PFN_cuGraphKernelNodeSetParams_v10000)(NULL, (const CUDA_KERNEL_NODE_PARAMS_v1 *)&p);
}
static CUresult c_memcpy_node_params(void *fn, int ver) {
    (void)ver;
    return F(PFN_cuGraphMemcpyNodeSetParams_v10000)(NULL, NULL);
}
static CUresult c_memset_node_params(void *fn, int ver) {
    (void)ver;
    CUDA_MEMSET_NODE_PARAMS p = {
        .dst = PAST_END, .pitch = 0, .value = 0, .elementSize = 4, .width = 4, .height = 1};
    return F(PFN_cuGraphMemsetNodeSetParams_v10000)(NULL, &p);
}
static CUresult c_node_params(void *fn, int ver) {
    (void)ver;
    CUgraphNodeParams p;
    memset(&p, 0, sizeof p);
    p.type = CU_GRAPH_NODE_TYPE_MEMSET;
    p.memset.dst = PAST_END;
    p.memset.elementSize = 4;
    p.memset.width = 4;
    p.memset.height = 1;
    return F(PFN_cuGraphNodeSetParams_v12020)(NULL, &p);
}
static CUresult c_exec_memcpy_params(void *fn, int ver) {
    (void)ver;
    CUcontext c;
    UP_CHECK(cuCtxGetCurrent(&c));
    return F(PFN_cuGraphExecMemcpyNodeSetParams_v10020)(NULL, NULL, NULL, c);
}
static CUresult c_exec_memset_params(void *fn, int ver) {
    (void)ver;
    CUcontext c;
    UP_CHECK(cuCtxGetCurrent(&c));
    CUDA_MEMSET_NODE_PARAMS p = {
        .dst = PAST_END, .pitch = 0, .value = 0, .elementSize = 4, .width = 4, .height = 1};
    return F(PFN_cuGraphExecMemsetNodeSetParams_v10020)(NULL, NULL, &p, c);
}
static CUresult c_exec_node_params(void *fn, int ver) {
    (void)ver;
    CUgraphNodeParams p;
    memset(&p, 0, sizeof p);
    p.type = CU_GRAPH_NODE_TYPE_KERNEL; /* no function, no executable graph */
    return F(PFN_cuGraphExecNodeSetParams_v12020)(NULL, NULL, &p);
}
static CUresult c_write32(void *fn, int ver) {
    (void)ver;
    return F(PFN_cuStreamWriteValue32_v11070)(stream, buf[0] + WORDS * 4 - 2, 7, 0);
}
static CUresult c_write64(void *fn, int ver) {
    (void)ver;
    return F(PFN_cuStreamWriteValue64_v11070)(stream, gone, 7, 0);
}
static CUresult c_wait32(void *fn, int ver) {
    (void)ver;
    return F(PFN_cuStreamWaitValue32_v11070)(stream, gone, 0, CU_STREAM_WAIT_VALUE_GEQ);
}
static CUresult c_wait64(void *fn, int ver) {
    (void)ver;
    return F(PFN_cuStreamWaitValue64_v11070)(stream, buf[0] + WORDS * 4 - 4, 0,
                                             CU_STREAM_WAIT_VALUE_GEQ);
}
static CUresult c_batch_memop(void *fn, int ver) {
    (void)ver;
    CUstreamBatchMemOpParams op[2];
    memset(op, 0, sizeof op);
    op[0].writeValue.operation = CU_STREAM_MEM_OP_WRITE_VALUE_32;
    op[0].writeValue.address = buf[1];
    op[1].writeValue.operation = CU_STREAM_MEM_OP_WRITE_VALUE_64;
    op[1].writeValue.address = buf[0] + WORDS * 4 - 4; /* half past the end */
    return F(PFN_cuStreamBatchMemOp_v11070)(stream, 2, op, 0);
}
static CUresult c_launch(void *fn, int ver) {
    (void)ver;
    return F(PFN_cuLaunchKernel_v4000)(NULL, 1, 1, 1, 32, 1, 1, 0, stream, NULL, NULL);
}
static CUresult c_launch_ex(void *fn, int ver) {
    (void)ver;
    return F(PFN_cuLaunchKernelEx_v11060)(NULL, NULL, NULL, NULL);
}
static CUresult c_launch_coop(void *fn, int ver) {
    (void)ver;
    return F(PFN_cuLaunchCooperativeKernel_v9000)(NULL, 1, 1, 1, 32, 1, 1, 0, stream, NULL);
}
static CUresult c_begin_capture(void *fn, int ver) {
    /* The legacy default stream cannot capture. */
    if (ver >= 10010)
        return F(PFN_cuStreamBeginCapture_v10010)(CU_STREAM_LEGACY, CU_STREAM_CAPTURE_MODE_GLOBAL);
    return F(pfn_begin_capture_v1)(CU_STREAM_LEGACY);
}
static CUresult c_begin_capture_to(void *fn, int ver) {
    (void)ver;
    CUgraph g = NULL;
    CUresult r = cuGraphCreate(&g, 0);
    if (r != CUDA_SUCCESS)
        return CUDA_SUCCESS; /* reported as a wrong call that succeeded */
    r = F(PFN_cuStreamBeginCaptureToGraph_v12030)(CU_STREAM_LEGACY, g, NULL, NULL, 0,
                                                  CU_STREAM_CAPTURE_MODE_GLOBAL);
    cuGraphDestroy(g);
    return r;
}
static CUresult c_end_capture(void *fn, int ver) {
    (void)ver;
    CUgraph g;
    return F(PFN_cuStreamEndCapture_v10000)(stream, &g); /* not capturing */
}
static CUresult c_instantiate(void *fn, int ver) {
    (void)ver; /* 10000 and 11000 (cuGraphInstantiate_v2) take the same arguments */
    CUgraphExec e;
    return F(pfn_instantiate_v1)(&e, NULL, NULL, NULL, 0);
}
static CUresult c_instantiate_flags(void *fn, int ver) {
    (void)ver;
    CUgraphExec e;
    return F(PFN_cuGraphInstantiateWithFlags_v11040)(&e, NULL, 0);
}
static CUresult c_instantiate_params(void *fn, int ver) {
    (void)ver;
    CUgraphExec e;
    return F(PFN_cuGraphInstantiateWithParams_v12000)(&e, NULL, NULL);
}
static CUresult c_graph_launch(void *fn, int ver) {
    (void)ver;
    return F(PFN_cuGraphLaunch_v10000)(NULL, stream);
}
static CUresult c_graph_destroy(void *fn, int ver) {
    (void)ver;
    return F(PFN_cuGraphDestroy_v10000)(NULL);
}
static CUresult c_exec_destroy(void *fn, int ver) {
    (void)ver;
    return F(PFN_cuGraphExecDestroy_v10000)(NULL);
}
static CUresult c_module_unload(void *fn, int ver) {
    (void)ver;
    return F(PFN_cuModuleUnload_v2000)(NULL);
}
static CUresult c_library_unload(void *fn, int ver) {
    (void)ver;
    return F(PFN_cuLibraryUnload_v12000)(NULL);
}

typedef struct bad_case {
    const char *base;
    CUresult (*call)(void *fn, int ver);
} bad_case_t;

static const bad_case_t cases[] = {
    {"cuGetProcAddress", c_get_proc},
    {"cuMemGetInfo", c_mem_get_info},
    {"cuMemAlloc", c_mem_alloc},
    {"cuMemCreate", c_mem_create},
    {"cuMemRelease", c_mem_release},
    {"cuMemAllocPitch", c_mem_alloc_pitch},
    {"cuMemFree", c_mem_free},
    {"cuMemGetAddressRange", c_address_range},
    {"cuPointerGetAttribute", c_pointer_attr},
    {"cuPointerGetAttributes", c_pointer_attrs},
    {"cuIpcGetMemHandle", c_ipc_handle},
    {"cuMemRetainAllocationHandle", c_retain_handle},
    {"cuMulticastBindAddr", c_multicast_bind},
    {"cuMemAllocAsync", c_alloc_async},
    {"cuMemAllocFromPoolAsync", c_alloc_pool},
    {"cuMemFreeAsync", c_free_async},
    {"cuMemcpy", c_memcpy},
    {"cuMemcpyHtoD", c_htod},
    {"cuMemcpyDtoH", c_dtoh},
    {"cuMemcpyDtoD", c_dtod},
    {"cuMemcpyAsync", c_memcpy_async},
    {"cuMemcpyHtoDAsync", c_htod_async},
    {"cuMemcpyDtoHAsync", c_dtoh_async},
    {"cuMemcpyDtoDAsync", c_dtod_async},
    {"cuMemcpyBatchAsync", c_batch},
    {"cuMemcpy3DBatchAsync", c_batch3d},
    {"cuMemsetD8", c_set8},
    {"cuMemsetD16", c_set16},
    {"cuMemsetD32", c_set32},
    {"cuMemsetD8Async", c_set8_async},
    {"cuMemsetD16Async", c_set16_async},
    {"cuMemsetD32Async", c_set32_async},
    {"cuMemsetD2D8", c_set2d8},
    {"cuMemsetD2D32", c_set2d32},
    {"cuMemsetD2D8Async", c_set2d8_async},
    {"cuMemsetD2D32Async", c_set2d32_async},
    {"cuMemcpy2D", c_copy2d},
    {"cuMemcpy2DUnaligned", c_copy2d_unaligned},
    {"cuMemcpy2DAsync", c_copy2d_async},
    {"cuMemcpy3D", c_copy3d},
    {"cuMemcpy3DAsync", c_copy3d_async},
    {"cuMemcpyPeer", c_peer},
    {"cuMemcpyPeerAsync", c_peer_async},
    {"cuMemsetD2D16", c_set2d16},
    {"cuMemsetD2D16Async", c_set2d16_async},
    {"cuTensorMapEncodeTiled", c_tmap_tiled},
    {"cuTensorMapEncodeIm2col", c_tmap_im2col},
    {"cuTensorMapEncodeIm2colWide", c_tmap_im2col_wide},
    {"cuTensorMapReplaceAddress", c_tmap_replace},
    {"cuGraphAddKernelNode", c_add_kernel_node},
    {"cuGraphExecKernelNodeSetParams", c_exec_kernel_params},
    {"cuGraphAddMemcpyNode", c_add_memcpy_node},
    {"cuGraphAddMemsetNode", c_add_memset_node},
    {"cuGraphAddChildGraphNode", c_add_child_node},
    {"cuGraphAddNode", c_add_node},
    {"cuGraphExecUpdate", c_exec_update},
    {"cuGraphKernelNodeSetParams", c_kernel_node_params},
    {"cuGraphMemcpyNodeSetParams", c_memcpy_node_params},
    {"cuGraphMemsetNodeSetParams", c_memset_node_params},
    {"cuGraphNodeSetParams", c_node_params},
    {"cuGraphExecMemcpyNodeSetParams", c_exec_memcpy_params},
    {"cuGraphExecMemsetNodeSetParams", c_exec_memset_params},
    {"cuGraphExecNodeSetParams", c_exec_node_params},
    {"cuStreamWriteValue32", c_write32},
    {"cuStreamWriteValue64", c_write64},
    {"cuStreamWaitValue32", c_wait32},
    {"cuStreamWaitValue64", c_wait64},
    {"cuStreamBatchMemOp", c_batch_memop},
    {"cuLaunchKernel", c_launch},
    {"cuLaunchKernelEx", c_launch_ex},
    {"cuLaunchCooperativeKernel", c_launch_coop},
    {"cuStreamBeginCapture", c_begin_capture},
    {"cuStreamBeginCaptureToGraph", c_begin_capture_to},
    {"cuStreamEndCapture", c_end_capture},
    {"cuGraphInstantiate", c_instantiate},
    {"cuGraphInstantiateWithFlags", c_instantiate_flags},
    {"cuGraphInstantiateWithParams", c_instantiate_params},
    {"cuGraphLaunch", c_graph_launch},
    {"cuGraphDestroy", c_graph_destroy},
    {"cuGraphExecDestroy", c_exec_destroy},
    {"cuModuleUnload", c_module_unload},
    {"cuLibraryUnload", c_library_unload},
};

typedef struct hooked {
    const char *base, *symbol;
    int version, per_thread;
} hooked_t;

static const hooked_t hooked[] = {
#define HOOK(base, version, per_thread, symbol, pfn) {#base, #symbol, version, per_thread},
#include "../../shim/hooks.def"
#undef HOOK
};
#define NHOOKED (sizeof hooked / sizeof hooked[0])

/* Makes every hooked symbol's bad call; writes the answers into out. 0, or 1 when a symbol has
 * no case (printed). */
static int bad_calls(CUresult *out) {
    int missing = 0;
    for (size_t i = 0; i < NHOOKED; i++) {
        const hooked_t *h = &hooked[i];
        const bad_case_t *c = NULL;
        for (size_t k = 0; k < sizeof cases / sizeof cases[0] && !c; k++)
            if (strcmp(cases[k].base, h->base) == 0)
                c = &cases[k];
        void *fn = NULL;
        CUdriverProcAddressQueryResult st;
        cuuint64_t flags = h->per_thread ? CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM
                                         : CU_GET_PROC_ADDRESS_LEGACY_STREAM;
        UP_CHECK(cuGetProcAddress(h->base, &fn, h->version, flags, &st));
        if (!c || !fn) {
            printf("%s: NO CASE%s\n", h->symbol, fn ? "" : " (not found)");
            missing = 1;
            out[i] = CUDA_SUCCESS;
            continue;
        }
        out[i] = c->call(fn, h->version);
    }
    return missing;
}

int main(int argc, char **argv) {
    int iters = 4;
    if (up_parse_iters(argc, argv, "badcalls", 1, &iters) != 0)
        return 64;
    if (fakecuda_register_kernels(kernels, sizeof kernels / sizeof kernels[0]) != 0)
        return 2;
    CUmodule mod;
    CUfunction f_mix;
    (void)up_init_context();
    UP_CHECK(cuModuleLoadData(&mod, FAKECUDA_IMAGE_PREFIX "badcalls"));
    UP_CHECK(cuModuleGetFunction(&f_mix, mod, "mix"));
    UP_CHECK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
    static uint32_t model[NB][WORDS], check[WORDS];
    for (int b = 0; b < NB; b++) {
        for (int i = 0; i < WORDS; i++)
            model[b][i] = (uint32_t)(b * 7919 + i * 2654435761u);
        UP_CHECK(cuMemAlloc(&buf[b], WORDS * 4));
        UP_CHECK(cuMemcpyHtoD(buf[b], model[b], WORDS * 4));
    }
    UP_CHECK(cuMemAlloc(&gone, WORDS * 4));
    UP_CHECK(cuMemFree(gone));
    CUresult first[NHOOKED], now[NHOOKED];
    int missing = 0, same = 1;
    for (int it = 0; it < iters; it++) {
        missing |= bad_calls(it == 0 ? first : now);
        if (it > 0)
            same &= memcmp(first, now, sizeof now) == 0;
        for (int b = 0; b < NB; b++) {
            uint32_t k = (uint32_t)(it * NB + b);
            int src = (b + 5) % NB;
            UP_CHECK(up_mix(f_mix, buf[b], buf[src], k, WORDS, stream));
            UP_CHECK(cuStreamSynchronize(stream)); /* b's source is read before it changes */
            up_model_mix(model[b], model[src], k, WORDS);
        }
    }
    for (size_t i = 0; i < NHOOKED; i++) {
        const char *name = "?";
        cuGetErrorName(first[i], &name);
        printf("%s: %s\n", hooked[i].symbol, name);
    }
    printf("answers the same in every iteration: %s\n", same ? "yes" : "no");
    int ok = 1;
    uint64_t h = UP_FNV_SEED;
    for (int b = 0; b < NB; b++) {
        UP_CHECK(cuMemcpyDtoH(check, buf[b], WORDS * 4));
        ok &= memcmp(check, model[b], WORDS * 4) == 0;
        h = up_fnv(h, model[b], WORDS * 4);
        UP_CHECK(cuMemFree(buf[b]));
    }
    printf("every byte right: %s\n", ok ? "yes" : "no");
    printf("checksum: %016llx\n", (unsigned long long)h);
    UP_CHECK(cuStreamDestroy(stream));
    UP_CHECK(cuModuleUnload(mod));
    return ok && !missing ? 0 : 1;
}
