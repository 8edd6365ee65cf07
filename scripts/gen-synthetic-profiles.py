#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""gen-synthetic-profiles.py: writes the synthetic reference profiles under profiles/synthetic/.

One training iteration (forward, backward, SGD-with-momentum update) of ResNet-50, DenseNet-121,
a U-Net and a GPT-2-class transformer layer stack, as the shim's recorder would write it
(profiles/FORMAT.md), with exact tensor sizes from the layer shapes (fp32) and per-op durations
from a stated cost model of an H100-class GPU:

    duration = max(LAUNCH_FLOOR, flops / FLOP_RATE, bytes_touched / HBM_BW)

    FLOP_RATE    = 247e12 FLOP/s  (TF32 tensor cores: 495 TFLOP/s dense peak at 50 % efficiency)
    HBM_BW       = 2.68e12 B/s    (HBM3 3.35 TB/s at 80 % efficiency)
    LAUNCH_FLOOR = 4 us per op
    link         = PCIe Gen5 x16: 50 GB/s each way, 90 GB/s both ways together

The input batch's host-to-device copy takes max(LAUNCH_FLOOR, bytes / 50 GB/s).
Convolutions and GEMMs count 2*MACs FLOPs forward and the same again for each of their backward
ops (data and filter); every other op is memory bound. Buffers are allocated right before their
first use and freed right after their last use, parameters and momentum are persistent, and the
outputs of kernels and library calls that write nothing else are listed as verified re-executable
producers (the input's host-to-device copy is not: the shim never re-launches a copy).

For each model the generator finds the largest batch (or sequence length) whose in-core peak fits
the 8 GiB budget, and writes profiles from half of it to 8x it. Standard library only.

Usage: scripts/gen-synthetic-profiles.py [OUTDIR]   (default profiles/synthetic)
"""
import math
import os
import sys

FLOP_RATE = 247e12
HBM_BW = 2.68e12
LINK_BW = 50e9  # each way; meta.tsv's h2d_bps and d2h_bps
LAUNCH_FLOOR_NS = 4000
DTYPE = 4
BUDGET = 8 << 30
CHUNK = 2 << 20
DEVICE = "synthetic H100-class (80 GiB HBM3, PCIe Gen5 x16)"
DEVICE_MEM = 80 << 30


def dur_ns(flops, nbytes):
    return int(max(LAUNCH_FLOOR_NS, flops / FLOP_RATE * 1e9, nbytes / HBM_BW * 1e9))


def fp(nbytes):
    if nbytes * 2 >= CHUNK:
        return (nbytes + CHUNK - 1) // CHUNK * CHUNK
    return (nbytes + 255) // 256 * 256


class Net:
    """A forward graph; build() derives backward and update ops and buffer lifetimes."""

    def __init__(self, name):
        self.name = name
        self.bufs = []  # [bytes, persistent, site]
        self.fwd = []  # dicts
        self.params = []  # (weight id, momentum id)

    def buf(self, nbytes, persistent=False, site="-"):
        self.bufs.append([int(nbytes), persistent, site])
        return len(self.bufs) - 1

    def act(self, numel, site):
        return self.buf(numel * DTYPE, False, site)

    def param(self, numel, site):
        w = self.buf(numel * DTYPE, True, site + ".weight")
        mo = self.buf(numel * DTYPE, True, site + ".momentum")
        self.params.append((w, mo))
        return w

    def op(self, name, kind, ins, out, params=(), flops=0, saved=None, extra_writes=(),
           bwd=True, heavy=False):
        """ins: activation inputs; saved: buffers the backward reads (default: ins)."""
        self.fwd.append(dict(name=name, kind=kind, ins=list(ins), out=out, params=list(params),
                             flops=flops, saved=list(ins) if saved is None else list(saved),
                             extra=list(extra_writes), bwd=bwd, heavy=heavy))
        return out

    # ---- layers ----
    def conv(self, x, shape, cout, k, stride=1, pad=None, site="conv"):
        n, c, h, w = shape
        pad = k // 2 if pad is None else pad
        ho, wo = (h + 2 * pad - k) // stride + 1, (w + 2 * pad - k) // stride + 1
        wt = self.param(cout * c * k * k, site)
        y = self.act(n * cout * ho * wo, site + ".out")
        flops = 2 * n * cout * ho * wo * c * k * k
        self.op("conv2d_fwd", "cudnn", [x], y, [wt], flops, heavy=True)
        return y, (n, cout, ho, wo)

    def bn(self, x, shape, site="bn"):
        n, c, h, w = shape
        g = self.param(2 * c, site)
        stats = self.buf(2 * c * DTYPE, True, site + ".running_stats")
        save = self.buf(2 * c * DTYPE, False, site + ".save_mean_invstd")
        y = self.act(n * c * h * w, site + ".out")
        self.op("batchnorm_fwd", "kernel", [x], y, [g], 8 * n * c * h * w,
                saved=[x, save], extra_writes=[stats, save])
        return y

    def relu(self, x, shape, site="relu"):
        y = self.act(math.prod(shape), site + ".out")
        self.op("relu_fwd", "kernel", [x], y, saved=[y])
        return y

    def add(self, a, b, shape, site="add"):
        y = self.act(math.prod(shape), site + ".out")
        self.op("add_fwd", "kernel", [a, b], y, saved=[])
        return y

    def pool(self, x, shape, k, stride, kind="maxpool", site="pool"):
        n, c, h, w = shape
        pad = 1 if kind == "maxpool" and k == 3 else 0
        ho, wo = (h + 2 * pad - k) // stride + 1, (w + 2 * pad - k) // stride + 1
        y = self.act(n * c * ho * wo, site + ".out")
        self.op(kind + "_fwd", "kernel", [x], y, saved=[x, y] if kind == "maxpool" else [])
        return y, (n, c, ho, wo)

    def cat(self, xs, shapes, site="cat"):
        n, _, h, w = shapes[0]
        c = sum(s[1] for s in shapes)
        y = self.act(n * c * h * w, site + ".out")
        self.op("concat_fwd", "kernel", xs, y, saved=[])
        return y, (n, c, h, w)

    def linear(self, x, rows, din, dout, site="linear", weight=None):
        wt = weight if weight is not None else self.param(din * dout, site)
        y = self.act(rows * dout, site + ".out")
        self.op("gemm_fwd", "cublas", [x], y, [wt], 2 * rows * din * dout, heavy=True)
        return y

    # ---- derivation ----
    def build(self):
        ops = []  # (name, kind, dur, [(buf, acc)])
        grad = {}  # activation buffer -> its gradient buffer
        pgrad = {}  # param -> grad buffer
        producer = {}
        no_grad = set(o["out"] for o in self.fwd if not o["bwd"])

        def param_grads(o):
            pg = []
            for p in o["params"]:
                if p in pgrad:  # a shared (tied) weight: accumulate
                    pg.append((pgrad[p], "rw"))
                    continue
                pgrad[p] = self.buf(self.bufs[p][0], False, self.bufs[p][2] + ".grad")
                pg.append((pgrad[p], "w"))
            return pg

        def cost(o, factor=1.0):
            if o["kind"] == "memcpy":  # the input's host-to-device copy: at the link's speed
                return int(max(LAUNCH_FLOOR_NS, self.bufs[o["out"]][0] / LINK_BW * 1e9))
            touched = sum(self.bufs[b][0] for b in o["ins"] + [o["out"]] + o["params"])
            return dur_ns(o["flops"] * factor, touched)

        for o in self.fwd:
            refs = [(b, "r") for b in o["ins"] + o["params"]]
            refs += [(o["out"], "w")] + [(b, "rw" if self.bufs[b][1] else "w") for b in o["extra"]]
            # a copy is never a producer: the shim re-launches kernels and library calls only
            if not o["extra"] and o["kind"] not in ("memcpy", "memset", "host"):
                producer[o["out"]] = len(ops)
            ops.append((o["name"], o["kind"], cost(o), refs))
        # loss seed: the last forward output's gradient
        last = self.fwd[-1]["out"]
        grad[last] = self.buf(self.bufs[last][0], False, "loss.grad")
        ops.append(("loss_bwd", "kernel", dur_ns(0, 2 * self.bufs[last][0]),
                    [(last, "r"), (grad[last], "w")]))
        for o in reversed(self.fwd):
            if not o["bwd"] or o["out"] not in grad:
                continue
            g = grad[o["out"]]
            gin = []
            for x in o["ins"]:
                if x in no_grad:
                    continue
                if x in grad:
                    gin.append((grad[x], "rw"))
                else:
                    grad[x] = self.buf(self.bufs[x][0], False, "grad")
                    gin.append((grad[x], "w"))
            saved = [(b, "r") for b in o["saved"] if b not in (g,)]
            if o["heavy"]:
                # data and filter gradients, as cuDNN/cuBLAS compute them
                ops.append((o["name"].replace("fwd", "bwd_data"), o["kind"], cost(o),
                            [(g, "r")] + [(p, "r") for p in o["params"]] + gin))
                pg = param_grads(o)
                if pg:
                    ops.append((o["name"].replace("fwd", "bwd_filter"), o["kind"], cost(o),
                                [(g, "r")] + saved + pg))
            else:
                pg = param_grads(o)
                refs = [(g, "r")] + saved + [(p, "r") for p in o["params"]] + gin + pg
                refs = list(dict((b, a) for b, a in refs).items())
                ops.append((o["name"].replace("fwd", "bwd"), o["kind"], cost(o, 2.0), refs))
        for w, mo in self.params:
            if w not in pgrad:
                continue
            nb = self.bufs[w][0]
            ops.append(("sgd_momentum_update", "kernel", dur_ns(0, 4 * nb),
                        [(w, "rw"), (pgrad[w], "r"), (mo, "rw")]))
        return ops, producer

    def write(self, outdir, program):
        ops, producer = self.build()
        first, lastu = {}, {}
        for i, (_, _, _, refs) in enumerate(ops):
            for b, _ in refs:
                first.setdefault(b, i)
                lastu[b] = i
        # in-core peak (same footprint rule as the planner)
        delta = [0] * (len(ops) + 1)
        base = 0
        for b, (nbytes, pers, _) in enumerate(self.bufs):
            if pers:
                base += fp(nbytes)
            elif b in first:
                delta[first[b]] += fp(nbytes)
                delta[lastu[b] + 1] -= fp(nbytes)
        live, peak = base, base
        for d in delta:
            live += d
            peak = max(peak, live)
        if outdir is None:
            return peak
        os.makedirs(outdir, exist_ok=True)
        with open(os.path.join(outdir, "meta.tsv"), "w") as f:
            f.write("#ooc-profile\tmeta\t1\nkey\tvalue\n")
            for k, v in [("format_version", 1), ("program", program), ("device", DEVICE),
                         ("device_mem_bytes", DEVICE_MEM), ("budget_bytes", BUDGET),
                         ("chunk_bytes", CHUNK), ("h2d_bps", "5e10"), ("d2h_bps", "5e10"),
                         ("bidir_bps", "9e10"), ("iterations", 1)]:
                f.write(f"{k}\t{v}\n")
        with open(os.path.join(outdir, "buffers.tsv"), "w") as f:
            f.write("#ooc-profile\tbuffers\t1\nid\tbytes\talloc_idx\tfree_idx\tpersistent\tsite"
                    "\tproducers\n")
            for b, (nbytes, pers, site) in enumerate(self.bufs):
                if pers:
                    a = fr = -1
                elif b in first:
                    a, fr = first[b], lastu[b]
                else:
                    a = fr = 0  # never used (cannot happen for a well-formed net)
                prod = str(producer[b]) if b in producer else "-"
                f.write(f"{b}\t{nbytes}\t{a}\t{fr}\t{int(pers)}\t{site}\t{prod}\n")
        with open(os.path.join(outdir, "ops.tsv"), "w") as f:
            f.write("#ooc-profile\tops\t1\nidx\tstream\tkind\tname\tshape\tduration_ns\trefs\n")
            for i, (name, kind, d, refs) in enumerate(ops):
                r = ",".join(f"{b}:{a}" for b, a in refs) or "-"
                f.write(f"{i}\t0\t{kind}\t{name}\t-\t{d}\t{r}\n")
        return peak


def input_op(net, numel, site="input"):
    x = net.act(numel, site)
    net.op("memcpy_h2d_batch", "memcpy", [], x, flops=0, bwd=False)
    return x


def resnet50(batch):
    net = Net("resnet50")
    shape = (batch, 3, 224, 224)
    x = input_op(net, math.prod(shape))
    x, shape = net.conv(x, shape, 64, 7, 2, 3, "stem.conv")
    x = net.relu(net.bn(x, shape, "stem.bn"), shape)
    x, shape = net.pool(x, shape, 3, 2)
    for si, (width, blocks) in enumerate([(64, 3), (128, 4), (256, 6), (512, 3)]):
        for bi in range(blocks):
            stride = 2 if bi == 0 and si > 0 else 1
            site = f"layer{si + 1}.{bi}"
            idn, ishape = x, shape
            y, s1 = net.conv(x, shape, width, 1, 1, 0, site + ".conv1")
            y = net.relu(net.bn(y, s1, site + ".bn1"), s1)
            y, s2 = net.conv(y, s1, width, 3, stride, 1, site + ".conv2")
            y = net.relu(net.bn(y, s2, site + ".bn2"), s2)
            y, s3 = net.conv(y, s2, width * 4, 1, 1, 0, site + ".conv3")
            y = net.bn(y, s3, site + ".bn3")
            if bi == 0:
                idn, _ = net.conv(x, ishape, width * 4, 1, stride, 0, site + ".downsample")
                idn = net.bn(idn, s3, site + ".downsample.bn")
            x = net.relu(net.add(y, idn, s3, site + ".add"), s3, site + ".relu")
            shape = s3
    x, shape = net.pool(x, shape, shape[2], 1, "avgpool")
    net.linear(x, batch, 2048, 1000, "fc")
    return net


def densenet121(batch):
    net = Net("densenet121")
    shape = (batch, 3, 224, 224)
    x = input_op(net, math.prod(shape))
    x, shape = net.conv(x, shape, 64, 7, 2, 3, "stem.conv")
    x = net.relu(net.bn(x, shape, "stem.bn"), shape)
    x, shape = net.pool(x, shape, 3, 2)
    for bi, layers in enumerate([6, 12, 24, 16]):
        feats, shapes = [x], [shape]
        for li in range(layers):
            site = f"block{bi + 1}.layer{li + 1}"
            if len(feats) > 1:
                cx, cs = net.cat(feats, shapes, site + ".cat")
            else:
                cx, cs = feats[0], shapes[0]
            y = net.relu(net.bn(cx, cs, site + ".norm1"), cs)
            y, s1 = net.conv(y, cs, 128, 1, 1, 0, site + ".conv1")
            y = net.relu(net.bn(y, s1, site + ".norm2"), s1)
            y, s2 = net.conv(y, s1, 32, 3, 1, 1, site + ".conv2")
            feats.append(y)
            shapes.append(s2)
        x, shape = net.cat(feats, shapes, f"block{bi + 1}.out")
        if bi < 3:
            site = f"transition{bi + 1}"
            y = net.relu(net.bn(x, shape, site + ".norm"), shape)
            y, s = net.conv(y, shape, shape[1] // 2, 1, 1, 0, site + ".conv")
            x, shape = net.pool(y, s, 2, 2, "avgpool", site + ".pool")
    x = net.relu(net.bn(x, shape, "norm5"), shape)
    x, shape = net.pool(x, shape, shape[2], 1, "avgpool")
    net.linear(x, batch, shape[1], 1000, "classifier")
    return net


def unet(batch, size=256):
    net = Net("unet")
    shape = (batch, 3, size, size)
    x = input_op(net, math.prod(shape))

    def double(x, shape, c, site):
        for j in (1, 2):
            x, shape = net.conv(x, shape, c, 3, 1, 1, f"{site}.conv{j}")
            x = net.relu(net.bn(x, shape, f"{site}.bn{j}"), shape)
        return x, shape

    skips = []
    for lvl, c in enumerate([64, 128, 256, 512]):
        x, shape = double(x, shape, c, f"down{lvl + 1}")
        skips.append((x, shape))
        x, shape = net.pool(x, shape, 2, 2, "maxpool", f"down{lvl + 1}.pool")
    x, shape = double(x, shape, 1024, "bottleneck")
    for lvl, c in reversed(list(enumerate([64, 128, 256, 512]))):
        n, _, h, w = shape
        up = net.act(n * c * h * 2 * w * 2, f"up{lvl + 1}.upconv.out")
        wt = net.param(shape[1] * c * 4, f"up{lvl + 1}.upconv")
        net.op("conv_transpose2d_fwd", "cudnn", [x], up, [wt], 2 * n * c * h * w * 4 * shape[1],
               heavy=True)
        ushape = (n, c, h * 2, w * 2)
        sx, sshape = skips[lvl]
        x, shape = net.cat([sx, up], [sshape, ushape], f"up{lvl + 1}.cat")
        x, shape = double(x, shape, c, f"up{lvl + 1}")
    x, shape = net.conv(x, shape, 2, 1, 1, 0, "head")
    return net


def gpt2(seq, batch=8, layers=12, d=768, heads=12, vocab=50257):
    net = Net("gpt2")
    rows = batch * seq
    tok = input_op(net, rows, "tokens")
    wte = net.param(vocab * d, "wte")
    wpe = net.param(max(1024, seq) * d, "wpe")
    x = net.act(rows * d, "embed.out")
    net.op("embedding_fwd", "kernel", [tok], x, [wte, wpe], saved=[tok])

    def ln(x, site):
        g = net.param(2 * d, site)
        save = net.buf(2 * rows * DTYPE, False, site + ".save_mean_rstd")
        y = net.act(rows * d, site + ".out")
        net.op("layernorm_fwd", "kernel", [x], y, [g], 8 * rows * d, saved=[x, save],
               extra_writes=[save])
        return y

    for li in range(layers):
        site = f"h{li}"
        h = ln(x, site + ".ln_1")
        qkv = net.linear(h, rows, d, 3 * d, site + ".attn.c_attn")
        scores = net.act(batch * heads * seq * seq, site + ".attn.scores")
        net.op("attn_scores_gemm_fwd", "cublas", [qkv], scores, [],
               2 * batch * heads * seq * seq * (d // heads), heavy=True)
        probs = net.act(batch * heads * seq * seq, site + ".attn.probs")
        net.op("softmax_fwd", "kernel", [scores], probs, saved=[probs])
        ctx = net.act(rows * d, site + ".attn.ctx")
        net.op("attn_context_gemm_fwd", "cublas", [probs, qkv], ctx, [],
               2 * batch * heads * seq * seq * (d // heads), heavy=True)
        a = net.linear(ctx, rows, d, d, site + ".attn.c_proj")
        x = net.add(x, a, (rows, d), site + ".add1")
        h = ln(x, site + ".ln_2")
        f1 = net.linear(h, rows, d, 4 * d, site + ".mlp.c_fc")
        g = net.act(rows * 4 * d, site + ".mlp.gelu")
        net.op("gelu_fwd", "kernel", [f1], g)
        f2 = net.linear(g, rows, 4 * d, d, site + ".mlp.c_proj")
        x = net.add(x, f2, (rows, d), site + ".add2")
    x = ln(x, "ln_f")
    net.linear(x, rows, d, vocab, "lm_head", weight=wte)
    return net


MODELS = [
    ("resnet50", resnet50, "batch", "images"),
    ("densenet121", densenet121, "batch", "images"),
    ("unet", unet, "batch", "images"),
    ("gpt2", gpt2, "seq", "tokens"),
]


def main():
    outdir = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "profiles", "synthetic")
    for name, fn, axis, _ in MODELS:
        # the largest power-of-two batch (sequence) that runs in core under the budget
        b = 1
        while fn(b * 2).write(None, "") <= BUDGET:
            b *= 2
        for k in (1, 2, 4, 8):
            size = b * k
            d = os.path.join(outdir, f"{name}-{axis}{size}")
            peak = fn(size).write(d, f"synthetic {name} {axis}={size}")
            print(f"{d}: in-core peak {peak / 2**30:.2f} GiB")


if __name__ == "__main__":
    main()
