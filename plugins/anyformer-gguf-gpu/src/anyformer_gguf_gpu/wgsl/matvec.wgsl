// y[t, row] (+)= sum_e W[row, e] * x[t, e], reading W's raw blocks (unit_w, from the quant_*.wgsl
// prepended, decodes 8 weights at a time).
// TPR threads share one row (striding over its 8-element units, then a reduction in workgroup
// memory; TPR = 1 needs no barrier, which suits CPU adapters), so a workgroup covers WG / TPR rows.
// Each thread applies every decoded unit to TB tokens: the weights are read once per TB tokens
// (TB = 1 for decoding, more for prefill, where this is the tiled matrix-matrix product).
// Workgroups past 65535 spill into wid.y; wid.z picks the group of TB tokens. SWIGLU (a constant)
// makes the input silu(gate) * up of a [gate | up] row (see x_at); NORM makes it RMSNorm(x) * NormW,
// each workgroup computing the norm of its tokens first (norm_scale, defined by the host: the
// NormW binding exists only in that variant), so no separate normalisation dispatch is needed.
// ROPE (a constant; the host prepends rope_epilogue, its bindings and kv_t) makes this the stacked
// q/k/v projection of a model whose rotation pairs adjacent dimensions (llama's "normal" rope): rows
// 2i and 2i+1 sit in one workgroup (RPW is even), so each q and k row is rotated against its partner
// here, and the k and v rows are stored into the KV cache at the token's position: no separate
// rope/store dispatch.

const RPW: u32 = WG / TPR;

struct Params {
    rows: u32,
    cols: u32,
    row_bytes: u32,
    units: u32,
    x_off: u32,
    x_stride: u32,
    y_off: u32,
    y_stride: u32,
    accumulate: u32,
    tokens: u32,
    eps: f32,
    pad1: u32,
    head_dim: u32,
    n_rot: u32,
    q_dim: u32,
    kv_dim: u32,
}

@group(0) @binding(0) var<storage, read> W: array<u32>;
@group(0) @binding(1) var<storage, read> X: array<f32>;
@group(0) @binding(2) var<storage, read_write> Y: array<f32>;
@group(0) @binding(3) var<uniform> P: Params;

var<workgroup> partial: array<f32, WG * TB>;
var<workgroup> inv_rms: array<f32, TB>;
// Each row's result, where the ROPE epilogue finds a row's rotation partner.
var<workgroup> rowv: array<f32, RPW * TB>;

fn x_at(xo: u32, e: u32, t: u32) -> f32 {
    // Input e of the token whose row starts at xo; zero at or past cols (float rows need not be a
    // multiple of 8 long). With SWIGLU the row is [gate | up] and the value silu(gate) * up: the
    // down projection reads the feed-forward's activation without a separate SwiGLU dispatch.
    let i = xo + min(e, P.cols - 1u);
    var v = X[i];
    if (SWIGLU) {
        v = v / (1.0 + exp(-v)) * X[i + P.cols];
    }
    return select(0.0, v * norm_scale(e, t), e < P.cols);
}

fn x_vec(xo: u32, e: u32, t: u32) -> vec4<f32> {
    return vec4<f32>(x_at(xo, e, t), x_at(xo, e + 1u, t), x_at(xo, e + 2u, t), x_at(xo, e + 3u, t));
}

@compute @workgroup_size(WG)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let row = (wid.x + wid.y * nwg.x) * RPW + lid / TPR;
    let lane = lid % TPR;
    let t0 = wid.z * TB;
    if (NORM) {
        // 1 / RMS of each of this workgroup's tokens, every thread of the workgroup summing a stripe.
        for (var t = 0u; t < TB; t++) {
            var sq = 0.0;
            if (t0 + t < P.tokens) {
                let xo = P.x_off + (t0 + t) * P.x_stride;
                for (var e = lid; e < P.cols; e += WG) {
                    sq += X[xo + e] * X[xo + e];
                }
            }
            partial[lid * TB + t] = sq;
        }
        workgroupBarrier();
        for (var s = WG / 2u; s > 0u; s >>= 1u) {
            if (lid < s) {
                for (var t = 0u; t < TB; t++) {
                    partial[lid * TB + t] += partial[(lid + s) * TB + t];
                }
            }
            workgroupBarrier();
        }
        if (lid == 0u) {
            for (var t = 0u; t < TB; t++) {
                inv_rms[t] = inverseSqrt(partial[t] / f32(P.cols) + P.eps);
            }
        }
        workgroupBarrier();
    }
    var acc: array<f32, TB>;
    if (row < P.rows) {
        let rb = row * P.row_bytes;
        for (var u = lane; u < P.units; u += TPR) {
            let e0 = u * 8u;
            let w = unit_w(rb, e0, P.cols);
            for (var t = 0u; t < TB; t++) {
                if (t0 + t < P.tokens) {
                    let xo = P.x_off + (t0 + t) * P.x_stride;
                    acc[t] += dot(w[0], x_vec(xo, e0, t)) + dot(w[1], x_vec(xo, e0 + 4u, t));
                }
            }
        }
    }
    if (TPR > 1u) {
        for (var t = 0u; t < TB; t++) {
            partial[lid * TB + t] = acc[t];
        }
        workgroupBarrier();
        for (var s = TPR / 2u; s > 0u; s >>= 1u) {
            if (lane < s) {
                for (var t = 0u; t < TB; t++) {
                    partial[lid * TB + t] += partial[(lid + s) * TB + t];
                }
            }
            workgroupBarrier();
        }
        for (var t = 0u; t < TB; t++) {
            acc[t] = partial[lid * TB + t];
        }
    }
    if (ROPE) {
        if (lane == 0u) {
            for (var t = 0u; t < TB; t++) {
                rowv[(lid / TPR) * TB + t] = acc[t];
            }
        }
        workgroupBarrier();
    }
    if (lane == 0u && row < P.rows) {
        for (var t = 0u; t < TB; t++) {
            if (t0 + t < P.tokens) {
                let yi = P.y_off + (t0 + t) * P.y_stride + row;
                var out = acc[t];
                if (ROPE) {
                    out = rope_epilogue(row, lid / TPR, t, t0 + t, out);
                } else if (P.accumulate != 0u) {
                    out += Y[yi];
                }
                Y[yi] = out;
            }
        }
    }
}
